"""ClientActor: a Ray actor hosting many virtual clients, pinned to its CPU and (fractional) GPU share."""

from __future__ import annotations

import os

import ray

from actors.payloads import unpack
from raysim.long_lived import long_lived


@ray.remote
class ClientActor:
    """Runs batches of client tasks. Uses CUDA when Ray assigned it a GPU and CUDA exists, else CPU.

    Declared with ``num_cpus=runtime.cpus_per_actor`` and ``num_gpus=runtime.gpus_per_actor``
    through ``.options``; the data set arrives once, as an object-store reference
    resolved zero-copy. Holds no state between calls, so that one that died can be replaced by
    a new one and its calls sent again (see :class:`actors.runtime.ClientActorGroup`).
    """

    def __init__(self, scenario, table, actor_index: int):
        with long_lived():  # torch loads here, not when Ray imports this module
            import torch

            from raysim.engine.host import ClientHost

            self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
            device = "cuda" if self.gpu_ids and torch.cuda.is_available() else "cpu"
            self.host = ClientHost(scenario, table, actor_index, device)

    def run(self, payloads: tuple, tasks: list, prepare: tuple = ()) -> list:
        """Run tasks against the payloads of their model versions (:func:`actors.payloads.pack`),
        then build the rows of the clients in ``prepare`` in the background (see
        :meth:`ClientHost.run`)."""
        return self.host.run(unpack(*payloads), tasks, prepare)

    def info(self) -> dict:
        """Actor index, device, node, assigned GPU ids and process id."""
        ctx = ray.get_runtime_context()
        return dict(self.host.info(), node=ctx.get_node_id(), gpu_ids=self.gpu_ids, pid=os.getpid(),
                    cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
