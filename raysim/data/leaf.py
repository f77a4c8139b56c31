"""LEAF's JSON data sets (FEMNIST, Shakespeare, Synthetic): one client per user (writer, speaker).

A LEAF file is a JSON object ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
"y": [...]}}}``. The task is told from the rows: FEMNIST's are 784 pixels (images ``[1, 28, 28]``, 62
classes); Shakespeare's are 80-character strings whose label is the next character (both become
indices in :data:`VOCABULARY`, 80 classes); any other numeric vectors (Synthetic's 60) are features as
they are, with classes = largest label + 1.
"""

from __future__ import annotations

import json
import os
from glob import escape, glob

import numpy as np

from raysim.data._checks import check_test_fraction
from raysim.data.federated import FederatedDataset, client_order
from raysim.data.parquet import MAX_CLASSES
from raysim.data.partition import split_train_test
from raysim.errors import ScenarioError
from raysim.streams import Purpose, stream

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"  # LEAF Shakespeare
SHAKESPEARE_LENGTH = 80  # characters per row
FEMNIST_PIXELS, FEMNIST_SHAPE, FEMNIST_CLASSES = 784, (1, 28, 28), 62
_CHARACTER_INDEX = np.full(128, -1, dtype=np.int64)  # code point -> index in VOCABULARY (-1: not in it)
_CHARACTER_INDEX[[ord(c) for c in VOCABULARY]] = np.arange(len(VOCABULARY))

Rows = tuple[np.ndarray, np.ndarray]  # features float32 [n, D], labels int64 [n]


def _bad(path: str, allowed: str) -> ScenarioError:
    return ScenarioError("data.path", path, allowed)


def leaf_files(path: str) -> tuple[list[str], list[str] | None]:
    """(training files, test files) of ``path``: a directory with ``train/`` and ``test/`` (LEAF's own
    split), else a JSON file or a directory of them (test files None), each list sorted."""
    def json_files(directory: str) -> list[str]:
        files = sorted(glob(os.path.join(escape(directory), "*.json")))
        if not files:
            raise _bad(directory, "a directory holding LEAF .json files")
        return files

    if has_own_split(path):
        return json_files(os.path.join(path, "train")), json_files(os.path.join(path, "test"))
    return (json_files(path) if os.path.isdir(path) else [path]), None


def has_own_split(path: str) -> bool:
    """Whether ``path`` is a directory with LEAF's ``train/`` and ``test/`` (whose split is kept)."""
    return all(os.path.isdir(os.path.join(path, part)) for part in ("train", "test"))


def read_leaf_file(path: str) -> dict[str, tuple[list, list]]:
    """``{user: (x, y)}`` of one LEAF JSON file, in the order of its ``users`` list."""
    what = "LEAF JSON: an object with users, num_samples and user_data"
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"{what} ({' '.join(str(exc).split())})") from None
    except RecursionError:  # arrays or objects nested deeper than Python's JSON reader goes
        raise _bad(path, f"{what} (arrays and objects nested less deeply: they nest deeper than Python's JSON "
                         "reader follows)") from None
    if not isinstance(content, dict) or not {"users", "user_data"} <= content.keys():
        found = sorted(content) if isinstance(content, dict) else type(content).__name__
        raise _bad(path, f"{what} (found {found})")
    users, user_data = content["users"], content["user_data"]
    if not isinstance(users, list) or not isinstance(user_data, dict):
        raise _bad(path, f"{what} (users must be a list and user_data an object)")
    rows = {}
    for user in users:
        entry = user_data.get(user) if isinstance(user, str) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"), list) \
                or len(entry["x"]) != len(entry["y"]):
            raise _bad(path, f"{what} (user {user!r} needs user_data with lists x and y of one length)")
        rows[user] = (entry["x"], entry["y"])
    num_samples = content.get("num_samples", [len(x) for x, _ in rows.values()])
    if num_samples != [len(x) for x, _ in rows.values()]:
        raise _bad(path, f"{what} (num_samples {_short(num_samples)} does not match the users' rows "
                         f"{_short([len(x) for x, _ in rows.values()])})")
    return rows


def _short(values) -> str:
    """A list shown in at most a few entries."""
    if not isinstance(values, list) or len(values) <= 6:
        return repr(values)
    return "[" + ", ".join(map(repr, values[:6])) + ", …]"


def task_of(x, path: str, user: str) -> str:
    """'shakespeare', 'femnist' or 'vector', told from a row of features (a string or a list)."""
    if isinstance(x, str):
        return "shakespeare"
    if not isinstance(x, list):
        raise _bad(path, f"LEAF rows that are strings or lists of numbers (user {user!r} has {_short(x)})")
    return "femnist" if len(x) == FEMNIST_PIXELS else "vector"


def _integers(y: list, path: str, user: str) -> np.ndarray:
    try:
        labels = np.asarray(y)
    except (TypeError, ValueError):  # lists of unequal lengths, or nested past numpy's dimensions
        labels = None
    if labels is None or len(y) and (labels.dtype.kind not in "iu" or labels.ndim != 1):
        raise _bad(path, f"one integer label per row (user {user!r} has {_short(y)})")
    return labels.astype(np.int64)


