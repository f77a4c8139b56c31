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

from enum import IntEnum

import numpy as np

MAX_ID = 2 ** 32 - 1


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


def seed_sequence(seed: int, purpose: Purpose, *ids: int) -> np.random.SeedSequence:
    """The SeedSequence of one stream (see the module doc)."""
    for value in ids:
        if not 0 <= int(value) <= MAX_ID:
            raise ValueError(f"stream id {value} of {purpose.name} must lie in [0, {MAX_ID}]")
    return np.random.SeedSequence(int(seed), spawn_key=(int(purpose), len(ids), *(int(v) for v in ids)))


def stream(seed: int, purpose: Purpose, *ids: int) -> np.random.Generator:
    """A numpy Generator for ``purpose`` and the given ids (client, counter, …)."""
    return np.random.default_rng(seed_sequence(seed, purpose, *ids))
