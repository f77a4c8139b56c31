"""The virtual-time system model: device speeds, networks, availability, dropout, unreliable agents,
Byzantine clients.

Every client task gets a virtual duration from :class:`SystemModel` (never from
host speed) and only available clients are sampled; everything is a pure
function of (seed, client id, task counter). ``SystemConfig`` is the ``system:``
section of a scenario; ``DISTRIBUTIONS`` describes every ``kind`` per section.
"""

from raysim.system.config import (DISTRIBUTIONS, AvailabilityConfig, ByzantineConfig, ComputeConfig, DistributionConfig,
                                  NetworkConfig, SystemConfig, Tier, UnreliableConfig)
from raysim.system.model import PROFILE_STREAMS, SystemModel, TaskTiming
from raysim.system.validate import validate_system

__all__ = ["DISTRIBUTIONS", "PROFILE_STREAMS", "AvailabilityConfig", "ByzantineConfig", "ComputeConfig", "DistributionConfig",
           "NetworkConfig", "SystemConfig", "SystemModel", "TaskTiming", "Tier", "UnreliableConfig", "validate_system"]
