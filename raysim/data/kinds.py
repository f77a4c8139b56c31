"""The built-in data kinds (``data.kind``), declared once: their lines in ``raysim list``, which of
them read the user's files (and what ``data.path`` must name), which are split over clients by
``data.partition``, which decide their clients themselves, and which are generated client by
client (and may be built on demand).

Torch-free and pyarrow-free: the scenario's schema and checks read these before any loader is
imported; :mod:`raysim.data.build` maps the names to the loaders and generators.
"""

from __future__ import annotations

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
    "leaf_synthetic": "Synthetic(alpha, beta) as FedProx generates it (generate_synthetic.py; LEAF's own synthetic "
                      "generator is another model) (keys: num_clients, alpha, beta, test_fraction)",
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

DATA_FILES: dict[str, str] = {  # data.kind -> what data.path must name
    "parquet": "Parquet file or directory",
    "leaf": "LEAF JSON file, directory of them, or directory with train/ and test/ of them",
    "mnist": "directory of the MNIST IDX files",
    "fashion_mnist": "directory of the Fashion-MNIST IDX files",
    "cifar10": "directory of the CIFAR-10 binary batches",
    "cifar100": "directory of the CIFAR-100 binary files",
}
PARTITIONED_FILES = ("mnist", "fashion_mnist", "cifar10", "cifar100")  # centralized sets that data.partition splits
CLIENTS_FROM_FILES = ("parquet", "leaf")  # kinds whose files decide the clients (data.num_clients is refused):
# their client counts are checked by raysim.scenario.validate.check_data_set once the data set is read
GENERATED = ("gaussian_mixture", "leaf_synthetic", "saddle", "synthetic_images")  # a law each: data.generated.LAWS
