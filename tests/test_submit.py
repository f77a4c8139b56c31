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
    (package / "parts.py").write_text("from raysim.algorithms.fedavg import FedAvg\n\n\n"
                                      "class Damped(FedAvg):\n    pass\n")
    scenario = tmp_path / "mine.yaml"
    scenario.write_text((REPO / "scenarios" / "quickstart.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "raysim.cli", "submit", str(scenario),
                           "algorithm.name=my_ext.parts:Damped", "--dry-run"], capture_output=True, text=True,
                          cwd=REPO, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{tmp_path / 'ext'}"})
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split()
    assert {"submitted/mine.yaml", "my_ext/parts.py", "raysim/cli.py", "actors/jobs.py"} <= set(listed)
    assert not any(f.startswith(("tests/", "docs/", "results/", ".git")) for f in listed)
    assert done.stderr.strip().endswith(
        "the job would run: python -m raysim.cli run submitted/mine.yaml algorithm.name=my_ext.parts:Damped")


def test_a_run_without_a_terminal_prints_progress_lines_and_its_closing_line(tmp_path):
    """What a job's logs hold, and what --follow streams: tqdm's bar and the status line are for terminals."""
    done = subprocess.run([sys.executable, "-m", "raysim.cli", "run", "scenarios/quickstart.yaml",
                           "execution.rounds=3", "runtime.backend=local", f"output.dir={tmp_path}"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith("round 3/3, test accuracy 0.") and "\r" not in done.stderr
    assert done.stdout.startswith("quickstart: 3 rounds, 60 client updates, final test accuracy 0.")


def on_a_terminal(*args) -> tuple[int, str]:
    """``raysim ARGS`` with stdout and stderr on a pseudo-terminal: (exit status, what it showed)."""
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", *args], stdout=follower, stderr=follower,
                            cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=300), shown.decode(errors="replace")


def test_on_a_terminal_start_up_shows_its_stages_as_a_status_line(tmp_path):
    """Start-up was 6-8 s of silence before the progress bar."""
    status, shown = on_a_terminal("run", "scenarios/quickstart.yaml", "execution.rounds=1", "runtime.num_cpus=2",
                                  f"output.dir={tmp_path}")
    assert status == 0, shown
    stages = ["building the data set (gaussian_mixture, 100 clients) …", "building the model (mlp) …",
              "starting Ray (2 CPUs) …", "starting 2 client actors …"]
    at = [shown.index("\r\x1b[K" + stage) for stage in stages]
    assert at == sorted(at)  # in order, each replacing the one before
    assert shown.index("\r\x1b[K", at[-1] + 1) < shown.index("quickstart: 1 rounds")  # erased, then the bar


def test_on_a_terminal_bad_input_found_while_building_is_still_one_line(tmp_path):
    status, shown = on_a_terminal("run", "scenarios/quickstart.yaml", "data.kind=digits", "data.num_clients=500",
                                  "data.partition.kind=dirichlet", "runtime.backend=local", f"output.dir={tmp_path}")
    assert status == 2
    visible = shown.split("\r\x1b[K")[-1]  # what stays on the screen once the status line is erased
    assert visible.strip().startswith("error: data.num_clients = 500: expected a population Dirichlet")
    assert len(visible.strip().splitlines()) == 1
