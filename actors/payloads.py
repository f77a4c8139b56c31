"""How model payloads travel with a call to a ClientActor.

A payload is either in the object store (a reference, :meth:`ClientActorGroup.broadcast` puts large
ones there) or travels inline, as numpy arrays. Ray serializes every array of a call's
arguments on its own, at a cost of about 15 µs each on both sides, and an asynchronous call
carries up to one model version per client: so the inline payloads of a call are stacked,
one array per key for all the versions that share a structure (keys, shapes and dtypes).
"""

from __future__ import annotations

import numpy as np
import ray


def pack(handles: dict) -> tuple:
    """``(refs, groups)`` for ``handles`` ({version: object-store reference, or inline payload}):
    ``refs`` {version: reference}, and ``groups`` [(versions, {key: array [V, ...]})], the inline
    payloads stacked by structure."""
    refs, groups = {}, {}
    for version, handle in handles.items():
        if isinstance(handle, ray.ObjectRef):
            refs[version] = handle
        else:
            structure = tuple((key, array.shape, array.dtype.str) for key, array in handle.items())
            groups.setdefault(structure, []).append((version, handle))
    return refs, [(tuple(version for version, _ in members),
                   {key: np.stack([payload[key] for _, payload in members]) for key in members[0][1]})
                  for members in groups.values()]


def unpack(refs: dict, groups: list) -> dict:
    """{version: payload, its tensors torch tensors of their own} from :func:`pack`'s output."""
    import torch

    payloads = dict(zip(refs, ray.get(list(refs.values())))) if refs else {}
    for versions, stacked in groups:
        # a copy of its own per version (Ray's arrays are read-only), a 0-d one (a scalar) too
        for row, version in enumerate(versions):
            payloads[version] = {key: torch.from_numpy(np.array(array[row])) for key, array in stacked.items()}
    return payloads
