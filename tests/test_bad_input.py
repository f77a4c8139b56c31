"""Bad input users hit: each gives exactly one line ``error: <key> = <value>: expected …`` on
stderr and exit status 2, before Ray starts or anything big is allocated; and the memory estimate
behind the refusal of scenarios that cannot fit."""

from __future__ import annotations

import math
import re
import resource
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from raysim.catalog import ALGORITHMS, parameter_count
from raysim.cli import main
from raysim.scenario import Scenario, load_scenario
from raysim.data import build_dataset
from raysim.data.parquet import load_parquet, parquet_shape
from raysim.errors import ScenarioError
from raysim.footprint import check_fits, estimate, summary

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "scenarios" / "quickstart.yaml")
MEMORY_LIMIT = 4 * 2 ** 30  # a regression that allocates fails instead of exhausting the machine
FITS = r"expected a scenario that fits in memory: it needs about [\d.]+ [kMGTP]?B \(data set .*\), " \
       r"this machine has [\d.]+ [kMGTP]?B available"
TIER_KEYS = "fraction, speed, down_mbps, up_mbps, latency_s"


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(*args) -> subprocess.CompletedProcess:
    """``raysim ARGS`` in a real process under MEMORY_LIMIT."""
    return subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, preexec_fn=_limit_memory)


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


PARQUET = ["data.kind=parquet", "~data.num_clients"]  # the quickstart on files, which decide the clients


def write_parquet(path: Path, **columns) -> str:
    base = {"client_id": [0, 0, 1, 1], "f0": [0.5, 1.0, 1.5, 2.0], "label": [0, 1, 1, 0]}
    pq.write_table(pa.table({**base, **columns}), path)
    return str(path)


# --- real processes: the huge cases under a memory limit, nothing written -------------------------

@pytest.mark.parametrize("override, expected", [
    ("data.num_clients=1000000000", r"error: data\.num_clients = 1000000000: " + FITS),
    ("model.hidden=[2000000000]", r"error: model\.hidden = \[2000000000\]: " + FITS),
    ("execution.over_selection=inf", r"error: execution\.over_selection = inf: expected a finite number"),
    ("seed=99999999999999999999999", r"error: seed = 99999999999999999999999: expected an integer in "
                                     r"\[0, 9223372036854775807\]"),
    ("runtime.address=127.0.0.1:1", r"error: runtime\.address = '127\.0\.0\.1:1': expected host:port of a running "
                                    r"Ray cluster's head \(GCS\), ray://host:port, or auto: nothing answers at "
                                    r"127\.0\.0\.1:1 \(.*\)"),
    ("algorithm.lr_decay=1.5", r"error: algorithm\.lr_decay = 1\.5: expected a number in \(0, 1\]"),
    ("data.partition.kind=balanced_dirichlet data.kind=digits data.num_clients=1000",
     r"error: data\.num_clients = 1000: expected at most \d+ for the balanced_dirichlet partition of 1797 samples "
     r"with data\.test_fraction [\d.]+: each client takes 1797 // num_clients samples and needs a training and a "
     r"test row"),
], ids=["clients", "hidden", "over_selection", "seed", "address", "lr_decay", "balanced_partition"])
def test_run_refuses_in_a_real_process_and_writes_nothing(tmp_path, override, expected):
    out = tmp_path / "out"
    proc = cli("run", QUICKSTART, f"output.dir={out}", *override.split())
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(expected, one_error_line(proc.stderr)), proc.stderr
    assert not out.exists()


