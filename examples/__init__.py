"""Code a user would write outside the raysim package: a custom algorithm and model
(see docs/custom_algorithm.md)."""
