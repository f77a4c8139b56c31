"""Built-in federated datasets: synthetic benchmarks and scikit-learn's digits."""

from __future__ import annotations

import numbers

import numpy as np

from raysim.data._checks import check_count, check_num_clients, check_test_fraction, test_rows_beside
from raysim.data.federated import FederatedDataset
from raysim.data.partition import partition
from raysim.errors import ScenarioError
from raysim.streams import STREAMS_AT_ONCE, Purpose, keyed_streams, stream, streams

_DIM, _CLASSES = 60, 10
_GM_TRAIN, _GM_STEP, _GM_SPREAD, _GM_TEST = 50, 37, 151, 10  # gaussian_mixture client k: 50 + (37 k mod 151) train rows
LEAF_MEAN_ROWS = 50 + float(np.exp(4.0 + 2.0 ** 2 / 2))  # leaf_synthetic: E[int(lognormal(4, 2))] + 50, about 453
DIGITS_ROWS, DIGITS_SHAPE = 1797, (1, 8, 8)  # scikit-learn's digits
IMAGE_SHAPE = (3, 32, 32)  # synthetic_images' default: CIFAR-sized
_IMAGE_SIGNAL = 0.2  # synthetic_images: standard deviation of the class prototypes' pixels (the noise's is 1)


def gaussian_mixture_rows(num_clients: int) -> int:
    """Rows (train and test) of ``gaussian_mixture(num_clients, ·)``, without generating them (37 and
    the prime 151 are coprime, so every 151 consecutive clients add 0 + 1 + … + 150 rows to the base)."""
    cycles, rest = divmod(num_clients, _GM_SPREAD)
    spread = cycles * (_GM_SPREAD * (_GM_SPREAD - 1) // 2) + int((_GM_STEP * np.arange(rest) % _GM_SPREAD).sum())
    return num_clients * (_GM_TRAIN + _GM_TEST) + spread


class GaussianMixtureLaw:
    """Gaussian-mixture benchmark: 10 classes in 60 dimensions, shifted and label-skewed per client.

    Class means ``mu ~ N(0, 0.3^2)`` of shape ``(10, 60)`` from the stream
    ``Purpose.GAUSSIAN_MIXTURE_MEANS`` (see :mod:`raysim.streams`). Client ``k`` has
    ``n_k = 50 + (37 k mod 151)`` training and 10 test rows and draws from ``default_rng([seed, k])``,
    in order: a shift ``s ~ N(0, 0.5^2 I)``, label mixture ``p ~ Dirichlet(0.5 * 1)``, ``n_k + 10``
    labels ``y ~ p`` and ``x = mu_y + s + N(0, I)`` (summed in that order in float64, then float32).
    """

    name, num_classes, feature_shape = "gaussian_mixture", _CLASSES, (_DIM,)

    def __init__(self, seed: int):
        self.seed, self.params = int(seed), {}
        self.means = stream(seed, Purpose.GAUSSIAN_MIXTURE_MEANS).normal(0.0, 0.3, size=(_CLASSES, _DIM))

    @classmethod
    def from_config(cls, data_cfg, seed: int) -> GaussianMixtureLaw:
        """The law of the scenario's ``data`` keys."""
        return cls(seed)

    @staticmethod
    def sizes(num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, test) rows of every client, in closed form."""
        train = _GM_TRAIN + (_GM_STEP * np.arange(check_num_clients(num_clients), dtype=np.int64)) % _GM_SPREAD
        return train, np.full(num_clients, _GM_TEST, dtype=np.int64)

    def client_streams(self, clients) -> list:
        """The stream of each client: ``default_rng([seed, k])``."""
        return keyed_streams(self.seed, clients)

    def rows(self, k: int, n_train: int, n_test: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Client ``k``'s rows, train then test, drawn from its stream ``rng``."""
        n = n_train + n_test
        shifted = self.means + rng.normal(0.0, 0.5, size=_DIM)  # mu_y + s for every class y
        # rng.choice(_CLASSES, size=n, p=p) without its checks of p (a Dirichlet draw always passes
        # them): the same uniforms and the same inverse-CDF search, so the same labels
        cdf = rng.dirichlet(np.full(_CLASSES, 0.5)).cumsum()
        cdf /= cdf[-1]
        labels = cdf.searchsorted(rng.random(n), side="right")
        x = np.empty((n, _DIM), dtype=np.float32)  # the float64 sum, rounded once to float32
        np.add(shifted[labels], rng.standard_normal((n, _DIM)), out=x, casting="unsafe")  # normal(0, 1): 0 + 1·z is z
        return x, labels.astype(np.int64, copy=False)


class LeafSyntheticLaw:
    """FedProx's Synthetic(alpha, beta): per-client softmax-regression data, 60 features, 10 classes,
    as FedProx's generate_synthetic.py draws it (alpha and beta are standard deviations). The kind
    keeps the name leaf_synthetic, but LEAF's own data_generator.py is a different model.

    Client ``k`` draws from the stream ``(Purpose.LEAF_SYNTHETIC, k)``, in order: ``n_k = int(lognormal(4, 2)) + 50``,
    ``u_k ~ N(0, alpha²)``, ``B_k ~ N(0, beta²)``, then (non-IID) ``W_k`` (10x60) and ``b_k ~ N(u_k, 1)``,
    ``v_k ~ N(B_k, 1)``, and ``x ~ N(v_k, diag(j^-1.2))``, ``y = argmax(W_k x + b_k)``. The IID variant
    (``iid``) uses one ``W``, ``b ~ N(0, 1)`` drawn from the stream ``(Purpose.LEAF_SYNTHETIC,)`` for every
    client and ``v_k = B_k·1``. The first ``max(1, n_k - round(test_fraction n_k))`` rows train.
    """

    name, num_classes, feature_shape = "leaf_synthetic", _CLASSES, (_DIM,)

    def __init__(self, seed: int, alpha: float, beta: float, test_fraction: float, iid: bool = False):
        for key, value in (("data.alpha", alpha), ("data.beta", beta)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
                raise ScenarioError(key, value, "a standard deviation >= 0")
        self.seed = int(seed)
        self.params = {"alpha": float(alpha), "beta": float(beta), "test_fraction": check_test_fraction(test_fraction),
                       "iid": bool(iid)}
        self.shared = None
        if iid:
            rng = stream(self.seed, Purpose.LEAF_SYNTHETIC)
            self.shared = rng.normal(0.0, 1.0, size=(_CLASSES, _DIM)), rng.normal(0.0, 1.0, size=_CLASSES)

    @classmethod
    def from_config(cls, data_cfg, seed: int) -> LeafSyntheticLaw:
        """The law of the scenario's ``data`` keys."""
        return cls(seed, data_cfg.alpha, data_cfg.beta, data_cfg.test_fraction, data_cfg.iid)

    def client_streams(self, clients) -> list:
        """The stream of each client: ``(Purpose.LEAF_SYNTHETIC, k)``."""
        return streams(self.seed, Purpose.LEAF_SYNTHETIC, np.asarray(clients, dtype=np.int64).reshape(-1, 1))

    def sizes(self, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, test) rows of every client (the first draw of each client's stream)."""
        num_clients = check_num_clients(num_clients)
        n = np.empty(num_clients, dtype=np.int64)
        for start in range(0, num_clients, STREAMS_AT_ONCE):
            clients = np.arange(start, min(num_clients, start + STREAMS_AT_ONCE))
            n[clients] = [int(rng.lognormal(4.0, 2.0)) + 50 for rng in self.client_streams(clients)]
        train = np.maximum(1, n - np.array([round(self.params["test_fraction"] * v) for v in n.tolist()], np.int64))
        return train, n - train

    def rows(self, k: int, n_train: int, n_test: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Client ``k``'s rows, train then test, drawn from its stream ``rng``."""
        n = int(rng.lognormal(4.0, 2.0)) + 50
        u = rng.normal(0.0, self.params["alpha"])
        b_mean = rng.normal(0.0, self.params["beta"])
        if self.shared is None:
            w = rng.normal(u, 1.0, size=(_CLASSES, _DIM))
            b = rng.normal(u, 1.0, size=_CLASSES)
            v = rng.normal(b_mean, 1.0, size=_DIM)
        else:
            (w, b), v = self.shared, np.full(_DIM, b_mean)
        x = v + rng.normal(0.0, 1.0, size=(n, _DIM)) * _LEAF_STD_X
        return x.astype(np.float32), np.argmax(x @ w.T + b, axis=1).astype(np.int64)


_LEAF_STD_X = np.arange(1, _DIM + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2


class SyntheticImagesLaw:
    """Synthetic images in place of a downloaded image data set (CIFAR-sized by default): one smooth
    prototype per class, and per client a brightness shift and i.i.d. labels.

    The prototypes come from the stream ``Purpose.SYNTHETIC_IMAGES``: for each class a ``[C, 4, 4]``
    draw of ``N(0, 0.2^2)`` (a faint signal that thousands of pixels add up), blown up to
    ``[C, H, W]`` by repeating each value over a block of pixels (``H`` and ``W`` are multiples of
    4). Client ``k`` draws from the stream ``(Purpose.SYNTHETIC_IMAGES, k)``, in order: a shift
    ``s ~ N(0, 0.2^2)``, labels uniform over the classes, then ``x = prototype_y + s + N(0, 1)`` per
    pixel. ``samples_per_client`` rows train and :func:`~raysim.data._checks.test_rows_beside` more test.
    """

    name = "synthetic_images"

    def __init__(self, seed: int, samples_per_client: int, image_shape, num_classes: int, test_fraction: float):
        shape = tuple(int(v) for v in image_shape)
        if len(shape) != 3 or any(v < 1 for v in shape) or shape[1] % 4 or shape[2] % 4:
            raise ScenarioError("data.image_shape", list(image_shape), "[channels, height, width] with height and "
                                                                       "width multiples of 4")
        self.seed, self.feature_shape = int(seed), shape
        self.num_classes = check_count("data.num_classes", num_classes, 2)
        self.params = {"samples_per_client": check_count("data.samples_per_client", samples_per_client, 1),
                       "image_shape": list(shape), "num_classes": self.num_classes,
                       "test_fraction": check_test_fraction(test_fraction)}
        self.test_rows = test_rows_beside(samples_per_client, test_fraction)
        coarse = stream(seed, Purpose.SYNTHETIC_IMAGES).normal(0.0, _IMAGE_SIGNAL,
                                                               size=(self.num_classes, shape[0], 4, 4))
        self.prototypes = np.kron(coarse, np.ones((1, 1, shape[1] // 4, shape[2] // 4))).reshape(self.num_classes, -1)

    @classmethod
    def from_config(cls, data_cfg, seed: int) -> SyntheticImagesLaw:
        """The law of the scenario's ``data`` keys (``image_shape`` null: :data:`IMAGE_SHAPE`)."""
        return cls(seed, data_cfg.samples_per_client, data_cfg.image_shape or IMAGE_SHAPE, data_cfg.num_classes,
                   data_cfg.test_fraction)

    def sizes(self, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """(train, test) rows of every client."""
        num_clients = check_num_clients(num_clients)
        return (np.full(num_clients, self.params["samples_per_client"], dtype=np.int64),
                np.full(num_clients, self.test_rows, dtype=np.int64))

    def client_streams(self, clients) -> list:
        """The stream of each client: ``(Purpose.SYNTHETIC_IMAGES, k)``."""
        return streams(self.seed, Purpose.SYNTHETIC_IMAGES, np.asarray(clients, dtype=np.int64).reshape(-1, 1))

    def rows(self, k: int, n_train: int, n_test: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Client ``k``'s rows, train then test (flattened images), drawn from its stream ``rng``."""
        n = n_train + n_test
        shift = rng.normal(0.0, 0.2)
        labels = rng.integers(0, self.num_classes, size=n)
        x = self.prototypes[labels] + shift + rng.standard_normal((n, self.prototypes.shape[1]))
        return x.astype(np.float32), labels.astype(np.int64)


def _digits_writer_style(seed: int, k: int) -> tuple[float, float, int, int]:
    """Client ``k``'s feature shift: gain ``g ~ U[0.6, 1.4]``, offset ``o ~ U[-0.2, 0.2]`` and a
    translation ``dy, dx`` each uniform in ``{-1, 0, 1}``, drawn in that order from
    the stream ``(Purpose.DIGITS_STYLE, k)``."""
    rng = stream(seed, Purpose.DIGITS_STYLE, k)
    gain = float(rng.uniform(0.6, 1.4))
    offset = float(rng.uniform(-0.2, 0.2))
    dy, dx = (int(v) for v in rng.integers(-1, 2, size=2))
    return gain, offset, dy, dx


def _digits_writer_labels(seed: int, k: int) -> np.ndarray:
    """Client ``k``'s concept shift: a permutation ``pi`` of the 10 labels (``y' = pi[y]``),
    drawn from the stream ``(Purpose.DIGITS_LABELS, k)``."""
    return stream(seed, Purpose.DIGITS_LABELS, k).permutation(10)


def _translate(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Move ``[n, H, W]`` images by ``dy`` rows and ``dx`` columns (``out[r, c] = in[r - dy, c - dx]``),
    filling the vacated border with 0 instead of wrapping around."""
    out = np.zeros_like(images)
    h, w = images.shape[1:]
    out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        images[:, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def _apply_writer_style(x: np.ndarray, seed: int, k: int) -> np.ndarray:
    """``g * translate(x, dy, dx) + o`` on client ``k``'s flattened 8x8 images, as float32."""
    gain, offset, dy, dx = _digits_writer_style(seed, k)
    moved = _translate(x.reshape(-1, 8, 8), dy, dx).reshape(x.shape)
    return (gain * moved.astype(np.float64) + offset).astype(np.float32)


def digits(num_clients: int, partition_cfg, test_fraction: float, seed: int, *,
           feature_shift: bool = False, concept_shift: bool = False) -> FederatedDataset:
    """scikit-learn's 8x8 digits (1797 images, pixels scaled to [0, 1]) split by ``partition_cfg``.

    Features have shape ``(1, 8, 8)``; see ``raysim.data.partition.partition`` for the config.
    The optional per-client ("writer") shifts are applied after partitioning, to the train and
    test rows of each client alike, so the split itself does not change:

    - ``feature_shift``: client ``k``'s scaled images become ``g * translate(x, dy, dx) + o``
      (see ``_digits_writer_style``; the translation zero-fills the vacated border).
    - ``concept_shift``: client ``k``'s labels become ``pi_k[y]`` (see ``_digits_writer_labels``).
    """
    from sklearn.datasets import load_digits

    for key, value in (("data.feature_shift", feature_shift), ("data.concept_shift", concept_shift)):
        if not isinstance(value, (bool, np.bool_)):
            raise ScenarioError(key, value, "true or false")
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    train, test = partition(y, num_clients, partition_cfg, test_fraction, seed)
    train_x, train_y = [x[i] for i in train], [y[i] for i in train]
    test_x, test_y = [x[i] for i in test], [y[i] for i in test]
    for k in range(len(train)):
        if feature_shift:
            train_x[k] = _apply_writer_style(train_x[k], seed, k)
            test_x[k] = _apply_writer_style(test_x[k], seed, k)
        if concept_shift:
            pi = _digits_writer_labels(seed, k)
            train_y[k], test_y[k] = pi[train_y[k]], pi[test_y[k]]
    return FederatedDataset.from_clients(train_x, train_y, test_x, test_y, 10, DIGITS_SHAPE)


def blobs(num_clients: int, num_samples: int, num_features: int, num_classes: int, partition_cfg,
          test_fraction: float, seed: int) -> FederatedDataset:
    """A centralized synthetic classification set split over clients by ``partition_cfg`` (the
    stand-in for CIFAR-sized data in the FedACG reproductions).

    From the stream ``Purpose.BLOBS``, in order: two cluster centres per class, each a random
    direction scaled to norm 3 (``num_classes × 2 × num_features``), then ``num_samples`` labels
    uniform over the classes, a cluster (0 or 1) per sample and ``x = centre + N(0, I)``.
    """
    for key, value, low in (("data.num_samples", num_samples, num_clients),
                            ("data.num_features", num_features, 1), ("data.num_classes", num_classes, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ScenarioError(key, value, f"an integer >= {low}")
    rng = stream(seed, Purpose.BLOBS)
    centres = rng.normal(size=(num_classes, 2, num_features))
    centres *= 3.0 / np.linalg.norm(centres, axis=2, keepdims=True)
    y = rng.integers(0, num_classes, num_samples)
    cluster = rng.integers(0, 2, num_samples)
    x = (centres[y, cluster] + rng.normal(size=(num_samples, num_features))).astype(np.float32)
    train, test = partition(y, num_clients, partition_cfg, test_fraction, seed)
    return FederatedDataset.from_clients([x[i] for i in train], [y[i] for i in train],
                                         [x[i] for i in test], [y[i] for i in test], num_classes, (num_features,))
