"""New-client evaluation: the held-out clients never train (no task names one), each evaluation
tests the global model on them and after their own adaptation, the personalized evaluation reports
its worst decile and spread over clients, and bad input is one line."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import small_scenario

import raysim
from raysim.cli import main


@pytest.mark.parametrize("selection", ["uniform", "oort"])
def test_held_out_clients_never_train_and_are_tested_after_adapting(tmp_path, selection):
    result = raysim.run(small_scenario(tmp_path, "eval.new_clients=8", "eval.personalized_steps=2",
                                       f"execution.selection.kind={selection}", "execution.rounds=6",
                                       "execution.over_selection=1.5", "execution.deadline=2",
                                       "system.compute.kind=lognormal", "system.compute.seconds_per_sample=0.01"))
    held_out = result.summary["new_clients"]
    assert len(held_out) == 8 == len(set(held_out))
    events = pq.read_table(f"{result.output_dir}/events.parquet").to_pandas()
    assert not set(events.client_id) & set(held_out)  # no task, kept, late or dropped, ever named one
    assert events.client_id.nunique() > 20  # while the others did take part
    rounds = pq.read_table(f"{result.output_dir}/rounds.parquet").to_pandas()
    tested = rounds[rounds.test_accuracy.notna()]
    assert tested.new_client_accuracy.notna().all() and tested.new_client_personalized_accuracy.notna().all()
    assert (tested.personalized_accuracy_p10 <= tested.personalized_accuracy_mean).all()
    assert (tested.personalized_accuracy_std > 0).all()
    summary = json.loads(open(f"{result.output_dir}/summary.json").read())
    assert summary["final_new_client_accuracy"] == tested.new_client_accuracy.iloc[-1]


def test_without_held_out_clients_nothing_changes(tmp_path):
    plain = raysim.run(small_scenario(tmp_path / "a", "execution.rounds=2"))
    rounds = pq.read_table(f"{plain.output_dir}/rounds.parquet").to_pandas()
    assert plain.summary["new_clients"] == [] and rounds.new_client_accuracy.isna().all()
    assert np.isnan(rounds.personalized_accuracy_p10).all()  # no personalized evaluation asked for


@pytest.mark.parametrize("overrides, line", [
    (["eval.new_clients=90"], "eval.new_clients = 90: expected at most 80: the 100 clients less those a round samples"),
    (["eval.new_clients=5", "execution.mode=async", "execution.max_updates=10"],
     "eval.new_clients = 5: expected 0 in async mode"),
    (["eval.new_clients=5", "execution.sampling=poisson"],
     "eval.new_clients = 5: expected 0 with execution.sampling=poisson"),
    (["eval.new_clients=20", "eval.clients=90"], "eval.clients = 90: expected null (every client) or an integer in "
                                                 "[1, 80]"),
])
def test_bad_new_client_input_is_one_line(capsys, overrides, line):
    assert main(["validate", "scenarios/quickstart.yaml", "runtime.backend=local", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {line}"), err