def test_parquet_label_far_too_large_is_refused_in_a_real_process(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", label=[0, 2 ** 40, 1, 0])
    out = tmp_path / "out"
    proc = cli("run", QUICKSTART, *PARQUET, f"data.path={path}", "execution.clients_per_round=1",
               f"output.dir={out}")
    assert proc.returncode == 2
    assert one_error_line(proc.stderr) == (f"error: data.path = '{path}': expected class labels in [0, 1048575] "
                                           "(column 'label' holds 1099511627776)")
    assert not out.exists()


def test_empty_scenario_file_in_a_real_process(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("")
    proc = cli("validate", str(path))
    assert proc.returncode == 2
    assert one_error_line(proc.stderr) == (f"error: scenario = '{path}': expected a YAML mapping of scenario keys "
                                           "(name, seed, data, model, ...); the file is empty")


# --- the same line from cli.main, in-process --------------------------------------------------------

def run_main(capsys, *args) -> str:
    assert main(list(args)) == 2
    captured = capsys.readouterr()
    return one_error_line(captured.err)


@pytest.mark.parametrize("overrides, line", [
    (["model.hidden=[64,abc]"], "model.hidden[1] = 'abc': expected a value of type int"),
    (["model.hidden=7"], "model.hidden = 7: expected a list of int"),
    (["algoritm.lr=0.1"], "algoritm = {'lr': 0.1}: expected a known key (did you mean algorithm?); allowed here: "
                          "name, seed, data, model, algorithm, execution, system, privacy, communication, runtime, eval, output"),
    (["model.hidden=[64,[1]]"], "model.hidden[1] = [1]: expected a value of type int"),
    (["data.image_shape=[3,{a: 32},32]"], "data.image_shape[1] = {'a': 32}: expected a value of type int"),
    (["algorithm.lr=0.1", "model.hidden=[64,64"],
     "model.hidden = '[64,64': expected a YAML value (did not find expected ',' or ']')"),
    (["name='x"], "name = \"'x\": expected a YAML value (found unexpected end of stream)"),
    (["data.image_shape=[1,x]"], "data.image_shape[1] = 'x': expected a value of type int"),
    (["algorithm.server_betas=[0.9,abc]"], "algorithm.server_betas[1] = 'abc': expected a value of type float"),
    (["system.compute.kind=tiers", "system.compute.tiers=[{fraction: 1.0, sped: 2}]"],
     f"system.compute.tiers[0].sped = 2: expected a known key (did you mean speed?); allowed here: {TIER_KEYS}"),
    (["system.compute.kind=tiers", "system.compute.tiers=[{fraction: 1.0, speed: fast}]"],
     "system.compute.tiers[0].speed = 'fast': expected a value of type float"),
    (["system.compute.kind=tiers", "system.compute.tiers=[{fraction: 0.5}, 0.5]"],
     f"system.compute.tiers[1] = 0.5: expected a mapping of keys ({TIER_KEYS})"),
    (["system.compute.tiers=5"], "system.compute.tiers = 5: expected a list of Tier"),
    (["system.unreliable.local_steps={kind: constant, valu: 3}"],
     "system.unreliable.local_steps.valu = 3: expected a known key (did you mean value?); allowed here: kind, "
     "value, low, high, mean"),
    (["execution.staleness=3"], "execution.staleness = 3: expected a mapping of keys (kind, a, b)"),
    (["model.options=3"], "model.options = 3: expected a mapping of keys to values"),
    (["algorithm.lr=inf"], "algorithm.lr = inf: expected a finite number"),
    (["algorithm.lr=nan"], "algorithm.lr = nan: expected a finite number"),
    (["seed=-1"], "seed = -1: expected an integer in [0, 9223372036854775807]"),
    (["algorithm.batch_size=100000000000000000000"],
     "algorithm.batch_size = 100000000000000000000: expected a positive integer (at most 9223372036854775807)"),
    (["data.num_clients=3000000000"], "data.num_clients = 3000000000: expected an integer in [1, 2147483647]"),
    (["runtime.torch_threads=100000"], "runtime.torch_threads = 100000: expected an integer in [1, 1024]"),
    (["runtime.address=auto", "runtime.num_cpus=2"], "runtime.num_cpus = 2: expected no setting (it applies only "
                                                     "with runtime.address = null (here runtime.address = 'auto'))"),
    (["data.test_fraction=0.5"], "data.test_fraction = 0.5: expected no setting (it applies only with data.kind not "
                                 "in {gaussian_mixture, quadratic} (here data.kind = 'gaussian_mixture'))"),
])
def test_validate_prints_one_line(capsys, overrides, line):
    assert run_main(capsys, "validate", QUICKSTART, *overrides) == f"error: {line}"


def test_a_key_of_other_algorithms_names_them(capsys):
    line = run_main(capsys, "validate", QUICKSTART, "algorithm.prox_mu=0.1")
    assert line.startswith("error: algorithm.prox_mu = 0.1: expected a key of algorithm.name=fedavg (prox_mu is a key "
                           "of fedprox); allowed here: name, lr, lr_decay, local_steps,")
    assert line.endswith("aggregator_options")  # an override: drop it rather than unset it
    line = run_main(capsys, "validate", QUICKSTART, "algorithm.name=fedprox", "algorithm.finetuner=cg")
    assert "(finetuner is a key of ffgg, local_ffgg); allowed here: name, lr," in line
    line = run_main(capsys, "validate", str(REPO / "scenarios/paper/fedacg/fedprox.yaml"), "algorithm.name=fedavg")
    assert "(prox_mu is a key of fedprox)" in line and line.endswith("; ~algorithm.prox_mu unsets it")


def test_run_of_a_sweep_file_points_to_raysim_sweep(capsys):
    line = run_main(capsys, "run", str(REPO / "scenarios" / "scaling" / "actors.yaml"))
    assert line.startswith("error: sweep = {") and line.endswith("}: expected a known key; allowed here: name, "
                                                                  "seed, data, model, algorithm, execution, system, "
                                                                  "privacy, communication, runtime, eval, output; a sweep: section is run by "
                                                                  "raysim sweep FILE")


def test_tier_entry_with_a_typo_in_a_scenario_file(tmp_path, capsys):
    path = tmp_path / "tiers.yaml"
    path.write_text("system:\n  compute:\n    kind: tiers\n    tiers:\n      - fraction: 0.5\n        speed: 1\n"
                    "      - fractoin: 0.5\n        speed: 2\n")
    assert run_main(capsys, "validate", str(path)) == (
        f"error: system.compute.tiers[1].fractoin = 0.5: expected a known key (did you mean fraction?); allowed "
        f"here: {TIER_KEYS}")


MAPPING = "a YAML mapping of scenario keys (name, seed, data, model, ...); "


@pytest.mark.parametrize("text, allowed", [
    ("", MAPPING + "the file is empty"),
    ("# only a comment\n", MAPPING + "the file is empty"),
    ("{}\n", MAPPING + "the file holds {}"),
    ("null\n", MAPPING + "the file holds null"),
    ("- name: x\n- seed: 1\n", MAPPING + "the file holds a list"),
    ("42\n", MAPPING + "the file holds 42"),
    ("hello\n", MAPPING + "the file holds 'hello'"),
    # a syntax error: where it is, line and column
    ("name: x\ndata:\n  kind: [gaussian\n  num_clients: 3\n",
     "valid YAML (line 4, column 14: expected ',' or ']', but got ':')"),
    ("name: x\ndata:\n  kind: a\n   num_clients: 3\n", "valid YAML (line 4, column 15: mapping values are not allowed here)"),
    ("name: x\ndata:\n  kind: a\n  kind: b\n", "valid YAML (line 4, column 3: found duplicate key kind)"),
])
def test_scenario_file_without_keys_or_with_a_syntax_error(tmp_path, capsys, text, allowed):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    assert run_main(capsys, "run", str(path), "runtime.backend=local", f"output.dir={out}") == (
        f"error: scenario = '{path}': expected {allowed}")
    assert not out.exists()


@pytest.mark.parametrize("column, values, shown", [
    ("f0", [0.5, float("nan"), 1.5, 2.0], "nan"),
    ("f0", [0.5, 1.0, float("inf"), 2.0], "inf"),
    ("f1", [0.5, 1.0, 1e39, 2.0], "1e+39"),  # beyond float32
])
def test_parquet_features_must_be_finite(tmp_path, capsys, column, values, shown):
    path = write_parquet(tmp_path / "d.parquet", **{column: values})
    out = tmp_path / "out"
    line = run_main(capsys, "run", QUICKSTART, "runtime.backend=local", *PARQUET, f"data.path={path}",
                    "execution.clients_per_round=1", f"output.dir={out}")
    assert line == (f"error: data.path = '{path}': expected finite feature values within float32's range "
                    f"(column {column!r} holds {shown})")
    assert not out.exists()


def test_parquet_list_column_and_negative_labels(tmp_path):
    pixels = pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3, float("nan")] * 2, pa.float32()), 2)
    path = tmp_path / "list.parquet"
    pq.write_table(pa.table({"client_id": [0, 0, 1, 1], "px": pixels, "label": [0, 1, 1, 0]}), path)
    with pytest.raises(ScenarioError, match=re.escape("(column 'px' holds nan)")):
        load_parquet(str(path), "label", "client_id", None, None, 0.0, 0)
    negative = write_parquet(tmp_path / "neg.parquet", label=[0, -3, 1, 0])
    for read in (lambda: load_parquet(negative, "label", "client_id", None, None, 0.0, 0),
                 lambda: parquet_shape(negative, "label", "client_id", None)):
        with pytest.raises(ScenarioError, match=re.escape("expected class labels in [0, 1048575] "
                                                          "(column 'label' holds -3)")):
            read()


