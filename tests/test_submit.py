"""What `raysim submit` ships (issue 41: it uploaded the whole repository root, secrets and data
included, while the README lists raysim/, actors/, scenarios/, examples/), and what a run prints
where nobody watches a terminal (a job's logs, which --follow streams) and during its start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import actors.jobs as jobs
from actors.jobs import SHIPPED, shipped_files, stage

REPO = Path(__file__).resolve().parents[1]
PLANTED = [".env", "id_rsa", ".ray_auth_token", "notes/secret.txt", "model.pt", "data/big.parquet",
           "results/run/summary.json", "tests/test_x.py", "docs/page.md"]


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A checkout laid out like the repository, with secrets, data and results planted beside its code."""
    root = tmp_path / "checkout"
    for part in SHIPPED:
        (root / part / "sub").mkdir(parents=True)
        (root / part / "__init__.py").write_text("")
        (root / part / "sub" / "thing.yaml").write_text("a: 1\n")
        (root / part / "__pycache__").mkdir()
        (root / part / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    for name in PLANTED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"secret" if "big" not in name else b"\0" * (30 * 2 ** 20))
    monkeypatch.setattr(jobs, "REPO", root)
    return root


def test_submit_ships_only_the_readmes_parts_the_scenario_and_its_modules(checkout, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "my_ext").mkdir(parents=True)
    (elsewhere / "my_ext" / "__init__.py").write_text("")
    (elsewhere / "my_ext" / "parts.py").write_text("X = 1\n")
    (elsewhere / "single.py").write_text("Y = 2\n")
    scenario = elsewhere / "study.yaml"
    scenario.write_text("name: study\n")
    files, there = shipped_files(str(scenario), (), [str(elsewhere / "my_ext"), str(elsewhere / "single.py")])
    assert there == "submitted/study.yaml"
    expected = {f"{part}/{name}" for part in SHIPPED for name in ("__init__.py", "sub/thing.yaml")}
    assert set(files) == expected | {"submitted/study.yaml", "my_ext/__init__.py", "my_ext/parts.py", "single.py"}
    staged = tmp_path / "staged"
    stage(files, staged)
    shipped = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
    assert shipped == set(files) and (staged / "submitted" / "study.yaml").read_text() == "name: study\n"
    assert not any(name in shipped for name in PLANTED)


def test_a_scenario_inside_the_shipped_parts_keeps_its_path_and_a_sweeps_files_travel_beside_it(checkout, tmp_path):
    files, there = shipped_files(str(checkout / "scenarios" / "sub" / "thing.yaml"))
    assert there == "scenarios/sub/thing.yaml" and not any(f.startswith("submitted/") for f in files)
    study = tmp_path / "study"
    (study / "bases").mkdir(parents=True)
    (study / "sweep.yaml").write_text("sweep: {}\n")
    (study / "bases" / "a.yaml").write_text("name: a\n")
    files, there = shipped_files(str(study / "sweep.yaml"), [str(study / "bases" / "a.yaml")])
    assert there == "submitted/sweep.yaml" and "submitted/bases/a.yaml" in files


def test_dry_run_lists_a_custom_module_from_outside_the_repository(tmp_path):
    package = tmp_path / "ext" / "my_ext"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text("from raysim.algorithms.fedavg import FedAvg\n\nclass Damped(FedAvg):\n    pass\n")
    scenario = tmp_path / "mine.yaml"
    scenario.write_text((REPO / "scenarios" / "quickstart.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "raysim.cli", "submit", str(scenario),
                           "algorithm.name=my_ext.parts:Damped", "--dry-run"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{tmp_path / 'ext'}"})
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split()
    assert {"submitted/mine.yaml", "my_ext/parts.py", "raysim/cli.py", "actors/jobs.py"} <= set(listed)
    assert not any(f.startswith(("tests/", "docs/", "results/", ".git")) for f in listed)
    assert done.stderr.strip().endswith(
        "the job would run: python -m raysim.cli run submitted/mine.yaml algorithm.name=my_ext.parts:Damped")


def test_a_run_without_a_terminal_prints_its_start_up_progress_lines_and_closing_line(tmp_path):
    """What a job's logs hold, and what --follow streams: tqdm's bar is for terminals only."""
    done = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml",
                           "execution.rounds=3", "runtime.backend=local", f"output.dir={tmp_path}"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert err[:2] == ["building the data set (gaussian_mixture, 100 clients) …", "building the model (mlp) …"]
    assert err[-1].startswith("round 3/3, test accuracy 0.") and "\r" not in done.stderr
    assert done.stdout.startswith("quickstart: 3 rounds, 60 client updates, final test accuracy 0.")


def test_an_embedded_ray_run_says_when_it_starts_ray_and_its_actors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml",
                           "execution.rounds=1", "runtime.num_cpus=2", f"output.dir={tmp_path}"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert "starting Ray (2 CPUs) …" in err and "starting 2 client actors …" in err
    assert err.index("starting Ray (2 CPUs) …") < err.index("starting 2 client actors …") < len(err) - 1
