"""Tests of raysim.data: the Arrow layout, the generators, the partitioners and the Parquet loader."""

import pickle
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from raysim.data import DATASETS, PARTITIONERS, FederatedDataset, build_dataset
from raysim.data.partition import partition
from raysim.data.generated import gaussian_mixture, leaf_synthetic
from raysim.data.generators import blobs, digits
from raysim.data.parquet import load_parquet
from raysim.errors import ScenarioError
from raysim.streams import Purpose, stream


def part_cfg(kind="iid", **kw):
    base = dict(kind=kind, alpha=0.5, shards_per_client=2, per_class=10, test_per_class=4,
                diff_hetero=False)
    return SimpleNamespace(**{**base, **kw})


def data_cfg(kind, **kw):
    base = dict(kind=kind, num_clients=4, alpha=1.0, beta=1.0, iid=False, test_fraction=0.2,
                partition=part_cfg(), path=None, label_column="label", client_column="client_id",
                feature_columns=None, image_shape=None, feature_shift=False, concept_shift=False, on_demand="auto",
                cache_mb=128.0)
    return SimpleNamespace(**{**base, **kw})


def assert_layout(ds: FederatedDataset):
    """The invariants every federated table keeps."""
    t = ds.table
    assert t.column_names == ["client_id", "split", "x", "y"]
    assert t.schema.field("client_id").type == pa.int32()
    assert t.schema.field("split").type == pa.int8()
    assert t.schema.field("x").type == pa.list_(pa.float32(), ds.num_features)
    assert t.schema.field("y").type == pa.int64()
    cid = t.column("client_id").to_numpy()
    split = t.column("split").to_numpy()
    key = cid.astype(np.int64) * 2 + split
    assert np.all(np.diff(key) >= 0), "rows sorted by client, train before test"
    assert set(np.unique(split)) <= {0, 1}
    off = ds.offsets()
    assert off.dtype == np.int64 and off.shape == (ds.num_clients, 3)
    assert off[0, 0] == 0 and off[-1, 2] == t.num_rows
    assert np.array_equal(off[1:, 0], off[:-1, 2])
    for c in range(ds.num_clients):
        a, b, e = off[c]
        assert np.all(cid[a:e] == c)
        assert np.all(split[a:b] == 0) and np.all(split[b:e] == 1)
    assert np.all(ds.train_sizes() >= 1)
    assert np.array_equal(ds.train_sizes() + ds.test_sizes(), np.bincount(cid, minlength=ds.num_clients))
    x, y = ds.features(), ds.labels()
    assert x.dtype == np.float32 and x.shape == (t.num_rows, ds.num_features)
    assert y.dtype == np.int64 and y.shape == (t.num_rows,)
    assert y.min() >= 0 and y.max() < ds.num_classes
    assert ds.num_features == int(np.prod(ds.feature_shape))


# --- the table ---------------------------------------------------------------------------------

def test_from_clients_layout_and_zero_copy():
    rng = np.random.default_rng(0)
    sizes = [(3, 2), (1, 0), (4, 1)]
    train_x = [rng.normal(size=(n, 2, 3)) for n, _ in sizes]
    test_x = [rng.normal(size=(m, 2, 3)) for _, m in sizes]
    train_y = [rng.integers(0, 5, n) for n, _ in sizes]
    test_y = [rng.integers(0, 5, m) for _, m in sizes]
    ds = FederatedDataset.from_clients(train_x, train_y, test_x, test_y, 5, (2, 3))
    assert_layout(ds)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape, ds.num_features) == (3, 5, (2, 3), 6)
    assert ds.offsets().tolist() == [[0, 3, 5], [5, 6, 6], [6, 10, 11]]
    expected_x = np.concatenate([a for pair in zip(train_x, test_x) for a in pair]).reshape(-1, 6)
    assert np.array_equal(ds.features(), expected_x.astype(np.float32))
    assert np.array_equal(ds.labels(), np.concatenate([a for pair in zip(train_y, test_y) for a in pair]))

    x, y = ds.features(), ds.labels()
    arrow_x = np.frombuffer(ds.table.column("x").chunk(0).values.buffers()[1], dtype=np.float32)
    assert np.shares_memory(x, arrow_x) and not x.flags.owndata and not x.flags.writeable
    arrow_y = np.frombuffer(ds.table.column("y").chunk(0).buffers()[1], dtype=np.int64)
    assert np.shares_memory(y, arrow_y)
    assert ds.features() is x, "derived arrays are cached"

    meta = ds.table.schema.metadata
    assert {b"num_clients", b"num_classes", b"feature_shape"} <= set(meta)

    back = pickle.loads(pickle.dumps(ds))
    assert back.table.equals(ds.table) and back.table.schema.metadata == meta
    assert (back.num_clients, back.num_classes, back.feature_shape) == (3, 5, (2, 3))
    assert np.array_equal(back.features(), x) and np.array_equal(back.offsets(), ds.offsets())


