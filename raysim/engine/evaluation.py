"""Global evaluation of the server model over every client's test rows (on the driver)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from raysim.algorithms.local_sgd import evaluate_rows
from raysim.engine.host import torch_threads


class GlobalEvaluator:
    """Sample-weighted test loss and accuracy over all clients' test rows."""

    def __init__(self, model, dataset, threads: int):
        offsets = dataset.offsets()
        rows = np.concatenate([np.arange(lo, hi) for _, lo, hi in offsets]) if len(offsets) else np.array([], int)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            features = torch.from_numpy(dataset.features())
            labels = torch.from_numpy(dataset.labels())
        index = torch.from_numpy(rows)
        self.features = features[index].reshape(-1, *dataset.feature_shape)
        self.labels = labels[index]
        self.model, self.threads = model, threads

    @property
    def num_rows(self) -> int:
        return int(self.labels.shape[0])

    def __call__(self, params: torch.Tensor) -> tuple[float, float]:
        """(test loss, test accuracy); NaN when no client has test rows."""
        if self.num_rows == 0:
            return float("nan"), float("nan")
        with torch_threads(self.threads):
            loss, correct = evaluate_rows(self.model, params, self.features, self.labels)
        return loss / self.num_rows, correct / self.num_rows
