"""raysim: a federated-learning simulator at scale on Ray and PyTorch.

``raysim.run(scenario, overrides)`` runs a scenario and returns its results;
``raysim.resume(run_dir)`` continues a stopped run from its checkpoint;
``raysim.load_model(run_dir)`` loads the model a run saved (see :mod:`raysim.api`).
Importing raysim loads neither torch nor Ray.
"""

__version__ = "0.1.0"
__all__ = ["load_model", "resume", "run"]


def __getattr__(name: str):
    if name in __all__:
        from raysim import api

        return getattr(api, name)
    raise AttributeError(f"module 'raysim' has no attribute {name!r}")
