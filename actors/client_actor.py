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
    through ``.options``. Started, it loads torch and raysim's engine only; :meth:`load` then gives
    it a run (its scenario, and the data set as an object-store reference resolved zero-copy), so
    one actor can serve run after run (:class:`actors.runtime.WarmActors`). Between calls it holds
    nothing but that run's ClientHost, so that one that died can be replaced by a new one, loaded
    alike, and its calls sent again (see :class:`actors.runtime.ClientActorGroup`).
    """

    def __init__(self, actor_index: int):
        with long_lived():  # torch loads here, not when Ray imports this module
            import torch

            from raysim.engine.host import ClientHost

        self.make_host = ClientHost
        self.actor_index = actor_index
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.device = "cuda" if self.gpu_ids and torch.cuda.is_available() else "cpu"
        self.host = None

    def load(self, scenario, table) -> None:
        """Host the run of ``scenario`` over ``table``: a new ClientHost; the previous run's is
        dropped first (its background work finished), so nothing of it reaches this one."""
        if self.host is not None:
            self.host.settle()
            self.host = None
        self.host = self.make_host(scenario, table, self.actor_index, self.device)

    def run(self, payloads: tuple, tasks: list, prepare: tuple = ()) -> list:
        """Run tasks against the payloads of their model versions (:func:`actors.payloads.pack`),
        then build the rows of the clients in ``prepare`` in the background (see
        :meth:`ClientHost.run`)."""
        return self._host().run(unpack(*payloads), tasks, prepare)

    def info(self) -> dict:
        """Actor index, device, node, assigned GPU ids and process id."""
        ctx = ray.get_runtime_context()
        return dict(self._host().info(), node=ctx.get_node_id(), gpu_ids=self.gpu_ids, pid=os.getpid(),
                    cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))

    def _host(self):
        if self.host is None:
            raise RuntimeError(f"ClientActor {self.actor_index} holds no run (its load failed or was never sent)")
        return self.host