def test_sliced_and_chunked_tables():
    ds = gaussian_mixture(4, seed=1)
    t = ds.table
    sliced = FederatedDataset(pa.concat_tables([t, t]).combine_chunks().slice(t.num_rows))
    assert sliced.table.column("x").chunk(0).offset == t.num_rows
    assert np.array_equal(sliced.features(), ds.features()) and not sliced.features().flags.owndata
    assert np.array_equal(sliced.labels(), ds.labels())
    chunked = FederatedDataset(pa.concat_tables([t.slice(0, 77), t.slice(77)]))
    assert chunked.table.column("x").num_chunks == 2
    assert np.array_equal(chunked.features(), ds.features())
    assert np.array_equal(chunked.offsets(), ds.offsets())


def test_from_clients_rejects_client_without_train_rows():
    with pytest.raises(ValueError, match="train row"):
        FederatedDataset.from_clients([np.zeros((1, 2)), np.zeros((0, 2))], [np.zeros(1), np.zeros(0)],
                                      [np.zeros((0, 2))] * 2, [np.zeros(0)] * 2, 2, (2,))


# --- generators -------------------------------------------------------------------------------

def test_gaussian_mixture_matches_the_definition():
    seed = 3
    ds = gaussian_mixture(9, seed)
    assert_layout(ds)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (9, 10, (60,))
    n = 50 + (37 * np.arange(9)) % 151
    assert np.array_equal(ds.train_sizes(), n) and np.all(ds.test_sizes() == 10)
    means = stream(seed, Purpose.GAUSSIAN_MIXTURE_MEANS).normal(0.0, 0.3, size=(10, 60))
    off = ds.offsets()
    for k in range(9):  # every client, against the law written with rng.choice
        rng = np.random.default_rng([seed, k])
        shift = rng.normal(0, 0.5, size=60)
        p = rng.dirichlet(0.5 * np.ones(10))
        y = rng.choice(10, size=n[k] + 10, p=p)
        x = (means[y] + shift + rng.normal(0, 1, size=(n[k] + 10, 60))).astype(np.float32)
        a, b, e = off[k]
        assert np.array_equal(ds.features()[a:e], x)
        assert np.array_equal(ds.labels()[a:e], y)
        assert np.array_equal(ds.features()[a:b], x[:n[k]]) and np.array_equal(ds.features()[b:e], x[n[k]:])


def test_gaussian_mixture_is_deterministic_and_client_prefix_stable():
    a, b, c = gaussian_mixture(6, 11), gaussian_mixture(6, 11), gaussian_mixture(6, 12)
    assert a.table.equals(b.table)
    assert a.features().tobytes() == b.features().tobytes()
    assert a.features().tobytes() != c.features().tobytes()
    small = gaussian_mixture(3, 11)
    rows = small.table.num_rows
    assert np.array_equal(small.features(), a.features()[:rows]), "client k does not depend on num_clients"


