"""Random streams: every random draw of a run comes from a stream named by a purpose and ids.

A stream is ``numpy.random.default_rng(SeedSequence(seed, spawn_key=(purpose, len(ids), *ids)))``
(see :func:`stream`). numpy's ``SeedSequence`` pads the seed to four 32-bit words and then
mixes in every spawn-key word, so two streams are equal only if their seed, purpose, number
of ids and ids all are; ids are checked to fit one 32-bit word each, which keeps that true.

The one exception is the ``gaussian_mixture`` benchmark's documented law: client ``k`` draws
from ``default_rng([seed, k])``. Those streams have at most four words and no spawn key, so
they can never equal a purpose stream either (``tests/test_streams.py`` checks every purpose
over small ids against each other and against them).

Never renumber :class:`Purpose`: the number is part of every stream's key.
"""

from __future__ import annotations

import functools
from enum import IntEnum

import numpy as np
from numpy.random.bit_generator import ISeedSequence

MAX_ID = 2 ** 32 - 1
STREAMS_AT_ONCE = 4096  # callers that need a stream per client of many build them in batches of this size


class Purpose(IntEnum):
    """What a stream is for; the ids each purpose takes are listed beside it."""

    CLIENT_TRAIN = 1  # (client, dispatch counter): batches, straggler coins, noise, personal init
    CLIENT_PERSONALIZE = 2  # (client, counter): the evaluation's fine-tuning batches
    L2GD_COINS = 3  # (round,): L2GD's averaging / local-step coins
    SYSTEM_PROFILE = 4  # (profile field,): one draw per client of a static profile field
    SYSTEM_TASK = 5  # (client, counter): a task's compute noise, dropout coin and failure point
    SYSTEM_AVAILABILITY = 6  # (counter,): Bernoulli availability coins of every client
    SYSTEM_SAMPLE = 7  # (counter,): the keys of the client-sampling order
    GAUSSIAN_MIXTURE_MEANS = 8  # (): the benchmark's class means
    LEAF_SYNTHETIC = 9  # (client,): a LEAF Synthetic client's model and rows
    DIGITS_STYLE = 10  # (client,): a digits writer's gain, offset and translation
    DIGITS_LABELS = 11  # (client,): a digits writer's label permutation
    PARTITION = 12  # (): how a centralized data set is split over clients
    PARQUET_SPLIT = 13  # (): the train/test split of a Parquet file without a split column
    QUADRATIC_CLIENT = 14  # (client,): a quadratic client's matrices and targets
    QUADRATIC_PLANT = 15  # (): the planted θ of the realizable quadratic problem
    BLOBS = 16  # (): the centralized Gaussian-blob data set
    EVAL_CLIENTS = 17  # (): the sample of clients that evaluation tests (eval.clients)
    SADDLE_CLIENT = 18  # (client,): a saddle-data client's mean m_k and rows
    BILINEAR_INIT = 19  # (): the bilinear model's initial parameters
    BYZANTINE_ATTACK = 20  # (server step,): the gaussian attack's vectors of that step
    BUCKETING = 21  # (aggregations so far,): the random permutation of bucketing at that aggregation
    SYNTHETIC_IMAGES = 22  # (): the class prototypes; (client,): a client's shift, labels and noise
    DEPLOYED_START = 23  # (client, server step): the personal start of the deployed-model evaluation
    DP_NOISE = 24  # (server step,): central DP's Gaussian noise on that step's sum
    POISSON_ROUND = 25  # (counter,): the size of a Poisson-sampled round (execution.sampling: poisson)
    DP_TREE_NODE = 26  # (tree, level, index): DP-FTRL's Gaussian noise of one node of an aggregation tree
    SELECTION = 27  # (counter,): a selection policy's draws for the round sampled at that counter
    NEW_CLIENTS = 28  # (): the clients held out of training for new-client evaluation (eval.new_clients)


def seed_sequence(seed: int, purpose: Purpose, *ids: int) -> np.random.SeedSequence:
    """The SeedSequence of one stream (see the module doc)."""
    for value in ids:
        if not 0 <= int(value) <= MAX_ID:
            raise ValueError(f"stream id {value} of {purpose.name} must lie in [0, {MAX_ID}]")
    return np.random.SeedSequence(int(seed), spawn_key=(int(purpose), len(ids), *(int(v) for v in ids)))


def stream(seed: int, purpose: Purpose, *ids: int) -> np.random.Generator:
    """A numpy Generator for ``purpose`` and the given ids (client, counter, …)."""
    return np.random.default_rng(seed_sequence(seed, purpose, *ids))


# numpy's SeedSequence (``numpy/random/bit_generator.pyx``), vectorized over many streams by :func:`streams`
_POOL, _SHIFT, _MASK = 4, 16, 0xFFFFFFFF
_VECTOR_MIN = 4  # fewer streams are built one by one: the vectorized hashing costs about as much as four
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)


def _constants(init: int, mult: int, count: int) -> np.ndarray:
    """``init · mult^j`` mod 2³², j = 0 … count: the hash constant before each hashing step."""
    out, value = [], init
    for _ in range(count + 1):
        out.append(value)
        value = (value * mult) & _MASK
    return np.array(out, dtype=np.uint32)


