"""Differential privacy: the ``privacy:`` section (:mod:`.config`) and the accounting of what a run
spends (:mod:`.accounting`, with dp-accounting). The mechanisms themselves are stages of the update
pipeline (:mod:`raysim.pipeline.privacy`)."""
