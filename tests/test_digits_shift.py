"""The digits generator's per-client ("writer") feature and concept shifts."""

from types import SimpleNamespace

import numpy as np
import pytest

from raysim.data.federated import FederatedDataset
from raysim.data.generators import digits
from raysim.data.partition import partition
from raysim.errors import ScenarioError

CLIENTS, TEST_FRACTION, SEED = 10, 0.2, 3


def dirichlet_cfg(alpha=0.5):
    return SimpleNamespace(kind="dirichlet", alpha=alpha, shards_per_client=2, per_class=10,
                           test_per_class=4, diff_hetero=False)


def build(seed=SEED, **kw):
    return digits(CLIENTS, dirichlet_cfg(), TEST_FRACTION, seed, **kw)


def client_rows(ds):
    """Client k's rows (train then test) as a slice of the table."""
    return [slice(int(a), int(c)) for a, _, c in ds.offsets()]


@pytest.fixture(scope="module")
def plain():
    return build()


def test_defaults_unchanged(plain):
    explicit = build(feature_shift=False, concept_shift=False)
    assert plain.table.equals(explicit.table, check_metadata=True)
    assert plain.features().tobytes() == explicit.features().tobytes()
    assert plain.labels().tobytes() == explicit.labels().tobytes()
    # The generator as it was before the shifts existed, rebuilt by hand.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    train, test = partition(y, CLIENTS, dirichlet_cfg(), TEST_FRACTION, SEED)
    before = FederatedDataset.from_clients([x[i] for i in train], [y[i] for i in train],
                                           [x[i] for i in test], [y[i] for i in test], 10, (1, 8, 8))
    assert plain.table.equals(before.table, check_metadata=True)


def test_shifts_keep_the_partition(plain):
    both = build(feature_shift=True, concept_shift=True)
    for name in ("client_id", "split"):
        assert both.table.column(name).equals(plain.table.column(name))
    assert np.array_equal(both.offsets(), plain.offsets())
    assert both.feature_shape == (1, 8, 8) and both.num_classes == 10
    # Each shift touches only its own column.
    feat, conc = build(feature_shift=True), build(concept_shift=True)
    assert np.array_equal(feat.labels(), plain.labels())
    assert np.array_equal(conc.features(), plain.features())
    assert np.array_equal(both.features(), feat.features())
    assert np.array_equal(both.labels(), conc.labels())


def fit_style(before: np.ndarray, after: np.ndarray):
    """Recover (g, o, dy, dx, residual) with after ~ g * translate(before, dy, dx) + o.

    For each of the 9 translations, least squares of g and o on the pixels whose source stays
    inside the image; the translation with the smallest residual wins.
    """
    b, a = before.reshape(-1, 8, 8).astype(np.float64), after.reshape(-1, 8, 8).astype(np.float64)
    best = None
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            rows, cols = slice(max(dy, 0), 8 + min(dy, 0)), slice(max(dx, 0), 8 + min(dx, 0))
            src = b[:, max(-dy, 0):8 + min(-dy, 0), max(-dx, 0):8 + min(-dx, 0)].reshape(-1)
            dst = a[:, rows, cols].reshape(-1)
            design = np.stack([src, np.ones_like(src)], axis=1)
            (g, o), *_ = np.linalg.lstsq(design, dst, rcond=None)
            residual = float(np.max(np.abs(design @ np.array([g, o]) - dst)))
            if best is None or residual < best[-1]:
                best = (float(g), float(o), dy, dx, residual)
    return best


def test_feature_shift_is_affine_and_translated_per_client(plain):
    ds = build(feature_shift=True)
    assert ds.features().dtype == np.float32
    gains, moves = [], set()
    for k, rows in enumerate(client_rows(ds)):
        before, after = plain.features()[rows], ds.features()[rows]
        g, o, dy, dx, residual = fit_style(before, after)
        assert residual < 1e-5, (k, residual)
        assert 0.6 <= g <= 1.4 and -0.2 <= o <= 0.2, (k, g, o)
        # The vacated border row/column holds g * 0 + o.
        img = after.reshape(-1, 8, 8)
        if dy:
            assert np.allclose(img[:, 0 if dy > 0 else 7, :], o, atol=1e-6)
        if dx:
            assert np.allclose(img[:, :, 0 if dx > 0 else 7], o, atol=1e-6)
        gains.append(g)
        moves.add((dy, dx))
    assert len(np.unique(np.round(gains, 6))) == CLIENTS, "every client gets its own gain"
    assert len(moves) > 1, "clients are translated differently"


def test_same_seed_same_arrays_other_seed_differs():
    a = build(feature_shift=True, concept_shift=True)
    b = build(feature_shift=True, concept_shift=True)
    assert a.features().tobytes() == b.features().tobytes()
    assert a.labels().tobytes() == b.labels().tobytes()
    assert a.table.equals(b.table, check_metadata=True)
    c = build(seed=SEED + 1, feature_shift=True, concept_shift=True)
    assert not np.array_equal(a.features()[:20], c.features()[:20])


def test_concept_shift_permutes_labels_per_client(plain):
    ds = build(concept_shift=True)
    maps = []
    for k, rows in enumerate(client_rows(ds)):
        old, new = plain.labels()[rows], ds.labels()[rows]
        mapping = {}
        for a, b in zip(old.tolist(), new.tolist()):
            assert mapping.setdefault(a, b) == b, f"client {k}: label {a} maps to two labels"
        assert len(set(mapping.values())) == len(mapping), f"client {k}: not injective"
        assert sorted(np.bincount(old, minlength=10)) == sorted(np.bincount(new, minlength=10))
        for a, b in mapping.items():
            assert np.sum(old == a) == np.sum(new == b)
        # The same map on the client's train and test rows.
        tr, te = slice(rows.start, int(ds.offsets()[k, 1])), slice(int(ds.offsets()[k, 1]), rows.stop)
        for part in (tr, te):
            assert all(mapping[a] == b for a, b in zip(plain.labels()[part].tolist(),
                                                       ds.labels()[part].tolist()))
        maps.append(mapping)
    shared = [(i, j) for i in range(CLIENTS) for j in range(i + 1, CLIENTS)]
    assert any(any(maps[i][c] != maps[j][c] for c in maps[i].keys() & maps[j].keys())
               for i, j in shared), "some clients permute differently"


def test_shift_flags_must_be_bools():
    with pytest.raises(ScenarioError, match=r"^data\.feature_shift = 'yes'"):
        build(feature_shift="yes")
    with pytest.raises(ScenarioError, match=r"^data\.concept_shift = 1"):
        build(concept_shift=1)