def test_leaf_synthetic():
    ds = leaf_synthetic(num_clients=6, alpha=1.0, beta=1.0, seed=0, test_fraction=0.25)
    assert_layout(ds)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (6, 10, (60,))
    sizes = ds.train_sizes() + ds.test_sizes()
    assert np.all(sizes >= 50)
    assert np.array_equal(ds.test_sizes(), np.round(0.25 * sizes).astype(int))
    # sizes follow FedProx: int(lognormal(4, 2)) + 50, the first draw of each client's generator
    assert sizes[2] == int(stream(0, Purpose.LEAF_SYNTHETIC, 2).lognormal(4, 2)) + 50
    off, x, y = ds.offsets(), ds.features(), ds.labels()
    means = np.stack([x[a:e].mean(axis=0) for a, _, e in off])
    assert np.abs(means[0] - means[1]).max() > 0.1, "clients have different feature means"
    # Sigma_jj = j^-1.2: the first feature varies far more than the last inside a client
    a, _, e = off[int(np.argmax(sizes))]
    assert x[a:e, 0].std() > 5 * x[a:e, -1].std()
    assert len(np.unique(y)) > 1
    same = leaf_synthetic(6, 1.0, 1.0, 0, 0.25)
    other = leaf_synthetic(6, 1.0, 1.0, 1, 0.25)
    assert same.table.equals(ds.table) and not other.table.equals(ds.table)
    with pytest.raises(ScenarioError, match=r"^data\.alpha = -1: expected a standard deviation"):
        leaf_synthetic(2, -1, 1.0, 0, 0.2)
    with pytest.raises(ScenarioError, match=r"^data\.test_fraction"):
        leaf_synthetic(2, 1.0, 1.0, 0, 1.0)


def _leaf_reference(seed: int, k: int, alpha: float, beta: float, iid: bool):
    """Client k of Synthetic(alpha, beta) drawn as LEAF's and FedProx's generate_synthetic.py draw it
    (alpha, beta standard deviations), from raysim's streams: (x, y)."""
    rng = stream(seed, Purpose.LEAF_SYNTHETIC, k)
    n = int(rng.lognormal(4, 2)) + 50
    u = rng.normal(0, alpha)
    b_mean = rng.normal(0, beta)
    if iid:
        shared = stream(seed, Purpose.LEAF_SYNTHETIC)
        w, b = shared.normal(0, 1, (10, 60)), shared.normal(0, 1, 10)
        mean_x = np.ones(60) * b_mean
    else:
        w, b, mean_x = rng.normal(u, 1, (10, 60)), rng.normal(u, 1, 10), rng.normal(b_mean, 1, 60)
    x = mean_x + rng.normal(0, 1, (n, 60)) * np.arange(1, 61) ** -0.6
    return x.astype(np.float32), np.argmax(x @ w.T + b, axis=1)


@pytest.mark.parametrize("iid", [False, True])
def test_leaf_synthetic_draws_alpha_and_beta_as_standard_deviations(iid):
    ds = leaf_synthetic(4, 0.5, 2.0, seed=3, test_fraction=0.2, iid=iid)
    off = ds.offsets()
    for k in range(4):
        x, y = _leaf_reference(3, k, 0.5, 2.0, iid)
        a, _, e = off[k]
        assert np.array_equal(ds.features()[a:e], x) and np.array_equal(ds.labels()[a:e], y)


def test_digits_and_build_dataset():
    ds = digits(5, part_cfg("iid"), test_fraction=0.2, seed=0)
    assert_layout(ds)
    assert (ds.num_clients, ds.num_classes, ds.feature_shape) == (5, 10, (1, 8, 8))
    assert ds.table.num_rows == 1797
    x = ds.features()
    assert x.min() == 0.0 and x.max() == 1.0
    built = build_dataset(data_cfg("digits", num_clients=5), seed=0)
    assert built.table.equals(ds.table)
    omega = OmegaConf.create({**vars(data_cfg("gaussian_mixture", num_clients=3)),
                              "partition": vars(part_cfg())})
    assert build_dataset(omega, seed=2).table.equals(gaussian_mixture(3, 2).table)
    assert build_dataset(data_cfg("leaf_synthetic", num_clients=2), seed=0).num_clients == 2
    assert set(DATASETS) == {"blobs", "cifar10", "cifar100", "digits", "fashion_mnist", "gaussian_mixture", "leaf",
                             "leaf_synthetic", "mnist", "parquet", "quadratic", "saddle", "synthetic_images"}
    with pytest.raises(ScenarioError) as excinfo:
        build_dataset(data_cfg("imagenet"), seed=0)
    assert str(excinfo.value) == ("data.kind = 'imagenet': expected one of blobs, cifar10, cifar100, digits, "
                                  "fashion_mnist, gaussian_mixture, leaf, leaf_synthetic, mnist, parquet, quadratic, "
                                  "saddle, synthetic_images")
    with pytest.raises(ScenarioError, match=r"^data\.num_clients = 0"):
        build_dataset(data_cfg("gaussian_mixture", num_clients=0), seed=0)