@pytest.mark.parametrize("columns, allowed", [
    ({"f0": [0.5, None, 1.5, 2.0]}, "feature columns without missing values (column 'f0' has 1 missing)"),
    ({"label": [0.0, 1.0, 1.0, 0.0]}, "integer class labels without missing values (column 'label' holds values of "
                                      "type double)"),
    ({"label": [0, None, 1, 0]}, "integer class labels without missing values (column 'label' has 1 missing)"),
    ({"client_id": [0, None, 1, 1]}, "client ids without missing values (column 'client_id' has 1 missing)"),
])
def test_parquet_lines_name_the_file_and_the_column(tmp_path, capsys, columns, allowed):
    path = write_parquet(tmp_path / "d.parquet", **columns)
    assert run_main(capsys, "validate", QUICKSTART, *PARQUET, f"data.path={path}") == (
        f"error: data.path = '{path}': expected {allowed}")


@pytest.mark.parametrize("override, allowed", [
    ("data.kind=os:getcwd", "a function returning a raysim.data.FederatedDataset, called with num_clients=, "
                            "test_fraction=, seed= (got an unexpected keyword argument 'num_clients')"),
    ("algorithm.aggregator=math:fsum", "a function (updates, weights, **algorithm.aggregator_options) (too many "
                                       "positional arguments)"),
])
def test_an_imported_function_that_cannot_take_the_call(capsys, override, allowed):
    key, value = override.split("=")
    assert run_main(capsys, "validate", QUICKSTART, override) == f"error: {key} = '{value}': expected {allowed}"


