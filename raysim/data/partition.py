"""Partitioners that split a centralized labelled dataset over federated clients.

Every partitioner returns ``(train_indices, test_indices)``: two lists with one int64
array per client, indexing the centralized arrays.
"""

from __future__ import annotations

import numbers

import numpy as np

from raysim.data._checks import check_count, check_num_clients, check_test_fraction
from raysim.errors import ScenarioError
from raysim.streams import Purpose, stream

PARTITIONERS: dict[str, str] = {
    "balanced_dirichlet": "Dirichlet(alpha) class priors per client, every client the same number of samples "
                          "(the balanced split of FedDyn's and FedACG's experiments; keys: alpha)",
    "dirichlet": "per-class Dirichlet(alpha) label skew, Hsu et al. 2019 (keys: alpha)",
    "iid": "uniformly random, equal-sized clients",
    "pathological": "Per-FedAvg split: half the clients hold classes 0-4, half a (j, j+5) pair "
                    "(keys: per_class, test_per_class, diff_hetero; even num_clients)",
    "shards": "label-sorted shards, McMahan et al. 2017 (keys: shards_per_client)",
}

Split = tuple[list[np.ndarray], list[np.ndarray]]
DIRICHLET_DRAWS = 1000  # dirichlet's draws at most before it gives up on a split where every client has a sample


def split_train_test(client_indices: list[np.ndarray], test_fraction: float,
                     rng: np.random.Generator) -> Split:
    """Shuffle each client's samples and keep ``round(test_fraction * n)`` for test (>= 1 train)."""
    train, test = [], []
    for idx in client_indices:
        idx = rng.permutation(np.asarray(idx, dtype=np.int64))
        n_train = len(idx) - min(round(test_fraction * len(idx)), len(idx) - 1)
        train.append(idx[:n_train])
        test.append(idx[n_train:])
    return train, test