# --- partitioners -----------------------------------------------------------------------------

def balanced_labels(per_class=100, classes=10):
    return np.repeat(np.arange(classes), per_class)


def all_indices(train, test):
    return np.sort(np.concatenate(train + test))


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "shards"])
def test_every_sample_assigned_exactly_once(kind):
    labels = np.random.default_rng(0).integers(0, 10, 997)
    train, test = partition(labels, 13, part_cfg(kind, alpha=1.0), test_fraction=0.2, seed=4)
    assert len(train) == len(test) == 13
    assert np.array_equal(all_indices(train, test), np.arange(997))
    for tr, te in zip(train, test):
        assert tr.dtype == np.int64 and te.dtype == np.int64 and len(tr) >= 1
        assert len(te) == min(round(0.2 * (len(tr) + len(te))), len(tr) + len(te) - 1)
    again = partition(labels, 13, part_cfg(kind, alpha=1.0), 0.2, 4)
    assert all(np.array_equal(a, b) for a, b in zip(train + test, again[0] + again[1]))
    other = partition(labels, 13, part_cfg(kind, alpha=1.0), 0.2, 5)
    assert not all(np.array_equal(a, b) for a, b in zip(train, other[0]))


def test_iid_sizes_are_balanced():
    train, test = partition(np.zeros(103, int), 10, part_cfg("iid"), 0.0, 0)
    assert sorted(len(t) for t in train) == [10] * 7 + [11] * 3
    assert all(len(t) == 0 for t in test)


def test_dirichlet_skew_shrinks_with_alpha():
    labels = balanced_labels(200)

    def entropy(alpha):
        train, test = partition(labels, 20, part_cfg("dirichlet", alpha=alpha), 0.2, 0)
        ent = []
        for idx in (np.concatenate([a, b]) for a, b in zip(train, test)):
            p = np.bincount(labels[idx], minlength=10) / len(idx)
            p = p[p > 0]
            ent.append(-(p * np.log(p)).sum())
        return np.mean(ent)

    low, high = entropy(0.1), entropy(100.0)
    assert low < 1.0 < 2.0 < high <= np.log(10)


def test_dirichlet_errors():
    with pytest.raises(ScenarioError) as excinfo:
        partition(balanced_labels(1, 2), 50, part_cfg("dirichlet", alpha=0.5), 0.2, 0)
    assert str(excinfo.value).startswith(
        "data.num_clients = 50: expected a population Dirichlet(alpha=0.5) can fill: no draw in 1000 gave every "
        "client a sample (2 samples, 0.04 per client); set data.partition.min_size")
    with pytest.raises(ScenarioError, match=r"^data\.partition\.alpha = 0"):
        partition(balanced_labels(), 5, part_cfg("dirichlet", alpha=0), 0.2, 0)


