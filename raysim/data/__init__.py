"""Federated datasets (one Arrow table per dataset, or a generator's law whose rows are built per
client on demand) and the builders behind ``data.kind``.

Importing this package does not import torch (only the quadratic problem needs it, and it is
loaded on first use), so a scenario's data can be built and checked while torch still loads.
"""

from __future__ import annotations

import numpy as np

from raysim.data.cifar import CIFAR_FORMATS, load_cifar
from raysim.data.federated import ClientRows, FederatedDataset
from raysim.data.files import DATA_FILES
from raysim.data.generated import LAWS, ON_DEMAND_ABOVE, GeneratedDataset, gaussian_mixture, leaf_synthetic, saddle
from raysim.data.generators import blobs, digits
from raysim.data.idx import load_mnist
from raysim.data.leaf import load_leaf
from raysim.data.parquet import load_parquet
from raysim.data.partition import PARTITIONERS, partition
from raysim.data.sizes import table_bytes
from raysim.errors import ScenarioError
from raysim.importing import call_imported

__all__ = ["DATASETS", "DATA_FILES", "PARTITIONERS", "ClientRows", "FederatedDataset", "GeneratedDataset",
           "QuadraticProblem", "blobs", "build_dataset", "builds_on_demand", "digits", "gaussian_mixture",
           "generate_quadratic", "leaf_synthetic", "load_cifar", "load_leaf", "load_mnist", "load_parquet",
           "open_dataset", "partition", "saddle"]

DATASETS: dict[str, str] = {
    "blobs": "synthetic Gaussian clusters (two per class, centres of norm 3, unit noise) split over clients "
             "(keys: num_clients, num_samples, num_features, num_classes, test_fraction, partition.*)",
    "cifar10": "CIFAR-10 binary batches in data.path, pooled and split over clients like digits "
               "(keys: path, num_clients, test_fraction, partition.*)",
    "cifar100": "CIFAR-100 binary train.bin and test.bin in data.path (fine labels), pooled and split over clients "
                "like digits (keys: path, num_clients, test_fraction, partition.*)",
    "digits": "scikit-learn 8x8 digits split over clients (keys: num_clients, test_fraction, partition.*, "
              "feature_shift, concept_shift)",
    "fashion_mnist": "Fashion-MNIST IDX files in data.path, pooled and split over clients like digits "
                     "(keys: path, num_clients, test_fraction, partition.*)",
    "gaussian_mixture": "10-class Gaussian mixture with per-client shift and label skew, "
                        "10 test rows per client (keys: num_clients)",
    "leaf": "LEAF JSON (FEMNIST, Shakespeare, Synthetic) in data.path, one client per user; LEAF's train/ and "
            "test/ split, or test_fraction of each user's rows (keys: path, test_fraction)",
    "leaf_synthetic": "LEAF/FedProx Synthetic(alpha, beta) (keys: num_clients, alpha, beta, test_fraction)",
    "mnist": "MNIST IDX files in data.path, pooled and split over clients like digits "
             "(keys: path, num_clients, test_fraction, partition.*)",
    "parquet": "rows of a Parquet file or directory; the file decides the clients "
               "(keys: path, label_column, client_column, feature_columns, image_shape, test_fraction)",
    "quadratic": "the FFGG paper's partially personalised quadratic, f_m = ½‖H_mθ − b_m‖² + ½‖A_mθ + B_mw − y_m‖² "
                 "(keys: num_clients, n, d_theta, d_w, realizable; use model.kind=quadratic)",
    "saddle": "the strict-saddle problem of the second-order-guarantees paper: labels ±1 and features "
              "h = ±m_k·u + N(0, I) per client, m_k ~ U[0.5, 1.5] (keys: num_clients, samples_per_client, dim, "
              "test_fraction; use model.kind=bilinear)",
    "synthetic_images": "images of one smooth prototype per class plus noise and a per-client brightness shift, "
                        "in place of a downloaded image set (keys: num_clients, samples_per_client, image_shape "
                        "[default 3x32x32], num_classes, test_fraction; use model.kind=cnn)",
}


def open_dataset(table):
    """The data set an Arrow table holds: a QuadraticProblem (schema kind 'quadratic'), a
    GeneratedDataset (kind 'generated') or a FederatedDataset."""
    meta = table.schema.metadata or {}
    if meta.get(b"kind") == b"quadratic":
        from raysim.data.quadratic import QuadraticProblem

        return QuadraticProblem.from_table(table)
    if meta.get(b"kind") == b"generated":
        return GeneratedDataset(table)
    return FederatedDataset(table)


