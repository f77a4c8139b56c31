"""Inputs that ended in a traceback, exited 0 having run nothing, printed megabytes or stayed silent
for minutes (issue 41, section 3): each now gives one line ``error: <key> = <value>: expected …``
and exit status 2 before Ray starts (a custom aggregator that fails mid-run: a line and a failed
summary, exit status 1), or shows its progress."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from test_bad_input import PARQUET, QUICKSTART, REPO, cli, one_error_line, write_parquet

from raysim.errors import SHOWN_LINE, ScenarioError

LOCAL = ["runtime.backend=local"]  # what is refused here is refused before any runtime starts

USER_CODE = '''
import sys

import torch
from torch import nn

def data_raises(num_clients, test_fraction, seed):
    raise ValueError("no rows for\\nthese clients")

def data_exits(num_clients, test_fraction, seed):
    sys.exit(0)

def model_raises(feature_shape, num_classes):
    return nn.Linear(feature_shape[0], num_classes, bais=True)

def aggregator_raises(vectors, weights):
    raise ZeroDivisionError("weights sum to 0")

def aggregator_list(vectors, weights):
    return vectors.mean(dim=0).tolist()

def aggregator_short(vectors, weights):
    return vectors.mean(dim=0)[:3]
'''


@pytest.fixture
def user_code(tmp_path) -> Path:
    """A directory holding my_code.py (USER_CODE) and my_exit.py (which calls sys.exit(0) when imported)."""
    (tmp_path / "my_code.py").write_text(textwrap.dedent(USER_CODE))
    (tmp_path / "my_exit.py").write_text("import sys\n\nsys.exit(0)\n\n"
                                         "def net(feature_shape, num_classes):\n    pass\n")
    return tmp_path


def cli_in(directory: Path, *args) -> subprocess.CompletedProcess:
    """``raysim ARGS`` run from ``directory`` (whose modules a scenario may name), this checkout's raysim."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=directory, env=env)


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a command refused as bad input (exit status 2)."""
    assert proc.returncode == 2, proc.stderr
    return one_error_line(proc.stderr)


# --- data files -----------------------------------------------------------------------------------

def test_a_label_column_that_is_the_client_column(tmp_path):
    """Was a KeyError: the table read has the column twice."""
    path = write_parquet(tmp_path / "d.parquet")
    proc = cli("validate", QUICKSTART, *PARQUET, *LOCAL, f"data.path={path}", "data.label_column=client_id",
               "execution.clients_per_round=1")
    assert refused(proc) == ("error: data.label_column = 'client_id': expected a column other than "
                             "data.client_column ('client_id', which names each row's client)")


LEAF_JSON = "expected LEAF JSON: an object with users, num_samples and user_data"


@pytest.mark.parametrize("content, allowed", [
    ('{"users": ["a"], "user_data": {"a": {"x": ' + "[" * 100_000 + "]" * 100_000 + ', "y": []}}}',
     LEAF_JSON + " (arrays and objects nested less deeply: they nest deeper than Python's JSON reader follows)"),
    ('{"users": ["a"], "user_data": {"a": {"x": [[1.0], [2.0]], "y": [0, [1, 2]]}}}',
     "expected one integer label per row (user 'a' has [0, [1, 2]])"),
], ids=["nested 100,000 deep", "a label that is a list"])
def test_leaf_json_nested_deeply_or_with_a_list_label(tmp_path, content, allowed):
    """Were a RecursionError in the JSON reader and a ValueError of numpy."""
    path = tmp_path / "leaf.json"
    path.write_text(content)
    proc = cli("validate", QUICKSTART, "data.kind=leaf", "~data.num_clients", *LOCAL, f"data.path={path}",
               "execution.clients_per_round=1")
    assert refused(proc) == f"error: data.path = '{path}': {allowed}"


def write_idx_gz(path: Path, images: int, body_bytes: int) -> None:
    """A gzipped IDX file of 28x28 images whose header declares ``images`` and whose body holds
    ``body_bytes`` zeros (compressed about 1000:1)."""
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + struct.pack(">III", images, 28, 28))
        for start in range(0, body_bytes, 2 ** 20):
            f.write(bytes(min(2 ** 20, body_bytes - start)))


def test_a_gzipped_idx_file_holding_far_more_than_its_header_is_refused_unread(tmp_path):
    """A 20-image header in front of 32 MB: the loader reads the header, then at most what it
    declares (it decompressed the whole body before comparing its size)."""
    from test_loaders import write_mnist

    from raysim.data.idx import read_idx

    write_mnist(tmp_path / "mnist")
    images = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    write_idx_gz(images, 20, 32 * 2 ** 20)
    assert images.stat().st_size < 100_000
    line = (f"error: data.path = '{images}': expected 15680 bytes of data after the header, as its sizes "
            "[20, 28, 28] say (the file has more)")
    proc = cli("validate", QUICKSTART, "data.kind=mnist", f"data.path={tmp_path / 'mnist'}", "data.num_clients=3",
               "execution.clients_per_round=3", *LOCAL)
    assert refused(proc) == line
    tracemalloc.start()
    try:
        with pytest.raises(ScenarioError) as refusal:
            read_idx(str(images), 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"error: {refusal.value}" == line
    assert peak < 2 ** 20  # measured: 0.1 MB (the whole body decompressed: 64 MB)


def test_a_gzipped_idx_header_declaring_10_8_images_is_refused_from_the_header(tmp_path):
    """A few kilobytes whose header declares 10^8 images: the memory estimate reads the header
    only and refuses before the loader runs; the loader itself reads what the file holds, never
    what the header declares."""
    from test_loaders import write_mnist

    from raysim.data.idx import read_idx

    write_mnist(tmp_path / "mnist")
    images = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    write_idx_gz(images, 10 ** 8, 20 * 784)
    proc = cli("validate", QUICKSTART, "data.kind=mnist", f"data.path={tmp_path / 'mnist'}", "data.num_clients=3",
               "execution.clients_per_round=3", *LOCAL)
    line = refused(proc)
    assert line.startswith(f"error: data.path = '{tmp_path / 'mnist'}': expected a scenario that fits in memory: "
                           "it needs about 63") and "(data set 630 GB" in line, line
    tracemalloc.start()
    try:
        with pytest.raises(ScenarioError, match=r"expected 78400000000 bytes of data after the header, as its sizes "
                                                r"\[100000000, 28, 28\] say \(the file has 15680\)"):
            read_idx(str(images), 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2 ** 20  # measured: 1.1 MB, a chunk of the read (never the 78 GB declared)


# --- a user's code named package.module:name ------------------------------------------------------

@pytest.mark.parametrize("overrides, line", [
    (["data.kind=my_code:data_raises"],
     "data.kind = 'my_code:data_raises': expected a function returning a raysim.data.FederatedDataset (it raised "
     "ValueError: no rows for, at {dir}/my_code.py:8)"),
    (["data.kind=my_code:data_exits"],
     "data.kind = 'my_code:data_exits': expected a function returning a raysim.data.FederatedDataset (it called "
     "sys.exit(0), at {dir}/my_code.py:11)"),
    (["model.kind=my_code:model_raises"],
     "model.kind = 'my_code:model_raises': expected a function returning a torch.nn.Module (it raised TypeError: "
     "Linear.__init__() got an unexpected keyword argument 'bais', at {dir}/my_code.py:14)"),
    (["model.kind=my_exit:net"],
     "model.kind = 'my_exit:net': expected an importable module (it calls sys.exit(0) when imported)"),
    (["algorithm.aggregator=my_exit:net"],
     "algorithm.aggregator = 'my_exit:net': expected an importable module (it calls sys.exit(0) when imported)"),
], ids=["data raises", "data exits", "model raises", "model module exits", "aggregator module exits"])
def test_user_code_that_raises_or_exits_is_one_line(user_code, overrides, line):
    """Were a traceback (what the user's function raised went through) or, for sys.exit(0) while
    the module was imported, exit status 0 and nothing run."""
    scenario = user_code / "s.yaml"
    scenario.write_text("name: s\ndata: {kind: gaussian_mixture, num_clients: 10}\nmodel: {kind: logreg}\n"
                        "execution: {rounds: 1, clients_per_round: 2}\nruntime: {backend: local}\n")
    proc = cli_in(user_code, "run", str(scenario), f"output.dir={user_code / 'out'}", *overrides)
    assert refused(proc) == "error: " + line.format(dir=user_code)
    assert not (user_code / "out" / "summary.json").exists()  # nothing ran (a custom model is built beside Ray's start)


@pytest.mark.parametrize("name, returned", [
    ("aggregator_raises", "it raised ZeroDivisionError: weights sum to 0, at {dir}/my_code.py:17"),
    ("aggregator_list", "it returned list"),
    ("aggregator_short", "it returned [3]"),
])
def test_a_custom_aggregator_that_fails_mid_run_ends_it_with_one_line(user_code, name, returned):
    """Were a traceback (and, for the list, an AttributeError in the summary): now the error line,
    the directory of the metrics so far, exit status 1 and a failed summary with the same line."""
    out = user_code / "out"
    proc = cli_in(user_code, "run", QUICKSTART, *LOCAL, f"algorithm.aggregator=my_code:{name}", "execution.rounds=2",
                  f"output.dir={out}", "--quiet")
    error = (f"algorithm.aggregator = 'my_code:{name}': expected a function returning the aggregate of 20 inputs, "
             f"a tensor of shape [4554] ({returned.format(dir=user_code)})")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"error: {error}", f"metrics written so far are in {out}"]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["error"]) == ("failed", error)


# --- sweeps ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("grid, line", [
    ("model.hidden=[64],[64", "error: grid key model.hidden = '[64': expected a YAML value (did not find expected "
                              "',' or ']')"),
    ("model.hidden=[64]]", "error: grid key model.hidden = '[64]]': expected a YAML value (did not find expected "
                           "<document start>)"),
    ("algorithm.lr=]", "error: grid key algorithm.lr = ']': expected a YAML value (did not find expected node "
                       "content)"),
])
def test_a_malformed_grid_list_is_one_line(tmp_path, grid, line):
    """Were a traceback of the YAML parser."""
    proc = cli("sweep", QUICKSTART, *LOCAL, "--grid", grid, "--out", str(tmp_path / "sweep"))
    assert refused(proc) == line
    assert not (tmp_path / "sweep").exists()


def test_a_large_sweep_shows_its_validation(tmp_path):
    """A 9,000-point grid validated in silence for minutes (tens of milliseconds a point): from
    PROGRESS_FROM points on, a bar on stderr counts the points validated."""
    from raysim.sweep.plan import PROGRESS_FROM

    values = ", ".join(f"{0.001 * (i + 1):.3f}" for i in range(PROGRESS_FROM))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: s\ndata: {kind: gaussian_mixture, num_clients: 10}\nmodel: {kind: logreg}\n"
                     "execution: {rounds: 1, clients_per_round: 2}\nruntime: {backend: local}\n"
                     f"sweep:\n  grid: {{algorithm.lr: [{values}]}}\n")
    proc = cli("validate", str(sweep))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"ok: {sweep}: a sweep of {PROGRESS_FROM} runs over algorithm.lr")
    assert f"validating sweep points:   0%|          | 0/{PROGRESS_FROM} " in proc.stderr


# --- bounded lines --------------------------------------------------------------------------------

def test_a_value_of_a_megabyte_is_shown_shortened(tmp_path):
    """Was a line as long as the value (50 MB in the probe)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nmodel: {kind: mlp, hidden: " + "x" * 1_000_000 + "}\nruntime: {backend: local}\n")
    line = refused(cli("validate", str(scenario)))
    assert line == "error: model.hidden = '" + "x" * 299 + "… (1,000,002 characters): expected a list of int"


def test_a_line_of_megabytes_is_shortened(tmp_path):
    """What a line says besides the value is bounded too: 20,000 column names of a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"client_id": [0, 1], "label": [0, 1],
                             **{f"feature_{i:05d}_{'y' * 40}": [0.0, 1.0] for i in range(20_000)}}), path)
    proc = cli("validate", QUICKSTART, *PARQUET, *LOCAL, f"data.path={path}", "data.label_column=y")
    line = refused(proc)
    shown = f"error: data.label_column = 'y': expected one of the columns in the file: client_id, label, feature_00000_"
    assert line.startswith(shown) and line.endswith(" characters)")
    assert len(line) < len("error: ") + SHOWN_LINE + 30