def iid(labels: np.ndarray, num_clients: int, test_fraction: float, seed: int) -> Split:
    """A random permutation cut into ``num_clients`` near-equal parts."""
    if num_clients > len(labels):
        raise ScenarioError("data.num_clients", num_clients,
                            f"at most {len(labels)} (the number of samples) for the iid partition")
    rng = stream(seed, Purpose.PARTITION)
    parts = np.array_split(rng.permutation(len(labels)), num_clients)
    return split_train_test(parts, test_fraction, rng)


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, test_fraction: float, seed: int,
              min_size: int | None = None) -> Split:
    """Per class, proportions ~ Dirichlet(alpha * 1). With ``min_size`` unset, redrawn (at most
    :data:`DIRICHLET_DRAWS` times) until every client has a sample; with ``min_size`` k, every
    client first takes k samples drawn at random and the rest are split by one draw."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0:
        raise ScenarioError("data.partition.alpha", alpha, "a number > 0")
    labels = np.asarray(labels)
    rng = stream(seed, Purpose.PARTITION)
    reserved = [np.zeros(0, dtype=np.int64)] * num_clients
    rest = np.arange(len(labels))
    if min_size is not None:
        if min_size * num_clients > len(labels):
            raise ScenarioError("data.partition.min_size", min_size,
                                f"at most {len(labels) // num_clients} so that {num_clients} clients' samples fit "
                                f"in {len(labels)} (or at most {len(labels) // min_size} clients)")
        order = rng.permutation(len(labels))
        reserved = np.split(order[:min_size * num_clients], num_clients)
        rest = np.sort(order[min_size * num_clients:])
    by_class = [rest[labels[rest] == c] for c in np.unique(labels)]
    concentration = np.full(num_clients, float(alpha))
    for _ in range(DIRICHLET_DRAWS):
        draws = []
        for idx in by_class:
            idx = rng.permutation(idx)
            cuts = (np.cumsum(rng.dirichlet(concentration)) * len(idx)).astype(np.int64)
            cuts[-1] = len(idx)  # guard against the float cumsum ending just below 1
            draws.append((idx, cuts))
        sizes = sum(np.diff(cuts, prepend=0) for _, cuts in draws)
        if min_size is not None or sizes.min() >= 1:
            clients = [np.concatenate([reserved[k]] + [idx[(cuts[k - 1] if k else 0):cuts[k]] for idx, cuts in draws])
                       for k in range(num_clients)]
            return split_train_test(clients, test_fraction, rng)
    raise ScenarioError("data.num_clients", num_clients,
                        f"a population Dirichlet(alpha={alpha:g}) can fill: no draw in {DIRICHLET_DRAWS} gave every "
                        f"client a sample ({len(labels)} samples, {len(labels) / num_clients:.3g} per client); set "
                        f"data.partition.min_size (with 1 every client first takes a sample at random, which "
                        f"fills up to {len(labels)} clients) or take fewer clients")


def balanced_dirichlet(labels: np.ndarray, num_clients: int, alpha: float, test_fraction: float,
                       seed: int) -> Split:
    """Every client takes ``len(labels) // num_clients`` samples (the rest stay unused): each client
    draws its class priors ~ Dirichlet(alpha * 1), then samples are dealt one at a time to a client
    chosen at random among those not yet full, of a class drawn from its priors among the classes
    not yet used up (as Acar et al.'s FedDyn code deals them; a draw of a used-up class is redrawn
    there, renormalized here, which is the same law)."""
    labels = np.asarray(labels)

    def fits(size: int) -> bool:  # a training row, and a test row unless test_fraction is 0 (split_train_test)
        return size >= 1 and (test_fraction == 0 or 1 <= round(test_fraction * size) < size)

    size = len(labels) // num_clients
    if not fits(size):
        smallest = next(s for s in range(1, len(labels) + 2) if fits(s) or s > len(labels))
        raise ScenarioError("data.num_clients", num_clients,
                            f"at most {len(labels) // smallest} for the balanced_dirichlet partition of {len(labels)} "
                            f"samples with data.test_fraction {test_fraction:g}: each client takes {len(labels)} // "
                            "num_clients samples and needs a training and a test row")
    rng = stream(seed, Purpose.PARTITION)
    classes = np.unique(labels)
    priors = rng.dirichlet(np.full(len(classes), float(alpha)), size=num_clients)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    left = np.array([len(p) for p in pools])
    taken = np.zeros((num_clients, len(classes)), dtype=np.int64)
    open_clients = list(range(num_clients))
    need = np.full(num_clients, size)
    for u in rng.random(size * num_clients):
        k = open_clients[int(u * len(open_clients))]
        weights = priors[k] * (left > 0)
        total = weights.sum()
        p = weights / total if total > 0 else (left > 0) / (left > 0).sum()  # its priors all on used-up classes
        c = min(int(np.searchsorted(np.cumsum(p), rng.random(), side="right")), len(classes) - 1)
        while left[c] == 0:  # a rounding edge of the cumulative sum
            c = (c + 1) % len(classes)
        left[c] -= 1
        taken[k, c] += 1
        need[k] -= 1
        if need[k] == 0:
            open_clients.remove(k)
    starts = np.cumsum(taken, axis=0) - taken  # where client k's samples of class c begin in that class's pool
    clients = [np.concatenate([pools[c][starts[k, c]:starts[k, c] + taken[k, c]] for c in range(len(classes))])
               for k in range(num_clients)]
    return split_train_test(clients, test_fraction, rng)


def shards(labels: np.ndarray, num_clients: int, shards_per_client: int, test_fraction: float,
           seed: int) -> Split:
    """Sort by label, cut into ``num_clients * shards_per_client`` shards, deal them at random."""
    shards_per_client = check_count("data.partition.shards_per_client", shards_per_client, 1)
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ScenarioError("data.partition.shards_per_client", shards_per_client,
                            f"at most {len(labels) // num_clients} so that {num_clients} clients' "
                            f"shards fit in {len(labels)} samples")
    labels = np.asarray(labels)
    rng = stream(seed, Purpose.PARTITION)
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(order, num_shards)
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return split_train_test([np.concatenate([pieces[s] for s in row]) for row in deal],
                            test_fraction, rng)


def pathological(labels: np.ndarray, num_clients: int, per_class: int, test_per_class: int,
                 test_fraction: float, seed: int, diff_hetero: bool = False) -> Split:
    """The Per-FedAvg split (Fallah et al. 2020).

    Each class is shuffled and its first ``floor(n_c * (1 - test_fraction))`` samples form its
    train pool, the rest its test pool. Clients ``0..n/2-1`` take ``per_class`` train and
    ``test_per_class`` test samples of each class 0-4; client ``u >= n/2`` with
    ``j = (u - n/2) mod 5`` takes ``per_class // 2`` of class ``j`` and ``2 * per_class`` of
    class ``j + 5`` (test likewise), or only the class ``j + 5`` ones when ``diff_hetero``.
    Samples are drawn from the pools without replacement, in client order.
    """
    if num_clients % 2:
        raise ScenarioError("data.num_clients", num_clients, "an even number for the pathological partition")
    per_class = check_count("data.partition.per_class", per_class, 1)
    test_per_class = check_count("data.partition.test_per_class", test_per_class, 0)
    labels = np.asarray(labels)
    rng = stream(seed, Purpose.PARTITION)
    pools = {"train": {}, "test": {}}
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_train = int(np.floor(len(idx) * (1.0 - test_fraction)))
        pools["train"][c], pools["test"][c] = idx[:n_train], idx[n_train:]

    def wants(a: int) -> list[dict[int, int]]:
        half = num_clients // 2
        first = [{c: a for c in range(5)} for _ in range(half)]
        second = []
        for u in range(half):
            j = u % 5
            second.append({j + 5: 2 * a} if diff_hetero else {j: a // 2, j + 5: 2 * a})
        return first + second

    out = {}
    for part, a, key in (("train", per_class, "data.partition.per_class"),
                         ("test", test_per_class, "data.partition.test_per_class")):
        demand = wants(a)
        for c, pool in pools[part].items():
            need = sum(d.get(c, 0) for d in demand)
            if need > len(pool):
                raise ScenarioError(key, a, f"a smaller value: class {c} needs {need} {part} samples "
                                            f"but only {len(pool)} are available")
        taken = dict.fromkeys(range(10), 0)
        out[part] = []
        for d in demand:
            chunks = []
            for c, k in d.items():
                chunks.append(pools[part][c][taken[c]:taken[c] + k])
                taken[c] += k
            out[part].append(np.concatenate(chunks).astype(np.int64))
    return out["train"], out["test"]


def partition(labels: np.ndarray, num_clients: int, cfg, test_fraction: float, seed: int) -> Split:
    """Split centralized ``labels`` over clients as ``cfg.kind`` says (see ``PARTITIONERS``).

    ``cfg`` has attributes ``kind``, ``alpha``, ``shards_per_client``, ``per_class``,
    ``test_per_class`` and ``diff_hetero``, and may have ``min_size``.
    """
    num_clients = check_num_clients(num_clients)
    test_fraction = check_test_fraction(test_fraction)
    if cfg.kind == "iid":
        return iid(labels, num_clients, test_fraction, seed)
    if cfg.kind == "dirichlet":
        return dirichlet(labels, num_clients, cfg.alpha, test_fraction, seed,
                         getattr(cfg, "min_size", None))
    if cfg.kind == "balanced_dirichlet":
        return balanced_dirichlet(labels, num_clients, cfg.alpha, test_fraction, seed)
    if cfg.kind == "shards":
        return shards(labels, num_clients, cfg.shards_per_client, test_fraction, seed)
    if cfg.kind == "pathological":
        return pathological(labels, num_clients, cfg.per_class, cfg.test_per_class,
                            test_fraction, seed, bool(cfg.diff_hetero))
    raise ScenarioError("data.partition.kind", cfg.kind, "one of " + ", ".join(sorted(PARTITIONERS)))