def test_an_imported_model_factory_that_cannot_take_the_call(tmp_path, capsys):
    scenario = tmp_path / "logreg.yaml"
    scenario.write_text("model:\n  kind: os:getcwd\n")
    assert run_main(capsys, "validate", str(scenario)) == (
        "error: model.kind = 'os:getcwd': expected a function returning a torch.nn.Module, called with 2 positional "
        "arguments (too many positional arguments)")


def float_keys(schema, prefix=""):
    """Dotted paths of every key a schema dataclass declares float (or Optional[float])."""
    node = OmegaConf.structured(schema)
    for name in node.keys():
        child = node._get_node(name)
        ref = child._metadata.ref_type
        if isinstance(ref, type) and hasattr(ref, "__dataclass_fields__"):
            yield from float_keys(ref, f"{prefix}{name}.")
        elif ref is float or getattr(ref, "__args__", None) == (float, type(None)):
            yield f"{prefix}{name}"


def test_every_float_key_must_be_finite():
    paths = list(float_keys(Scenario)) + sorted({f"algorithm.{k}" for builtin in ALGORITHMS.values()
                                                  for k in float_keys(builtin.keys)})
    assert {"execution.over_selection", "system.compute.speed", "algorithm.lr", "algorithm.dyn_alpha"} <= set(paths)
    for path in paths:
        owners = (n for n, builtin in ALGORITHMS.items() if path.split(".", 1)[1] in builtin.keys.__dataclass_fields__)
        name = next(owners, None) if path.startswith("algorithm.") else "fedavg"
        bad = {"execution.over_selection": "inf", "system.compute.mu": "-inf"}.get(path, "nan")
        with pytest.raises(ScenarioError) as info:
            load_scenario(None, [f"algorithm.name={name}", f"{path}={bad}"])
        assert str(info.value) == f"{path} = {float(bad)}: expected a finite number"


def test_the_largest_seed_runs_the_model_builder():
    cfg = load_scenario(None, ["seed=9223372036854775807"])
    from raysim.models import build_model

    assert build_model(cfg.model, (60,), 10, cfg.seed).size > 0


# --- the memory estimate ------------------------------------------------------------------------------

def scenario(*overrides):
    return load_scenario(None, ["runtime.backend=local", *overrides])


def part(footprint, what: str) -> float:
    return next(p.bytes for p in footprint.parts if p.what == what)


