"""The virtual-time system model: device speeds, networks, availability, dropout, unreliable agents,
Byzantine clients.

Every client task gets a virtual duration from :class:`SystemModel` (never from
host speed) and only available clients are sampled; everything is a pure
function of (seed, client id, task counter). ``SystemConfig`` is the ``system:``
section of a scenario; ``DISTRIBUTIONS`` describes every ``kind`` per section.
"""

from __future__ import annotations

import importlib

_EXPORTS = {**dict.fromkeys(["DISTRIBUTIONS", "AvailabilityConfig", "ByzantineConfig", "ComputeConfig",
                             "DistributionConfig", "NetworkConfig", "SystemConfig", "Tier", "UnreliableConfig"],
                            "config"),
            **dict.fromkeys(["PROFILE_STREAMS", "SystemModel", "TaskTiming"], "model"), "validate_system": "validate"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:  # the model and the checks load pyarrow (trace files): only when used
        return getattr(importlib.import_module(f"raysim.system.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'raysim.system' has no attribute {name!r}")
