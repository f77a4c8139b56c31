"""The ``communication:`` section of a scenario: how a client encodes its update for upload, and the
exact size of that encoding. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raysim.schema import Check, key, one_of, positive_int, when

OPERATORS = {
    "none": "the update as it is (float32)",
    "fp16": "each entry cast to IEEE half precision: 16 bits an entry",
    "bf16": "each entry cast to bfloat16: 16 bits an entry",
    "qsgd": "QSGD (Alistarh et al., 2017): ‖v‖ in float32, then per entry its sign and a level in {0, …, s} "
            "drawn so that the result is unbiased: 32 + P·(1 + ⌈log₂(s + 1)⌉) bits",
    "topk": "the k entries of largest magnitude, k = max(1, round(fraction·P)): k float32 values and their "
            "indices (k·⌈log₂ P⌉ bits, or a P-bit bitmap if smaller)",
    "randk": "k entries drawn uniformly without replacement, scaled by P/k (unbiased): sized as topk",
    "sign": "scaled sign (signSGD, Bernstein et al., 2018): ‖v‖₁/P in float32 and one sign bit an entry",
}
UPLINK = "communication.uplink.kind"


@dataclass
class UplinkConfig:
    """How a client encodes its update before upload."""

    kind: str = key("none", "none | fp16 | bf16 | qsgd | topk | randk | sign (raysim list: uplink operators)",
                    check=one_of(*OPERATORS))
    levels: int = key(4, "qsgd: s, the quantization levels of each sign", check=positive_int, when=when(UPLINK, "qsgd"))
    fraction: float = key(0.01, "topk, randk: the share of the update's entries sent (k = max(1, round(fraction·P)))",
                          check=Check(lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "a number in (0, 1]"),
                          when=when(UPLINK, "topk", "randk"))
    error_feedback: bool = key(False, "keep what the encoding left out of each client's update and add it to that "
                                      "client's next one (Karimireddy, Rebjock, Stich, Jaggi, 2019); per-client state",
                               when=when(UPLINK, "none", negate=True))


@dataclass
class CommunicationConfig:
    """What clients send over the network, and how."""

    uplink: UplinkConfig = key(doc="the encoding of each client's update", factory=UplinkConfig)


def kept(uplink, values: int) -> int:
    """k of topk and randk for an update of ``values`` entries."""
    return max(1, min(values, round(uplink.fraction * values)))


def upload_bits(uplink, values: int, value_bits: int = 32) -> int:
    """The exact bits of one encoded update of ``values`` entries (``value_bits`` each unencoded)."""
    kind = uplink.kind
    if kind == "none":
        return value_bits * values
    if kind in ("fp16", "bf16"):
        return 16 * values
    if kind == "qsgd":
        return 32 + values * (1 + math.ceil(math.log2(uplink.levels + 1)))
    if kind in ("topk", "randk"):
        k = kept(uplink, values)
        return 32 * k + min(k * max(1, math.ceil(math.log2(values))), values)
    return 32 + values  # sign
