"""Secure aggregation's protocol as a cost (``communication.secure_aggregation``): the bytes and
round trips each client adds to its task, the survivors a round needs, the server's time to remove
the masks, and when the field is too small for the sum. The numbers follow the semi-honest
protocol of Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning" (2017), and its sparse-graph variant SecAgg+ (Bell, Bonawitz, Gascón, Lepoint, Raykova,
"Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", 2020). Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass

KEY_BYTES = 32  # one X25519 public key (each client advertises two: for encryption and for masks)
SHARE_BYTES = 100  # one encrypted pair of Shamir shares: 2 × 32-byte secrets, 2 × 4-byte ids, AES-GCM nonce and tag
ID_BYTES = 4  # a client's id in the list of survivors
EXTRA_ROUND_TRIPS = 3  # advertise keys, share keys, unmask; the masked input rides on the update's upload


@dataclass(frozen=True)
class SecureAggregation:
    """The protocol of a ``communication.secure_aggregation`` section for rounds that sample
    ``round_size`` clients and keep at most ``keep`` of them."""

    cfg: object
    round_size: int
    keep: int

    @property
    def neighbors(self) -> int:
        """The clients each client shares masks with: all others of its round (secagg), or a few
        (secagg_plus: ``neighbors``, or ⌈2·log₂ m⌉)."""
        others = max(self.round_size - 1, 0)
        if self.cfg.protocol == "secagg":
            return others
        chosen = self.cfg.neighbors or math.ceil(2 * math.log2(max(self.round_size, 2)))
        return min(others, chosen)

    @property
    def threshold(self) -> int:
        """t: the fewest survivors for which the server can remove the masks (``threshold``, or a
        majority of the round's sampled clients, at most the clients it keeps)."""
        return self.cfg.threshold or min(self.keep, self.round_size // 2 + 1)

    def upload_bytes(self, values: int) -> int:
        """What a client uploads for an update of ``values`` entries: its two public keys, a share
        pair for each neighbour, the masked input (``bits`` an entry) and one share a neighbour to unmask."""
        masked = math.ceil(self.cfg.bits * values / 8)
        return 2 * KEY_BYTES + self.neighbors * (SHARE_BYTES + KEY_BYTES) + masked

    def download_bytes(self) -> int:
        """What a client receives besides the model: its neighbours' keys, the shares they sent it,
        and the list of survivors."""
        return self.neighbors * (2 * KEY_BYTES + SHARE_BYTES + ID_BYTES)

    def server_seconds(self, survivors: int, dropped: int, values: int) -> float:
        """The server's time to remove the masks from a sum of ``values`` entries: each survivor's
        own mask expanded again, and each dropped client's pairwise masks with its surviving
        neighbours (at most ``neighbors`` of them)."""
        expansions = survivors + dropped * min(self.neighbors, survivors)
        return self.cfg.unmask_seconds_per_entry * values * expansions

    def needed_bits(self, clients: int) -> int:
        """The field bits in which the sum of ``clients`` entries of ``value_bits`` bits never wraps."""
        return (clients * self.largest_value).bit_length() + 1

    @property
    def largest_value(self) -> int:
        """Q = 2^(value_bits − 1) − 1: the largest magnitude of a client's quantized entry."""
        return 2 ** (self.cfg.value_bits - 1) - 1

    def wrap_warning(self) -> str | None:
        """A warning line when the sum of ``keep`` clients' entries can leave the field, with the
        probability that it does for an entry spread uniformly over ±range (None: it cannot)."""
        clients, bits = self.keep, self.cfg.bits
        needed = self.needed_bits(clients)
        if needed <= bits:
            return None
        half = 2 ** (bits - 1)  # the decoded sum lies in [−half, half)
        spread = self.largest_value * math.sqrt(clients / 3)  # the sum's std for entries uniform over ±Q
        chance = math.erfc(half / (spread * math.sqrt(2)))
        return (f"warning: communication.secure_aggregation.bits = {bits} is too few for {clients} clients of "
                f"{self.cfg.value_bits}-bit values: their sum needs {needed} bits, so it wraps around modulo 2^{bits} "
                f"— for entries spread uniformly over ±range with probability ≈ {chance:.2g} per entry and round, "
                f"surely when they sit near ±range; raise bits to {needed} or lower value_bits")


def protocol_of(cfg) -> SecureAggregation | None:
    """Scenario ``cfg``'s secure aggregation (None: without), for its planned rounds: the clients
    sampled a round (with over-selection; the expected number under Poisson sampling) and kept."""
    secure, ex = cfg.communication.secure_aggregation, cfg.execution
    if secure.protocol == "none":
        return None
    sampled = ex.clients_per_round if ex.sampling == "poisson" else math.ceil(ex.over_selection * ex.clients_per_round)
    return SecureAggregation(secure, sampled, ex.clients_per_round)