def test_balanced_dirichlet_gives_every_client_the_same_rows_and_skews_their_labels():
    """FedACG's (and FedDyn's) balanced Dir(0.3) split of 100 clients: equal sizes, label skew like
    the per-class Dirichlet's, no sample twice; the same split for the same seed."""
    labels = np.random.default_rng(0).permutation(balanced_labels(503))  # 5,030 samples: 30 stay unused
    train, test = partition(labels, 100, part_cfg("balanced_dirichlet", alpha=0.3), 0.2, 0)
    assert {len(t) for t in train} == {40} and {len(t) for t in test} == {10}
    used = np.concatenate(train + test)
    assert len(used) == len(np.unique(used)) == 5000
    top = [np.bincount(labels[np.concatenate([a, b])], minlength=10).max() / 50 for a, b in zip(train, test)]
    assert np.mean(top) > 0.4  # iid clients would hold about 0.2 of their rows in their largest class
    again = partition(labels, 100, part_cfg("balanced_dirichlet", alpha=0.3), 0.2, 0)
    assert all(np.array_equal(a, b) for a, b in zip(train + test, again[0] + again[1]))
    iid_like = partition(labels, 100, part_cfg("balanced_dirichlet", alpha=1e4), 0.2, 0)
    top_iid = [np.bincount(labels[np.concatenate([a, b])], minlength=10).max() / 50 for a, b in zip(*iid_like)]
    assert np.mean(top_iid) < 0.3


def test_a_balanced_partition_without_a_training_and_a_test_row_per_client_is_refused():
    with pytest.raises(ScenarioError, match=r"^data\.num_clients = 400: expected at most 333 for the "
                                            r"balanced_dirichlet "
                                            r"partition of 1000 samples with data\.test_fraction 0\.2: each client "
                                            r"takes 1000 // num_clients samples and needs a training and a test row$"):
        partition(balanced_labels(), 400, part_cfg("balanced_dirichlet", alpha=0.3), 0.2, 0)  # 2 rows: no test row
    train, test = partition(balanced_labels(), 333, part_cfg("balanced_dirichlet", alpha=0.3), 0.2, 0)
    assert {len(t) for t in train} == {2} and {len(t) for t in test} == {1}


def test_shards_limit_classes_per_client():
    labels = balanced_labels(100)
    train, test = partition(labels, 50, part_cfg("shards", shards_per_client=2), 0.2, 1)
    assert np.array_equal(all_indices(train, test), np.arange(1000))
    classes = [len(np.unique(labels[np.concatenate([a, b])])) for a, b in zip(train, test)]
    assert max(classes) <= 2 and min(classes) >= 1
    assert all(len(a) + len(b) == 20 for a, b in zip(train, test))
    with pytest.raises(ScenarioError, match=r"^data\.partition\.shards_per_client = 30"):
        partition(labels, 50, part_cfg("shards", shards_per_client=30), 0.2, 1)


@pytest.mark.parametrize("diff_hetero", [False, True])
def test_pathological_matches_per_fedavg(diff_hetero):
    from sklearn.datasets import load_digits

    labels = load_digits().target
    cfg = part_cfg("pathological", per_class=10, test_per_class=4, diff_hetero=diff_hetero)
    train, test = partition(labels, 20, cfg, 0.3, 0)
    for u in range(20):
        tr = np.bincount(labels[train[u]], minlength=10)
        te = np.bincount(labels[test[u]], minlength=10)
        want_tr, want_te = np.zeros(10, int), np.zeros(10, int)
        if u < 10:
            want_tr[:5], want_te[:5] = 10, 4
        else:
            j = (u - 10) % 5
            want_tr[j], want_te[j] = (0, 0) if diff_hetero else (5, 2)
            want_tr[j + 5], want_te[j + 5] = 20, 8
        assert np.array_equal(tr, want_tr) and np.array_equal(te, want_te), u
    used = np.concatenate(train + test)
    assert len(np.unique(used)) == len(used), "drawn without replacement"
    assert not set(np.concatenate(train)) & set(np.concatenate(test)), "train and test pools are disjoint"
    ds = digits(20, cfg, 0.3, 0)
    assert_layout(ds)
    assert ds.train_sizes()[0] == 50 and ds.test_sizes()[0] == 20