def test_estimate_grows_linearly_with_the_clients():
    one, two, ten = (estimate(scenario(f"data.num_clients={151 * n}")) for n in (1, 2, 10))  # whole cycles of sizes
    for what in ("data set", "client state"):
        assert part(ten, what) == pytest.approx(10 * part(one, what))
    assert ten.total - one.total == pytest.approx(9 * (two.total - one.total))  # the model and training are fixed
    assert part(ten, "data set") + part(ten, "client state") > 5 * (part(one, "data set") + part(one, "client state"))


@pytest.mark.parametrize("overrides", [
    ["data.kind=gaussian_mixture", "data.num_clients=50"],
    ["data.kind=digits", "data.num_clients=20", "model.kind=cnn", "execution.clients_per_round=5"],
    ["data.kind=leaf_synthetic", "data.num_clients=300"],
])
def test_data_set_estimate_is_within_a_factor_2_of_the_table(overrides):
    cfg = scenario(*overrides)
    actual = build_dataset(cfg.data, cfg.seed).table.nbytes
    from raysim.footprint import BUILD_FACTOR

    estimated = part(estimate(cfg), "data set") / BUILD_FACTOR.get(cfg.data.kind, 1.0)  # the table itself
    assert 0.5 < estimated / actual < 2, (estimated, actual)


def test_parquet_is_sized_from_metadata_and_two_columns(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    for i in range(2):  # a directory of two files, one list feature column
        pq.write_table(pa.table({"client_id": np.arange(20) % 5 + 5 * i, "label": rng.integers(0, 7, 20),
                                 "px": pa.FixedSizeListArray.from_arrays(pa.array(x[20 * i:20 * (i + 1)].ravel()), 6)}),
                       tmp_path / f"part{i}.parquet")
    loaded = load_parquet(str(tmp_path), "label", "client_id", None, None, 0.2, 0)
    assert parquet_shape(str(tmp_path), "label", "client_id", None) == (
        40, loaded.num_features, loaded.num_classes, loaded.num_clients)
    scalar = write_parquet(tmp_path / "s.parquet", f1=[1.0, 2.0, 3.0, 4.0], who=["a", "b", "a", "b"])
    assert parquet_shape(scalar, "label", "who", ["f0", "f1"]) == (4, 2, 2, 2)


@pytest.mark.parametrize("overrides", [
    ["model.kind=logreg"],
    ["model.hidden=[32,16]"],
    ["model.hidden=[32,16]", "model.personal=adapter", "model.adapter_rank=3"],
    ["data.kind=digits", "data.num_clients=10", "execution.clients_per_round=5", "model.kind=cnn"],
    ["data.kind=digits", "data.num_clients=10", "execution.clients_per_round=5", "model.kind=cnn",
     "model.channels=[4,4,4,4,4]"],
])
def test_parameter_count_matches_the_built_model(overrides):
    from raysim.models import build_model

    cfg = scenario(*overrides)
    dataset = build_dataset(cfg.data, cfg.seed)
    built = build_model(cfg.model, dataset.feature_shape, dataset.num_classes, 0)
    assert parameter_count(cfg.model, dataset.feature_shape, dataset.num_classes)[0] == built.size


def test_stateful_algorithms_count_a_vector_per_visited_client():
    fedavg = part(estimate(scenario("data.num_clients=1000")), "client state")
    scaffold = part(estimate(scenario("data.num_clients=1000", "algorithm.name=scaffold")), "client state")
    params = parameter_count(scenario().model, (60,), 10)[0]
    visited = 20 * 10  # quickstart's defaults: 20 rounds of 10 clients
    assert scaffold - fedavg >= visited * params * 4


def test_check_fits_names_the_dominant_key():
    cfg = scenario("data.num_clients=1000")
    assert check_fits(cfg, available=math.inf).total == estimate(cfg).total
    with pytest.raises(ScenarioError, match=r"^data\.num_clients = 1000: expected a scenario that fits in memory: "
                                            r"it needs about .*, this machine has 1 MB available$"):
        check_fits(cfg, available=1e6)
    with pytest.raises(ScenarioError, match=r"^model\.hidden = \[4096, 4096\]: "):
        check_fits(scenario("model.hidden=[4096,4096]"), available=1e6)
    assert re.fullmatch(r"memory: about [\d.]+ MB \(data set .*\) of [\d.]+ [MGT]B available", summary(cfg))


def test_a_cluster_checks_only_the_drivers_parts():
    cfg = scenario("runtime.backend=ray", "runtime.address=ray://head:10001")
    assert [p.what for p in estimate(cfg).parts] == ["data set", "model", "processes"]


def test_the_estimate_knows_which_built_in_algorithms_keep_client_state():
    """The registry's per-client kept vectors (the estimate must not import torch) agree with the
    algorithm classes' own ``stateful``."""
    from raysim.catalog import algorithm_class

    for name, builtin in ALGORITHMS.items():
        if not builtin.keeps_personal:  # FFGG keeps w only with model.personal_state: stateful
            assert builtin.kept_vectors == int(algorithm_class(name).stateful is True), name


# --- the memory estimate of the data sets read from files, and of the benchmark models ----------------

def _file_data_set(kind: str, path: Path) -> tuple[int, tuple]:
    """Fake files of ``kind`` at ``path`` (as tests/test_loaders.py writes them): (rows, shape of one)."""
    from test_loaders import cifar_records, write_cifar10, write_mnist

    if kind == "mnist":
        write_mnist(path, train=20, test=5)
        return 25, (1, 28, 28)
    if kind == "cifar10":
        write_cifar10(path / "cifar-10-batches-bin", per_file=3)
        return 18, (3, 32, 32)
    path.mkdir()
    (path / "train.bin").write_bytes(cifar_records(7, 2))
    (path / "test.bin").write_bytes(cifar_records(2, 2))
    return 9, (3, 32, 32)


@pytest.mark.parametrize("kind", ["mnist", "cifar10", "cifar100"])
def test_image_files_are_sized_from_their_headers_and_sizes(tmp_path, kind):
    from raysim.data.sizes import ROW_BYTES
    from raysim.footprint import BUILD_FACTOR

    rows, shape = _file_data_set(kind, tmp_path / "d")
    cfg = scenario(f"data.kind={kind}", f"data.path={tmp_path / 'd'}", "data.num_clients=3",
                   "execution.clients_per_round=3", "model.kind=cnn")
    assert part(estimate(cfg), "data set") == rows * (ROW_BYTES + 4 * math.prod(shape)) * BUILD_FACTOR[kind]
    dataset = build_dataset(cfg.data, cfg.seed)
    assert (dataset.table.num_rows, dataset.feature_shape) == (rows, shape)
    assert estimate(cfg).parts[1].keys[-1] == ("data.path", str(tmp_path / "d"))  # the files decide the model's shape


def test_gzipped_idx_files_are_sized_from_their_first_bytes(tmp_path):
    """Only the header is decompressed: a gzip stream cut short after it is sized all the same."""
    from test_loaders import write_mnist

    write_mnist(tmp_path, train=20, test=5)
    images = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:-200])
    cfg = scenario("data.kind=fashion_mnist", f"data.path={tmp_path}", "data.num_clients=3",
                   "execution.clients_per_round=3")
    from raysim.data.idx import mnist_shape

    assert mnist_shape(str(tmp_path)) == (25, (1, 28, 28))
    assert part(estimate(cfg), "data set") > 0
    with pytest.raises(ScenarioError, match=r"expected a complete gzip file"):
        build_dataset(cfg.data, cfg.seed)


