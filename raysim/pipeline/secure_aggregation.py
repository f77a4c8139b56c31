"""Secure aggregation's numeric effect (``communication.secure_aggregation``): each client clips
its update's entries to ±range and rounds them stochastically to integers of ``value_bits`` bits
(:class:`SecureQuantize`, a client stage: what it would mask); the server learns only their sum
modulo 2^bits (:class:`SecureSum`, an update stage), which it decodes. The masks themselves cancel
in the sum and are not drawn; what they cost is in :mod:`raysim.communication.secure_aggregation`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from raysim.algorithms import ClientContext, ClientUpdates
from raysim.communication.config import EVENT_COLUMNS
from raysim.pipeline.client import ClientStage
from raysim.pipeline.stage import ServerInput, Stage


class SecureQuantize(ClientStage):
    """Each entry of a client's update clipped to ±``range`` and scaled by S = Q / range (Q =
    2^(value_bits − 1) − 1), then rounded down or up to an integer with the probabilities that make
    it unbiased, from the client's task stream; logs the share of entries clipped
    (``secagg_clipped``). The update uploads as the masked field elements (``protocol``'s bytes)."""

    name = "secure_quantize"
    diagnostics = EVENT_COLUMNS

    def __init__(self, protocol):
        self.protocol = protocol
        self.range = protocol.cfg.range
        self.scale = protocol.largest_value / self.range

    def update(self, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
        vector = updates.vector.double()
        clipped = (vector.abs() > self.range).double().mean(1)
        scaled = vector.clamp(-self.range, self.range) * self.scale
        low = scaled.floor()
        coins = torch.from_numpy(np.stack([rng.random(vector.shape[1]) for rng in ctx.rngs]))
        return replace(updates, vector=low + (coins < scaled - low),
                       diagnostics={**updates.diagnostics, "secagg_clipped": clipped})

    def upload_bytes(self, nbytes: int, values: int) -> int:
        return self.protocol.upload_bytes(values)


def modular_sum(integers: torch.Tensor, bits: int) -> torch.Tensor:
    """The sum of the rows of ``integers`` (int64, each entry a signed value that fits the field)
    modulo 2^``bits``, as the representative in [−2^(bits−1), 2^(bits−1))."""
    modulus = 2 ** bits
    rows = max(1, 2 ** (63 - bits) - 1)  # field elements < 2^bits: this many add up without overflow
    total = torch.zeros(integers.shape[1], dtype=torch.int64)
    for start in range(0, len(integers), rows):
        total = (total + integers[start:start + rows].remainder(modulus).sum(0)).remainder(modulus)
    return torch.where(total >= modulus // 2, total - modulus, total)


class SecureSum(Stage):
    """The server's side: the step's quantized updates summed modulo 2^bits (:func:`modular_sum`),
    decoded (÷ S) and divided by the number of survivors. Every row of the step becomes that mean,
    all the server can know of any one client, so the aggregation rule gives the plain (unweighted)
    mean whatever its weights, and central DP's noise is added to the decoded sum. Stateless."""

    name = "secure_sum"

    def __init__(self, protocol):
        self.bits = protocol.cfg.bits
        self.scale = protocol.largest_value / protocol.cfg.range

    def update(self, step: ServerInput, state: dict) -> tuple[ServerInput, dict]:
        integers = step.updates.vector.to(torch.int64)
        count = len(integers)
        mean = modular_sum(integers, self.bits).double() / (self.scale * count)
        return replace(step, updates=replace(step.updates, vector=mean.expand(count, -1))), state