def test_pathological_errors():
    labels = balanced_labels(50)
    with pytest.raises(ScenarioError) as excinfo:
        partition(labels, 20, part_cfg("pathological", per_class=10), 0.3, 0)
    msg = str(excinfo.value)
    assert msg.startswith("data.partition.per_class = 10")
    assert "needs 110 train" in msg and "35 are available" in msg
    with pytest.raises(ScenarioError, match=r"^data\.partition\.test_per_class = 4"):
        partition(labels, 20, part_cfg("pathological", per_class=1), 0.7, 0)
    with pytest.raises(ScenarioError, match=r"^data\.num_clients = 7: expected an even number"):
        partition(labels, 7, part_cfg("pathological"), 0.3, 0)


def test_partition_dispatch_errors():
    with pytest.raises(ScenarioError) as excinfo:
        partition(balanced_labels(), 4, part_cfg("bogus"), 0.2, 0)
    assert str(excinfo.value) == ("data.partition.kind = 'bogus': expected one of balanced_dirichlet, dirichlet, "
                                  "iid, pathological, shards")
    assert set(PARTITIONERS) == {"balanced_dirichlet", "dirichlet", "iid", "pathological", "shards"}
    with pytest.raises(ScenarioError, match=r"^data\.test_fraction = 1\.5"):
        partition(balanced_labels(), 4, part_cfg(), 1.5, 0)
    with pytest.raises(ScenarioError, match=r"^data\.num_clients = 2000"):
        partition(balanced_labels(), 2000, part_cfg("iid"), 0.2, 0)


# --- parquet ----------------------------------------------------------------------------------

def write_table(path, n=60, seed=0, with_split=True):
    rng = np.random.default_rng(seed)
    ids = np.array(["bob", "alice", "carol"])[np.arange(n) % 3]
    cols = {
        "who": ids,
        "f0": rng.normal(size=n),
        "f1": rng.normal(size=n).astype(np.float32),
        "f2": rng.integers(0, 5, n),
        "label": rng.integers(0, 4, n),
    }
    if with_split:
        cols["split"] = np.where(np.arange(n) % 4 == 0, "test", "train")
    pq.write_table(pa.table(cols), path)
    return cols


def test_parquet_round_trip_with_string_ids_and_split(tmp_path):
    path = tmp_path / "d.parquet"
    cols = write_table(path)
    ds = load_parquet(str(path), "label", "who", None, None, 0.5, 0)
    assert_layout(ds)
    assert ds.num_clients == 3 and ds.feature_shape == (3,) and ds.num_classes == cols["label"].max() + 1
    x, y, off = ds.features(), ds.labels(), ds.offsets()
    feats = np.stack([cols["f0"], cols["f1"], cols["f2"]], axis=1).astype(np.float32)
    for c, name in enumerate(["alice", "bob", "carol"]):  # sorted order of the original ids
        for part, (lo, hi) in (("train", (off[c, 0], off[c, 1])), ("test", (off[c, 1], off[c, 2]))):
            rows = np.flatnonzero((cols["who"] == name) & (cols["split"] == part))
            assert np.array_equal(x[lo:hi], feats[rows]), (name, part)  # file order kept
            assert np.array_equal(y[lo:hi], cols["label"][rows])
    chosen = load_parquet(str(path), "label", "who", ["f2", "f0"], None, 0.5, 0)
    assert np.array_equal(chosen.features()[:, 0], x[:, 2]) and chosen.num_features == 2


def test_parquet_directory_list_column_and_test_fraction(tmp_path):
    rng = np.random.default_rng(1)
    for i in range(2):
        n = 40
        x = rng.normal(size=(n, 4)).astype(np.float32)
        t = pa.table({"client_id": np.arange(n) % 4 + 10 * i,
                      "pixels": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4),
                      "label": rng.integers(0, 3, n)})
        pq.write_table(t, tmp_path / f"part{i}.parquet")
    ds = load_parquet(str(tmp_path), "label", "client_id", None, [1, 2, 2], 0.25, 7)
    assert_layout(ds)
    assert ds.num_clients == 8 and ds.feature_shape == (1, 2, 2)
    assert np.all(ds.train_sizes() == 8) and np.all(ds.test_sizes() == 2)
    again = load_parquet(str(tmp_path), "label", "client_id", None, [1, 2, 2], 0.25, 7)
    other = load_parquet(str(tmp_path), "label", "client_id", None, [1, 2, 2], 0.25, 8)
    assert again.table.equals(ds.table) and not other.table.equals(ds.table)
    built = build_dataset(data_cfg("parquet", path=str(tmp_path), test_fraction=0.25,
                                   image_shape=[1, 2, 2], num_clients=999), seed=7)
    assert built.table.equals(ds.table), "num_clients is ignored for parquet"