def _characters(rows: list, length: int, path: str, user: str) -> np.ndarray:
    """Indices ``[len(rows), length]`` in :data:`VOCABULARY` of strings of ``length`` characters each."""
    if not all(isinstance(s, str) and len(s) == length for s in rows):
        bad = next(s for s in rows if not isinstance(s, str) or len(s) != length)
        raise _bad(path, f"LEAF Shakespeare rows of {length} character(s) (user {user!r} has {_short(bad)})")
    codes = np.frombuffer("".join(rows).encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
    index = np.where(codes < len(_CHARACTER_INDEX), _CHARACTER_INDEX[np.minimum(codes, len(_CHARACTER_INDEX) - 1)], -1)
    if (index < 0).any():
        char = chr(int(codes[np.argmax(index < 0)]))
        raise _bad(path, f"characters of LEAF's Shakespeare vocabulary (user {user!r} has {char!r})")
    return index.reshape(len(rows), length)


def convert(task: str, x: list, y: list, width: int, path: str, user: str) -> Rows:
    """One user's rows as arrays (see the module doc); ``width`` is the features per row."""
    if task == "shakespeare":
        return (_characters(x, SHAKESPEARE_LENGTH, path, user).astype(np.float32),
                _characters(y, 1, path, user).reshape(-1))
    try:
        features = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError):
        features = None
    if features is None or features.ndim != 2 or features.shape[1] != width:
        raise _bad(path, f"rows of {width} numbers each, as the first user's (user {user!r} differs)")
    if not np.isfinite(features).all():
        raise _bad(path, f"finite feature values (user {user!r} has some that are not)")
    labels = _integers(y, path, user)
    classes = FEMNIST_CLASSES if task == "femnist" else MAX_CLASSES
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise _bad(path, f"labels in [0, {classes - 1}] (user {user!r} has labels from {labels.min()} to "
                         f"{labels.max()})")
    return features, labels


class _Reader:
    """Reads LEAF files into ``{user: rows}``; the first row read fixes the task and the row width."""

    def __init__(self):
        self.task, self.width, self.file_of = None, 0, {}

    def read(self, files: list[str]) -> dict[str, Rows]:
        """Every user's rows in ``files`` (a user found in several files: its rows in file order)."""
        parts: dict[str, list[Rows]] = {}
        for path in files:
            for user, (x, y) in read_leaf_file(path).items():
                self.file_of.setdefault(user, path)
                parts.setdefault(user, [])
                if not x:
                    continue
                task = task_of(x[0], path, user)
                if self.task is None:
                    self.task = task
                    self.width = SHAKESPEARE_LENGTH if task == "shakespeare" else len(x[0])
                if task != self.task:
                    raise _bad(path, f"rows of one LEAF task ({self.task}, as the first user's; user {user!r} "
                                     f"has {task} rows)")
                parts[user].append(convert(task, x, y, self.width, path, user))
        return {user: self.joined(p) for user, p in parts.items()}

    def joined(self, parts: list[Rows]) -> Rows:
        """One user's parts as one pair of arrays (none: no rows of the task's width)."""
        if not parts:
            return np.empty((0, self.width), np.float32), np.empty(0, np.int64)
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def load_leaf(path: str, test_fraction: float, seed: int) -> FederatedDataset:
    """A LEAF data set at ``path`` (see :func:`leaf_files`), one client per user in sorted order of
    the user ids. With ``train/`` and ``test/`` the test rows are LEAF's; otherwise each user's rows
    are shuffled with ``seed`` and ``round(test_fraction * n)`` of them (keeping >= 1 train row) test,
    as :func:`raysim.data.partition.split_train_test` does."""
    test_fraction = check_test_fraction(test_fraction)
    train_files, test_files = leaf_files(path)
    reader = _Reader()
    train = reader.read(train_files)
    test = reader.read(test_files) if test_files is not None else {}
    users = sorted(train)
    if not users:
        raise _bad(path, "LEAF files with at least one user")
    for user in users:
        if len(train[user][1]) == 0:
            raise _bad(reader.file_of[user], f"users with at least one training row (user {user!r} has none)")
    strays = sorted(set(test) - set(train))
    if strays:
        raise _bad(reader.file_of[strays[0]], f"test users that also have training rows (user {strays[0]!r} has none)")
    labels = np.concatenate([train[u][1] for u in users] + [rows[1] for rows in test.values()])
    if reader.task == "femnist":
        num_classes, shape = FEMNIST_CLASSES, FEMNIST_SHAPE
    elif reader.task == "shakespeare":
        num_classes, shape = len(VOCABULARY), (SHAKESPEARE_LENGTH,)
    else:
        num_classes, shape = int(labels.max()) + 1, (reader.width,)
    if test_files is not None:
        empty = reader.joined([])
        return FederatedDataset.from_clients([train[u][0] for u in users], [train[u][1] for u in users],
                                             [test.get(u, empty)[0] for u in users],
                                             [test.get(u, empty)[1] for u in users], num_classes, shape)
    x = np.concatenate([train[u][0] for u in users])
    sizes = [len(train[u][1]) for u in users]
    owned = np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])
    train_rows, test_rows = split_train_test(owned, test_fraction, stream(seed, Purpose.PARTITION))
    order = client_order(train_rows, test_rows)
    return FederatedDataset.from_sorted(x[order], labels[order], [len(r) for r in train_rows],
                                        [len(r) for r in test_rows], num_classes, shape)