_HASH_A = _constants(_INIT_A, _MULT_A, 64 * _POOL)  # mixing a pool: entropy words up to 60
_HASH_B = _constants(_INIT_B, _MULT_B, 2 * _POOL)  # generate_state(4, uint64): eight words


def _hashmix(values: np.ndarray, j: int, m: int) -> np.ndarray:
    """SeedSequence's ``hashmix`` calls j … j+m-1 (``values`` [N, m], or [N, 1]: the same value m times)."""
    out = (values ^ _HASH_A[j:j + m]) * _HASH_A[j + 1:j + m + 1]
    return out ^ (out >> _SHIFT)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = _MIX_L * x - _MIX_R * y
    return out ^ (out >> _SHIFT)


def _words(value: int) -> list:
    """A non-negative integer as little-endian 32-bit words, as SeedSequence reads its entropy."""
    words = []
    while value > 0:
        words.append(value & _MASK)
        value >>= 32
    return words or [0]


def streams(seed: int, purpose: Purpose, ids) -> list:
    """``[stream(seed, purpose, *row) for row in ids]`` for ids [N, k], at a fraction of the cost:
    SeedSequence's hashing runs once over all rows (the same words numpy computes; a test checks
    it), then each Generator's PCG64 is seeded from its row's state."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"stream ids must be a [N, k] array, not of shape {ids.shape}")
    if len(ids) < _VECTOR_MIN:
        return [stream(seed, purpose, *row) for row in ids.tolist()]
    bad = (ids < 0) | (ids > MAX_ID)
    if bad.any():
        seed_sequence(seed, purpose, *ids[bad.any(1).argmax()])  # raises the one-stream error
    run = _words(int(seed))
    run += [0] * (_POOL - len(run))  # a spawn key follows: the run entropy is padded to the pool size
    pool, position = _shared_pool(tuple(run + [int(purpose), ids.shape[1]]))
    pool, _ = _mix_in(np.broadcast_to(pool, (len(ids), _POOL)), position, ids.astype(np.uint32))
    return _generators(pool)


def keyed_streams(seed: int, keys) -> list:
    """``[np.random.default_rng([seed, k]) for k in keys]`` (the ``gaussian_mixture`` law's client
    streams, see the module doc), hashed at once as :func:`streams` does."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    if len(keys) < _VECTOR_MIN or ((keys < 0) | (keys > MAX_ID)).any():  # numpy's own words, or its error
        return [np.random.default_rng([int(seed), k]) for k in keys.tolist()]
    run = np.array(_words(int(seed)), dtype=np.uint32)
    return _generators(_pool(np.column_stack([np.broadcast_to(run, (len(keys), len(run))), keys.astype(np.uint32)])))


@functools.lru_cache(maxsize=64)
def _shared_pool(prefix: tuple) -> tuple:
    """(pool [1, _POOL], hash position) after mixing the entropy words ``prefix`` (at least
    ``_POOL`` of them), which every stream of one seed and purpose begins with: mixed once."""
    pool, j = _mix_in(*_initial_pool(np.array([prefix[:_POOL]], dtype=np.uint32)),
                      np.array([prefix[_POOL:]], dtype=np.uint32).reshape(1, -1))
    pool.setflags(write=False)  # shared by every call
    return pool, j


def _pool(entropy: np.ndarray) -> np.ndarray:
    """The pools [N, _POOL] of N streams from their entropy words [N, m] (an entropy shorter than
    the pool is mixed as if padded with zero words)."""
    if entropy.shape[1] < _POOL:
        entropy = np.pad(entropy, ((0, 0), (0, _POOL - entropy.shape[1])))
    return _mix_in(*_initial_pool(entropy[:, :_POOL]), entropy[:, _POOL:])[0]


def _initial_pool(words: np.ndarray) -> tuple:
    """(pool, hash position) from the first ``_POOL`` entropy words [N, _POOL], every word of the
    pool mixed into every other."""
    pool = _hashmix(words, 0, _POOL)
    j = _POOL
    for src in range(_POOL):
        others = [dst for dst in range(_POOL) if dst != src]
        pool[:, others] = _mix(pool[:, others], _hashmix(pool[:, src:src + 1], j, _POOL - 1))
        j += _POOL - 1
    return pool, j


def _mix_in(pool: np.ndarray, j: int, words: np.ndarray) -> tuple:
    """(pool, hash position) after mixing the further entropy words [N, m] into every word of the
    pools [N, _POOL], from hash position ``j``."""
    for src in range(words.shape[1]):
        pool = _mix(pool, _hashmix(words[:, src:src + 1], j, _POOL))
        j += _POOL
    return pool, j


def _generators(pool: np.ndarray) -> list:
    """One Generator per pool [N, _POOL], seeded as ``SeedSequence`` seeds PCG64 from its pool."""
    state = np.tile(pool, 2) ^ _HASH_B[:-1]
    state *= _HASH_B[1:]
    state ^= state >> _SHIFT
    states = np.ascontiguousarray(state).astype("<u4").view("<u8").astype(np.uint64)
    return [np.random.Generator(np.random.PCG64(_State(row))) for row in states]


class _State(ISeedSequence):
    """A seed that hands PCG64 the state :func:`streams` computed for it (the four 64-bit words
    PCG64 asks for)."""

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words, dtype=np.uint32):
        return self.words