def test_missing_image_files_are_one_line_from_the_estimate(tmp_path):
    from test_loaders import write_mnist

    write_mnist(tmp_path / "m")
    (tmp_path / "m" / "t10k-images-idx3-ubyte").unlink()
    (tmp_path / "s.yaml").write_text("name: m\nruntime:\n  backend: local\n")
    proc = cli("validate", str(tmp_path / "s.yaml"), "data.kind=mnist", f"data.path={tmp_path / 'm'}",
               "data.num_clients=3", "execution.clients_per_round=3", f"output.dir={tmp_path / 'out'}")
    assert proc.returncode == 2
    assert one_error_line(proc.stderr).endswith("(t10k-images-idx3-ubyte or t10k-images-idx3-ubyte.gz is missing)")


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_leaf_is_sized_from_its_json_files(tmp_path, backend):
    from raysim.footprint import JSON_PARSE_FACTOR
    from test_loaders import femnist_rows, leaf_json, write_json

    sizes = [write_json(tmp_path / "leaf" / split / "a.json",
                        leaf_json({"w": femnist_rows(0.5, rows, 1)})).stat().st_size
             for split, rows in (("train", 4), ("test", 2))]
    cfg = scenario("data.kind=leaf", f"data.path={tmp_path / 'leaf'}", "execution.clients_per_round=1",
                   f"runtime.backend={backend}", "model.kind=femnist_cnn")
    ray = backend == "ray"
    assert part(estimate(cfg), "data set") == sum(sizes) * (JSON_PARSE_FACTOR + ray)
    assert part(estimate(cfg), "model") > 6_000_000 * 4  # femnist_cnn, whatever the classes


