"""Uplink compression as a client stage (``communication.uplink``), and the downlink's encoding of
the model (:func:`encode_model`). Each client encodes its update,
the server receives what the encoding carries (computed here as its decoded value, the bits it
takes counted exactly by :func:`raysim.communication.config.upload_bits`). With error feedback
(``ef``) the client adds what earlier encodings left out to its update first and keeps the new
remainder as its own state (``ef_residual``); with EF21 it encodes the difference between its
update and its last decoded one g, which both ends hold (``ef21_estimate``), and the server
decodes g + C(v − g). Either state is stored only for clients that have been sampled."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from raysim.algorithms import ClientContext, ClientUpdates
from raysim.communication.config import kept, upload_bits
from raysim.pipeline.client import ClientStage

KEPT = {"ef": "ef_residual", "ef21": "ef21_estimate"}


def qsgd(vector: torch.Tensor, levels: int, rng: np.random.Generator) -> torch.Tensor:
    """QSGD of one vector: ‖v‖·sign(v)·ξ/s, ξ = ⌊s|v|/‖v‖⌋ or one level more with probability the
    remainder (so E[ξ] = s|v|/‖v‖: unbiased); ‖v‖ as float32 sends it."""
    norm = float(np.float32(vector.double().norm()))
    if norm == 0:
        return torch.zeros_like(vector)
    scaled = levels * vector.double().abs() / norm
    low = scaled.floor()
    up = torch.from_numpy(rng.random(vector.numel())).reshape(vector.shape) < scaled - low
    return (norm * vector.double().sign() * (low + up) / levels).to(vector.dtype)


def top_k(vector: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` entries of largest magnitude of each row (ties: the lower index), the rest zero; in
    linear time: above the k-th largest magnitude, and of the entries equal to it the first ones."""
    size = vector.abs()
    threshold = size.kthvalue(size.shape[-1] - k + 1, dim=-1, keepdim=True).values
    above, tie = size > threshold, size == threshold
    missing = k - above.sum(-1, keepdim=True)
    keep = above | (tie & (tie.cumsum(-1) <= missing))
    return torch.where(keep, vector, torch.zeros_like(vector))


def rand_k(vector: torch.Tensor, k: int, rng: np.random.Generator) -> torch.Tensor:
    """``k`` entries drawn uniformly without replacement, scaled by P/k (unbiased), the rest zero."""
    chosen = torch.from_numpy(rng.choice(vector.numel(), size=k, replace=False))
    out = torch.zeros_like(vector)
    out[chosen] = (vector[chosen].double() * (vector.numel() / k)).to(vector.dtype)
    return out


def scaled_sign(vector: torch.Tensor) -> torch.Tensor:
    """‖v‖₁/P · sign(v) of each row, the scale as float32 sends it."""
    scale = vector.double().abs().mean(-1, keepdim=True).float().double()
    return (scale * vector.double().sign()).to(vector.dtype)


def encode(uplink, vectors: torch.Tensor, rngs: list) -> torch.Tensor:
    """What the server decodes from ``uplink``'s encoding of each row of ``vectors`` [C, P] (one
    update a client, ``rngs`` its stream)."""
    kind, values = uplink.kind, vectors.shape[-1]
    if kind in ("fp16", "bf16"):
        return vectors.to(torch.float16 if kind == "fp16" else torch.bfloat16).to(vectors.dtype)
    if kind == "topk":
        return top_k(vectors, kept(uplink, values))
    if kind == "sign":
        return scaled_sign(vectors)
    if kind == "qsgd":
        return torch.stack([qsgd(row, uplink.levels, rng) for row, rng in zip(vectors, rngs)])
    return torch.stack([rand_k(row, kept(uplink, values), rng) for row, rng in zip(vectors, rngs)])


def encode_model(kind: str, params: torch.Tensor) -> torch.Tensor:
    """The model's parameters as clients decode them from the downlink's encoding ``kind``
    (``communication.downlink.kind``: none, fp16 or bf16)."""
    if kind == "none":
        return params
    return params.to(torch.float16 if kind == "fp16" else torch.bfloat16).to(params.dtype)


class UplinkCompression(ClientStage):
    """Each client's update encoded by ``uplink`` (a communication.uplink section), with its error
    feedback (see the module docstring); the stochastic encodings draw from the client's task stream."""

    name = "uplink_compression"

    def __init__(self, uplink):
        self.uplink = uplink
        self.kept = KEPT.get(uplink.error_feedback)
        self.keeps = (self.kept,) if self.kept else ()

    def update(self, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
        vector, feedback = updates.vector, self.uplink.error_feedback
        if feedback == "none":
            return replace(updates, vector=encode(self.uplink, vector, ctx.rngs))
        held = ctx.kept(self.kept, torch.zeros_like(vector)).to(vector.dtype)
        if feedback == "ef":
            vector = vector + held
            sent = encode(self.uplink, vector, ctx.rngs)
            return replace(updates, vector=sent, states={**updates.states, self.kept: vector - sent})
        decoded = held + encode(self.uplink, vector - held, ctx.rngs)  # ef21
        return replace(updates, vector=decoded, states={**updates.states, self.kept: decoded})

    def upload_bytes(self, nbytes: int, values: int) -> int:
        return math.ceil(upload_bits(self.uplink, values, 8 * nbytes // max(values, 1)) / 8)
