"""Discrete-event core: client host, runtime protocol and in-process runtime, dispatch, drivers."""