def test_a_cifar_resnet_run_is_estimated_at_its_model_and_data(tmp_path):
    """CIFAR-10's 60,000 records (file sizes only) and resnet18_gn's 11.2 M parameters."""
    from raysim.data.cifar import CIFAR10

    for name in CIFAR10.files:  # 5 training batches and a test batch of 10,000 records each
        with open(tmp_path / name, "wb") as f:
            f.truncate(10_000 * CIFAR10.record_bytes)
    cfg = scenario("data.kind=cifar10", f"data.path={tmp_path}", "model.kind=resnet18_gn",
                   "execution.clients_per_round=10")
    footprint = estimate(cfg)
    assert part(footprint, "data set") > 60_000 * 3072 * 4
    assert part(footprint, "model") > 11_173_962 * 4 * 2


@pytest.mark.parametrize("kind, shape, classes, personal", [
    ("char_lstm", (80,), 80, "none"), ("char_lstm", (80,), 12, "none"),
    ("femnist_cnn", (1, 28, 28), 62, "none"), ("femnist_cnn", (1, 28, 28), 10, "adapter"),  # LoRA on the dense layer
    ("resnet18_gn", (3, 32, 32), 100, "none"), ("resnet18_gn", (1, 28, 28), 7, "none"),
    ("resnet18_gn", (5, 9, 13), 3, "none"),
])
def test_parameter_count_of_the_benchmark_models(kind, shape, classes, personal):
    from raysim.scenario import ModelConfig
    from raysim.models import build_model

    model_cfg = ModelConfig(kind=kind, personal=personal)
    assert parameter_count(model_cfg, shape, classes)[0] == build_model(model_cfg, shape, classes, 0).size


@pytest.mark.parametrize("columns, override, line", [
    ({"split": ["train", "test"] * 2}, "data.test_fraction=0.3",
     "data.test_fraction = 0.3: expected no setting (data.path has a 'split' column, which splits the rows)"),
    ({}, "data.feature_columns=[f0,label]",
     "data.feature_columns = ['f0', 'label']: expected columns other than the label column ('label')"),
    ({"split": ["train", "test"] * 2}, "data.feature_columns=[split]",
     "data.feature_columns = ['split']: expected columns other than the train/test split ('split')"),
])
def test_parquet_keys_the_file_makes_idle_or_wrong(tmp_path, capsys, columns, override, line):
    path = write_parquet(tmp_path / "d.parquet", **columns)
    assert run_main(capsys, "validate", QUICKSTART, *PARQUET, f"data.path={path}", override) == f"error: {line}"


def test_test_fraction_with_leafs_own_split_is_refused(tmp_path, capsys):
    from test_loaders import femnist_rows, leaf_json, write_json

    for split in ("train", "test"):
        write_json(tmp_path / "leaf" / split / "a.json", leaf_json({"w": femnist_rows(0.5, 2, 1)}))
    args = ("validate", QUICKSTART, "data.kind=leaf", "~data.num_clients", f"data.path={tmp_path / 'leaf'}",
            "execution.clients_per_round=1")
    assert run_main(capsys, *args, "data.test_fraction=0.3") == (
        "error: data.test_fraction = 0.3: expected no setting (data.path has train/ and test/, LEAF's own split)")
    assert main(list(args)) == 0


def test_parquet_files_of_one_directory_must_have_the_same_columns(tmp_path, capsys):
    """The data set would take the first file's columns and drop (or fill with nulls) the others'."""
    folder = tmp_path / "parts"
    folder.mkdir()
    write_parquet(folder / "a.parquet")
    write_parquet(folder / "b.parquet", f9=[0.0, 1.0, 2.0, 3.0])
    assert run_main(capsys, "validate", QUICKSTART, *PARQUET, f"data.path={folder}") == (
        f"error: data.path = '{folder}': expected Parquet files with the same columns (b.parquet and a.parquet "
        "differ in f9)")