def __getattr__(name: str):
    """``QuadraticProblem`` and ``generate_quadratic``, imported (with torch) on first use."""
    if name in ("QuadraticProblem", "generate_quadratic"):
        from raysim.data import quadratic

        return getattr(quadratic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_dataset(data_cfg, seed: int):
    """Build the dataset that ``data_cfg.kind`` names (see ``DATASETS``) with ``seed``.

    ``kind`` may also be ``package.module:function``: it is called with ``num_clients``,
    ``test_fraction``, ``seed`` and the keyword arguments ``data.options``.

    ``num_clients`` is the number of clients to generate or split into, except for ``parquet``
    and ``leaf``, where it is ignored: the file's client column, or LEAF's users, decide. ``gaussian_mixture`` ignores
    ``test_fraction`` (it always holds out 10 rows per client).
    """
    kind = data_cfg.kind
    if ":" in kind:
        return _custom(data_cfg, seed)
    law = _law(data_cfg, seed)
    if law is not None:
        dataset = GeneratedDataset.create(law, data_cfg.num_clients, data_cfg.cache_mb)
        return dataset if builds_on_demand(data_cfg) else dataset.materialize()
    if kind == "blobs":
        return blobs(data_cfg.num_clients, data_cfg.num_samples, data_cfg.num_features, data_cfg.num_classes,
                     data_cfg.partition, data_cfg.test_fraction, seed)
    if kind == "digits":
        return digits(data_cfg.num_clients, data_cfg.partition, data_cfg.test_fraction, seed,
                      feature_shift=data_cfg.feature_shift, concept_shift=data_cfg.concept_shift)
    if kind == "quadratic":
        from raysim.data.quadratic import OnDemandQuadratic, QuadraticLaw, generate_quadratic

        if builds_on_demand(data_cfg):
            law = QuadraticLaw(seed, data_cfg.n, data_cfg.d_theta, data_cfg.d_w, data_cfg.realizable)
            return OnDemandQuadratic(law, data_cfg.num_clients, int(data_cfg.cache_mb * 2 ** 20))
        return generate_quadratic(data_cfg.num_clients, data_cfg.n, data_cfg.d_theta, data_cfg.d_w, seed,
                                  realizable=data_cfg.realizable)
    if kind == "parquet":
        feature_columns, image_shape = data_cfg.feature_columns, data_cfg.image_shape
        return load_parquet(data_cfg.path, data_cfg.label_column, data_cfg.client_column,
                            None if feature_columns is None else list(feature_columns),
                            None if image_shape is None else list(image_shape),
                            data_cfg.test_fraction, seed)
    if kind == "leaf":
        return load_leaf(data_cfg.path, data_cfg.test_fraction, seed)
    if kind in ("mnist", "fashion_mnist"):
        return load_mnist(data_cfg.path, data_cfg.num_clients, data_cfg.partition, data_cfg.test_fraction, seed)
    if kind in CIFAR_FORMATS:
        return load_cifar(data_cfg.path, CIFAR_FORMATS[kind], data_cfg.num_clients,
                          data_cfg.partition, data_cfg.test_fraction, seed)
    raise ScenarioError("data.kind", kind, "one of " + ", ".join(sorted(DATASETS)))


def _law(data_cfg, seed: int):
    """The law of a generated ``data.kind`` that builds one client at a time, or None."""
    law = LAWS.get(data_cfg.kind)
    return None if law is None else law.from_config(data_cfg, seed)


def builds_on_demand(data_cfg) -> bool:
    """Whether a generated data set builds each client's data on demand (``data.on_demand``; auto:
    when the whole table would exceed :data:`~raysim.data.generated.ON_DEMAND_ABOVE` bytes)."""
    if data_cfg.kind not in LAWS and data_cfg.kind != "quadratic":
        return False
    if data_cfg.on_demand == "auto":
        return table_bytes(data_cfg) > ON_DEMAND_ABOVE
    return bool(data_cfg.on_demand)


def _custom(data_cfg, seed: int) -> FederatedDataset:
    """A user's ``package.module:function(num_clients=, test_fraction=, seed=, **data.options)``."""
    what = "a function returning a raysim.data.FederatedDataset"
    options = dict(getattr(data_cfg, "options", None) or {})
    dataset = call_imported("data.kind", data_cfg.kind, what, num_clients=data_cfg.num_clients,
                            test_fraction=data_cfg.test_fraction, seed=seed, **options)
    if not isinstance(dataset, FederatedDataset):
        raise ScenarioError("data.kind", data_cfg.kind, f"{what} (it returned {type(dataset).__name__})")
    if dataset.num_clients != data_cfg.num_clients:
        raise ScenarioError("data.kind", data_cfg.kind, f"{what} of data.num_clients={data_cfg.num_clients} "
                                                        f"clients (it returned {dataset.num_clients})")
    finite = np.isfinite(dataset.features()).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        client = int(np.searchsorted(dataset.offsets()[:, 2], row, side="right"))
        raise ScenarioError("data.kind", data_cfg.kind, f"{what} with finite features (client {client}'s row "
                                                        f"{row - int(dataset.offsets()[client, 0])} is not)")
    return dataset
