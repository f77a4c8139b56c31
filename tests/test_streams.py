"""Random streams never collide: every purpose over small ids and counters, and the benchmark's
documented ``default_rng([seed, k])`` client streams, give distinct draws."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raysim.streams import MAX_ID, Purpose, keyed_streams, seed_sequence, stream, streams


def _fingerprint(rng: np.random.Generator) -> tuple:
    return tuple(rng.integers(0, 2 ** 63, size=2).tolist())


def test_every_stream_is_distinct():
    seen = {}
    for seed in (0, 1, 2 ** 40):
        streams = {("gaussian_mixture client", seed, k): np.random.default_rng([seed, k]) for k in range(64)}
        for purpose in Purpose:
            for arity in range(3):  # purposes take up to two ids (client, counter)
                for ids in itertools.product(range(6), repeat=arity):
                    streams[(purpose.name, seed, *ids)] = stream(seed, purpose, *ids)
        for name, rng in streams.items():
            key = _fingerprint(rng)
            assert key not in seen, f"{name} collides with {seen[key]}"
            seen[key] = name
    assert len(seen) == 3 * (64 + len(Purpose) * (1 + 6 + 36))


def test_trailing_zero_ids_and_counters_are_distinct_streams():
    """numpy's SeedSequence ignores trailing zeros of short entropy lists ([s, 10] equals
    [s, 10, 0], and default_rng(s) equals [s, 0], the benchmark's client 0, which is why no
    stream of raysim is default_rng(s)); keyed streams count their ids, so (client 10) and
    (client 10, counter 0) differ."""
    assert np.random.default_rng([3, 10]).random() == np.random.default_rng([3, 10, 0]).random()
    assert np.random.default_rng(3).random() == np.random.default_rng([3, 0]).random()
    assert stream(3, Purpose.CLIENT_TRAIN, 10).random() != stream(3, Purpose.CLIENT_TRAIN, 10, 0).random()


def test_a_stream_is_a_pure_function_of_its_key():
    a = stream(7, Purpose.SYSTEM_TASK, 12, 3).random(5)
    b = stream(7, Purpose.SYSTEM_TASK, 12, 3).random(5)
    assert a.tolist() == b.tolist()
    assert seed_sequence(7, Purpose.SYSTEM_TASK, 12, 3).spawn_key == (int(Purpose.SYSTEM_TASK), 2, 12, 3)


def test_ids_must_fit_one_word():
    stream(0, Purpose.CLIENT_TRAIN, MAX_ID, 0)
    with pytest.raises(ValueError, match="stream id 4294967296 of CLIENT_TRAIN"):
        stream(0, Purpose.CLIENT_TRAIN, MAX_ID + 1)
    with pytest.raises(ValueError, match="stream id -1"):
        stream(0, Purpose.CLIENT_TRAIN, -1)


@pytest.mark.parametrize("seed", [0, 1, 12345, 2 ** 32 - 1, 2 ** 32, 2 ** 40 + 7, 2 ** 130 + 11])
@pytest.mark.parametrize("arity", [0, 1, 2, 3])
def test_streams_built_at_once_are_the_streams_built_one_by_one(seed, arity):
    """:func:`streams` hashes many keys at once with numpy arrays; every generator it returns
    draws exactly what ``stream`` of its row draws (seeds of one to five words, ids up to MAX_ID)."""
    rng = np.random.default_rng(seed % 1000 + arity)
    for count in (1, 3, 4, 7, 40):  # below and above the size where the vectorized path starts
        ids = rng.integers(0, MAX_ID + 1, size=(count, arity))
        ids[0] = 0
        if arity:
            ids[-1, -1] = MAX_ID
        for purpose in (Purpose.CLIENT_TRAIN, Purpose.SYSTEM_TASK):
            got = [g.integers(0, 2 ** 63, size=3).tolist() + [g.standard_normal()] for g in streams(seed, purpose, ids)]
            expected = [g.integers(0, 2 ** 63, size=3).tolist() + [g.standard_normal()]
                        for g in (stream(seed, purpose, *row) for row in ids.tolist())]
            assert got == expected


@pytest.mark.parametrize("seed", [0, 1, 12345, 2 ** 32 - 1, 2 ** 32, 2 ** 40 + 7, 2 ** 130 + 11])
def test_keyed_streams_are_default_rng_of_seed_and_key(seed):
    """The gaussian_mixture law's streams, hashed at once: entropy of two to six words (shorter than
    numpy's pool, or longer), keys 0 … MAX_ID; keys numpy would split into two words, or reject,
    take numpy's own path."""
    rng = np.random.default_rng(seed % 997)
    for count in (1, 3, 4, 7, 40):
        keys = rng.integers(0, MAX_ID + 1, size=count)
        keys[0], keys[-1] = 0, MAX_ID
        got = [g.integers(0, 2 ** 63, size=3).tolist() + [g.standard_normal()] for g in keyed_streams(seed, keys)]
        expected = [g.integers(0, 2 ** 63, size=3).tolist() + [g.standard_normal()]
                    for g in (np.random.default_rng([seed, k]) for k in keys.tolist())]
        assert got == expected
    wide = np.arange(10) + MAX_ID - 4
    assert [g.random() for g in keyed_streams(seed, wide)] == [np.random.default_rng([seed, k]).random()
                                                               for k in wide.tolist()]
    with pytest.raises(ValueError):
        keyed_streams(seed, np.arange(10) - 1)


def test_streams_check_their_ids_as_stream_does():
    ids = np.zeros((10, 2), dtype=np.int64)
    ids[6, 1] = MAX_ID + 1
    with pytest.raises(ValueError, match="stream id 4294967296 of SYSTEM_TASK"):
        streams(0, Purpose.SYSTEM_TASK, ids)
    ids[6, 1] = -1
    with pytest.raises(ValueError, match="stream id -1"):
        streams(0, Purpose.SYSTEM_TASK, ids)