def test_a_scenario_error_survives_pickling():
    """Ray sends exceptions pickled: the key, value and message arrive intact."""
    import pickle

    error = pickle.loads(pickle.dumps(ScenarioError("data.kind", "x", "one of a, b")))
    assert (error.key, error.value, str(error)) == ("data.kind", "x", "data.kind = 'x': expected one of a, b")


def test_a_class_of_the_drivers_script_is_refused_with_ray(monkeypatch):
    """Ray's workers run their own __main__: a class defined in the script that calls raysim.run
    works with the local backend only."""
    from raysim.algorithms.fedavg import FedAvg

    monkeypatch.setattr(sys.modules["__main__"], "Mine", type("Mine", (FedAvg,), {}), raising=False)
    assert load_scenario(QUICKSTART, ["algorithm.name=__main__:Mine", "runtime.backend=local"])
    with pytest.raises(ScenarioError) as refused:
        load_scenario(QUICKSTART, ["algorithm.name=__main__:Mine"])
    assert str(refused.value) == ("algorithm.name = '__main__:Mine': expected a package.module:name that Ray's "
                                  "worker processes can import (__main__ is the driver's script there: move the "
                                  "definition into a module, or use runtime.backend=local)")


def _run_in(directory: Path, *args) -> subprocess.CompletedProcess:
    """``raysim ARGS`` as a user types it (the console script, whose own directory is not the
    working directory) from ``directory``."""
    script = Path(sysconfig.get_path("scripts")) / "raysim"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120, cwd=directory)


@pytest.mark.parametrize("name, file", [("actors", "actors.py"), ("raysim", "raysim.py"),
                                        ("actors", "actors/__init__.py")])
def test_a_module_that_would_shadow_raysim_in_rays_workers_is_refused(tmp_path, name, file):
    """Ray's workers import raysim's packages by name with the driver's working directory first on
    their path: a module of the same name there is refused before Ray starts (before, the
    ClientActors failed to start with that module's ImportError)."""
    (tmp_path / file).parent.mkdir(exist_ok=True)
    (tmp_path / file).write_text("raise ImportError('the user module was imported')\n")
    out = tmp_path / "out"
    expected = (f"error: runtime.backend = 'ray': expected no module named {name} in {tmp_path} (Ray's workers "
                f"would import {tmp_path / file} in place of raysim's own {name} package): rename it, run raysim "
                "from another directory, or use runtime.backend=local")
    for args in (["run", QUICKSTART, f"output.dir={out}"], ["validate", QUICKSTART],
                 ["sweep", QUICKSTART, "--grid", "seed=1,2", "--out", str(tmp_path / "sweep")]):
        proc = _run_in(tmp_path, *args)
        assert proc.returncode == 2, proc.stderr
        assert one_error_line(proc.stderr) == expected
    assert not out.exists() and not (tmp_path / "sweep").exists()
    # the local backend has no workers to mislead, and the run's own helper process (its guardian)
    # imports raysim from where raysim is, whatever the working directory holds
    local = _run_in(tmp_path, "run", QUICKSTART, "runtime.backend=local", "execution.rounds=1", f"output.dir={out}",
                    "--quiet")
    assert local.returncode == 0 and "Traceback" not in local.stderr, local.stderr


def test_a_directory_named_like_raysims_packages_that_is_not_a_module_is_not_refused(tmp_path, monkeypatch):
    """A plain directory (a namespace portion) yields to the installed package, and a raysim
    checkout holds raysim's own packages: neither shadows anything."""
    from raysim.import_path import check_workers_import_raysim

    runtime = load_scenario(QUICKSTART).runtime
    (tmp_path / "plain" / "actors").mkdir(parents=True)
    for package in ("raysim", "actors"):
        (tmp_path / "checkout" / package).mkdir(parents=True)
        (tmp_path / "checkout" / package / "__init__.py").write_text("")
    for directory in ("plain", "checkout"):
        monkeypatch.chdir(tmp_path / directory)
        check_workers_import_raysim(runtime)
    monkeypatch.chdir(tmp_path / "checkout")
    (tmp_path / "checkout" / "raysim" / "__init__.py").unlink()  # now its actors/ is not raysim's
    with pytest.raises(ScenarioError, match="no module named actors in"):
        check_workers_import_raysim(runtime)
    runtime.address = "ray://head:10001"  # a Ray client's workers do not see the driver's directories
    check_workers_import_raysim(runtime)
