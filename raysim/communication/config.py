"""The ``communication:`` section of a scenario: how a client encodes its update for upload and how
the server encodes the model it broadcasts, the exact size of each encoding, and secure
aggregation's parameters. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from raysim.schema import Check, key, non_negative, one_of, positive, positive_int, when

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
FEEDBACK = ("none", "ef", "ef21")
UPLINK = "communication.uplink.kind"


@dataclass
class UplinkConfig:
    """How a client encodes its update before upload."""

    kind: str = key("none", "none | fp16 | bf16 | qsgd | topk | randk | sign (raysim list: uplink operators)",
                    check=one_of(*OPERATORS))
    levels: int = key(4, "qsgd: s, the quantization levels of each sign", check=positive_int, when=when(UPLINK, "qsgd"))
    coding: str = key("fixed", "qsgd: fixed (each level in ⌈log₂(s + 1)⌉ bits) | elias (as Alistarh et al.: Elias "
                               "recursive codes of the gaps between nonzero levels and of the levels; its size "
                               "depends on the update; sync mode)", check=one_of("fixed", "elias"),
                      when=when(UPLINK, "qsgd"))
    fraction: float = key(0.01, "topk, randk: the share of the update's entries sent (k = max(1, round(fraction·P)))",
                          check=Check(lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "a number in (0, 1]"),
                          when=when(UPLINK, "topk", "randk"))
    error_feedback: str = key("none", "none | ef: keep what the encoding left out of each client's update and add it "
                                      "to that client's next one (Karimireddy, Rebjock, Stich, Jaggi, 2019) | ef21: "
                                      "send the encoded difference from the client's last decoded update (Richtárik, "
                                      "Sokolov, Fatkhullin, 2021); per-client state",
                              check=one_of(*FEEDBACK), when=when(UPLINK, "none", negate=True))


DOWNLINK = {"none": "the model as it is", "fp16": "each entry of the model rounded to IEEE half precision: 16 bits",
            "bf16": "each entry of the model rounded to bfloat16: 16 bits"}
PROTOCOLS = {"none": "updates reach the server one by one",
             "secagg": "secure aggregation (Bonawitz et al., 2017): every client masks with every other one of its round",
             "secagg_plus": "SecAgg+ (Bell et al., 2020): each client masks with a few neighbours of a random graph"}
SECAGG = "communication.secure_aggregation.protocol"
EVENT_COLUMNS = ("secagg_clipped",)  # what secure aggregation's client stage logs per update


@dataclass
class DownlinkConfig:
    """How the server encodes the model it broadcasts."""

    kind: str = key("none", "none | fp16 | bf16: the model's entries as clients receive them (raysim list: downlink "
                            "operators)", check=one_of(*DOWNLINK))


bits_field = Check(lambda v: isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 62, "an integer in [2, 62]")


@dataclass
class SecureAggregationConfig:
    """Secure aggregation, simulated: its numeric effect exactly, its cryptography as cost."""

    protocol: str = key("none", "none | secagg | secagg_plus (raysim list: secure aggregation protocols)",
                        check=one_of(*PROTOCOLS))
    bits: int = key(32, "b: the field Z_(2^b) the masked sum lives in; each entry uploads b bits", check=bits_field,
                    when=when(SECAGG, "none", negate=True))
    value_bits: int = key(16, "each client's entry as a signed integer of this many bits: clipped to ±range and "
                              "rounded stochastically to a multiple of range / (2^(value_bits−1) − 1)",
                          check=bits_field, when=when(SECAGG, "none", negate=True))
    range: float = key(1.0, "the largest magnitude of an entry a client sends (larger ones are clipped to it)",
                       check=positive, when=when(SECAGG, "none", negate=True))
    threshold: Optional[int] = key(None, "t: the fewest survivors whose masks can be removed; a round with fewer "
                                         "fails (null: a majority of the clients sampled)",
                                   check=positive_int, when=when(SECAGG, "none", negate=True))
    neighbors: Optional[int] = key(None, "secagg_plus: the clients each one shares masks with (null: ⌈2·log₂ m⌉ for "
                                         "m clients a round, at most m − 1)",
                                   check=positive_int, when=when(SECAGG, "secagg_plus"))
    unmask_seconds_per_entry: float = key(2e-9, "server time to expand one entry of a mask (a PRG output) when "
                                                "removing masks", check=non_negative,
                                          when=when(SECAGG, "none", negate=True))


@dataclass
class CommunicationConfig:
    """What clients and server send over the network, and how."""

    uplink: UplinkConfig = key(doc="the encoding of each client's update", factory=UplinkConfig)
    downlink: DownlinkConfig = key(doc="the encoding of the model the server broadcasts", factory=DownlinkConfig)
    secure_aggregation: SecureAggregationConfig = key(doc="secure aggregation of the clients' updates",
                                                      factory=SecureAggregationConfig)


def kept(uplink, values: int) -> int:
    """k of topk and randk for an update of ``values`` entries."""
    return max(1, min(values, round(uplink.fraction * values)))


def download_bits(kind: str, values: int, value_bits: int = 32) -> int:
    """The exact bits of the model's ``values`` entries (``value_bits`` each unencoded) as the downlink
    encoding ``kind`` broadcasts them."""
    return value_bits * values if kind == "none" else 16 * values


def elias_omega_bits(n: np.ndarray) -> np.ndarray:
    """The length in bits of Elias's recursive (omega) code of each positive integer of ``n``: 1 for
    the final 0, plus the binary of n, of ⌊log₂ n⌋, … down to 2."""
    n = np.asarray(n, dtype=np.int64)
    bits = np.ones_like(n)
    while (n > 1).any():
        longer = n > 1
        width = np.floor(np.log2(np.maximum(n, 1))).astype(np.int64) + 1  # binary digits of n
        bits += np.where(longer, width, 0)
        n = np.where(longer, width - 1, n)
    return bits


def qsgd_elias_bits(levels: np.ndarray) -> int:
    """The bits of QSGD's Elias coding (Alistarh et al., 2017, §3.2) of one update whose signed levels
    are ``levels``: the norm in 32 bits, then for each nonzero level in order the code of its distance
    from the previous one (the first: its position, from 1), its sign bit and the code of its size."""
    at = np.flatnonzero(levels)
    if not len(at):
        return 32
    gaps = np.diff(at, prepend=-1)
    return int(32 + elias_omega_bits(gaps).sum() + len(at) + elias_omega_bits(np.abs(levels[at])).sum())


def upload_bits(uplink, values: int, value_bits: int = 32) -> int:
    """The exact bits of one encoded update of ``values`` entries (``value_bits`` each unencoded); for
    QSGD with Elias coding, whose size depends on the update, the fixed-width size (an upload that
    fails is timed with it)."""
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
