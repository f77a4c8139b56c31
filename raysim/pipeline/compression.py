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
from raysim.communication.config import kept, qsgd_elias_bits, upload_bits
from raysim.pipeline.client import ENCODED_BYTES, ClientStage

KEPT = {"ef": "ef_residual", "ef21": "ef21_estimate"}


def qsgd_levels(vector: torch.Tensor, levels: int, rng: np.random.Generator) -> tuple[float, torch.Tensor]:
    """What QSGD sends of one vector: ‖v‖ (as float32 holds it) and the signed levels sign(v)·ξ,
    ξ = ⌊s|v|/‖v‖⌋ or one level more with probability the remainder (so E[ξ] = s|v|/‖v‖)."""
    norm = float(np.float32(vector.double().norm()))
    if norm == 0:
        return norm, torch.zeros_like(vector, dtype=torch.float64)
    scaled = levels * vector.double().abs() / norm
    low = scaled.floor()
    up = torch.from_numpy(rng.random(vector.numel())).reshape(vector.shape) < scaled - low
    return norm, vector.double().sign() * (low + up)


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


def encode(uplink, vectors: torch.Tensor, rngs: list) -> tuple[torch.Tensor, np.ndarray | None]:
    """(what the server decodes from ``uplink``'s encoding of each row of ``vectors`` [C, P] (one
    update a client, ``rngs`` its stream), each row's bytes if its size depends on the row: QSGD
    with Elias coding; else None, the size being :func:`upload_bits`)."""
    if uplink.kind == "qsgd":
        sent = [qsgd_levels(row, uplink.levels, rng) for row, rng in zip(vectors, rngs)]
        decoded = torch.stack([(norm * signed / uplink.levels).to(vectors.dtype) for norm, signed in sent])
        if uplink.coding != "elias":
            return decoded, None
        return decoded, np.array([math.ceil(qsgd_elias_bits(signed.numpy()) / 8) for _, signed in sent])
    return _encode_fixed(uplink, vectors, rngs), None


def _encode_fixed(uplink, vectors: torch.Tensor, rngs: list) -> torch.Tensor:
    kind, values = uplink.kind, vectors.shape[-1]
    if kind in ("fp16", "bf16"):
        return vectors.to(torch.float16 if kind == "fp16" else torch.bfloat16).to(vectors.dtype)
    if kind == "topk":
        return top_k(vectors, kept(uplink, values))
    if kind == "sign":
        return scaled_sign(vectors)
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
        self.sizes_by_content = uplink.kind == "qsgd" and uplink.coding == "elias"
        self.kept = KEPT.get(uplink.error_feedback)
        self.keeps = (self.kept,) if self.kept else ()

    def update(self, updates: ClientUpdates, ctx: ClientContext, payloads: list) -> ClientUpdates:
        vector, feedback, states = updates.vector, self.uplink.error_feedback, updates.states
        held = ctx.kept(self.kept, torch.zeros_like(vector)).to(vector.dtype) if self.kept else None
        if feedback == "none":
            decoded, sizes = encode(self.uplink, vector, ctx.rngs)
        elif feedback == "ef":
            vector = vector + held
            decoded, sizes = encode(self.uplink, vector, ctx.rngs)
            states = {**states, self.kept: vector - decoded}
        else:  # ef21
            change, sizes = encode(self.uplink, vector - held, ctx.rngs)
            decoded = held + change
            states = {**states, self.kept: decoded}
        diagnostics = updates.diagnostics
        if sizes is not None:
            diagnostics = {**diagnostics, ENCODED_BYTES: torch.from_numpy(sizes).double()}
        return replace(updates, vector=decoded, states=states, diagnostics=diagnostics)

    def upload_bytes(self, nbytes: int, values: int) -> int:
        return math.ceil(upload_bits(self.uplink, values, 8 * nbytes // max(values, 1)) / 8)
