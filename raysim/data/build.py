"""Building the data set a scenario's ``data`` section names (:data:`raysim.data.kinds.DATASETS`, or a
user's ``package.module:function``), and opening one from the Arrow table it travels as."""

from __future__ import annotations

import numpy as np

from raysim.data.cifar import CIFAR_FORMATS, load_cifar
from raysim.data.federated import FederatedDataset
from raysim.data.generated import LAWS, ON_DEMAND_ABOVE, GeneratedDataset
from raysim.data.generators import blobs, digits
from raysim.data.idx import load_mnist
from raysim.data.kinds import DATASETS
from raysim.data.leaf import load_leaf
from raysim.data.parquet import load_parquet
from raysim.data.sizes import table_bytes
from raysim.errors import ScenarioError
from raysim.importing import call_imported


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