def test_parquet_errors(tmp_path):
    path = tmp_path / "d.parquet"
    write_table(path)

    def load(**kw):
        args = dict(path=str(path), label_column="label", client_column="who", feature_columns=None,
                    image_shape=None, test_fraction=0.2, seed=0)
        with pytest.raises(ScenarioError) as excinfo:
            load_parquet(**{**args, **kw})
        msg = str(excinfo.value)
        assert "\n" not in msg
        return msg

    assert load(path=str(tmp_path / "nope.parquet")).startswith("data.path = ")
    assert "an existing Parquet file or directory" in load(path=str(tmp_path / "nope.parquet"))
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    assert load(path=str(junk)).startswith("data.path = ")
    msg = load(label_column="target")
    assert msg.startswith("data.label_column = 'target'") and "who, f0, f1, f2, label, split" in msg
    assert load(client_column="user").startswith("data.client_column = 'user'")
    assert load(feature_columns=["f0", "f9"]).startswith("data.feature_columns")
    assert load(feature_columns=["f0", "who"]).startswith("data.feature_columns")
    assert load(image_shape=[2, 2]).startswith(
        "data.image_shape = [2, 2]: expected positive sizes whose product is 3")
    msg = load(label_column="f0")  # not integers: the file and the column are named
    assert msg.startswith(f"data.path = '{path}'") and "(column 'f0' holds values of type double)" in msg

    no_train = tmp_path / "no_train.parquet"
    pq.write_table(pa.table({"who": ["a", "a", "b"], "f": [1.0, 2.0, 3.0], "label": [0, 1, 0],
                             "split": ["train", "test", "test"]}), no_train)
    msg = load(path=str(no_train))
    assert msg.startswith("data.path = ") and "'b' has none" in msg
    bad_split = tmp_path / "bad_split.parquet"
    pq.write_table(pa.table({"who": [1], "f": [1.0], "label": [0], "split": ["val"]}), bad_split)
    assert "'split' column" in load(path=str(bad_split))


def test_library_does_not_import_ray():
    code = "import sys, raysim.data; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_blobs_are_split_by_the_partition_and_deterministic():
    iid = blobs(20, 2000, 8, 5, part_cfg(kind="iid"), 0.25, seed=1)
    assert iid.num_clients == 20 and iid.num_classes == 5 and iid.feature_shape == (8,)
    assert int(iid.train_sizes().sum() + iid.test_sizes().sum()) == 2000
    assert blobs(20, 2000, 8, 5, part_cfg(kind="iid"), 0.25, seed=1).table.equals(iid.table)
    skewed = blobs(20, 2000, 8, 5, part_cfg(kind="dirichlet", alpha=0.1), 0.25, seed=1)
    labels, offsets = skewed.labels(), skewed.offsets()
    classes = [len(np.unique(labels[offsets[k, 0]:offsets[k, 1]])) for k in range(20)]
    assert np.mean(classes) < 4  # Dirichlet(0.1): most clients see few of the 5 classes
    x = iid.features()
    assert 2.0 < float(np.linalg.norm(x, axis=1).mean()) < 5.0  # centres of norm 3 plus unit noise in 8 dims
    with pytest.raises(ScenarioError, match=r"^data\.num_samples = 10: expected an integer >= 20"):
        blobs(20, 10, 8, 5, part_cfg(kind="iid"), 0.25, seed=1)


def test_the_generated_kinds_the_schema_names_are_those_with_a_law():
    from raysim.data.generated import LAWS
    from raysim.data.kinds import DATASETS, GENERATED

    assert set(GENERATED) == set(LAWS) and set(GENERATED) <= set(DATASETS)
