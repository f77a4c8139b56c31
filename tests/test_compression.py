"""Uplink compression: the unbiased operators are unbiased, top-k keeps the k largest, every
operator's upload is the documented number of bytes, error feedback carries what an encoding left
out to the client's next update, and bad input is one line."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_scenario

import raysim
from raysim.cli import main
from raysim.communication.config import UplinkConfig, upload_bits
from raysim.pipeline.compression import encode, qsgd_levels, rand_k, scaled_sign, top_k

VECTOR = torch.from_numpy(np.random.default_rng(0).standard_normal(200)).float()


@pytest.mark.parametrize("kind, variance", [
    ("qsgd", lambda v, P: min(P / 16, math.sqrt(P) / 4) * float(v.double().norm()) ** 2),  # s = 4: Alistarh et al.
    ("randk", lambda v, P: (P / 20 - 1) * float(v.double().norm()) ** 2),  # k = 20: (P/k − 1)‖v‖²
])
def test_the_unbiased_operators_average_to_the_vector(kind, variance):
    uplink = UplinkConfig(kind=kind, levels=4, fraction=0.1)
    draws = 4000
    rng = np.random.default_rng(1)
    mean = torch.stack([encode(uplink, VECTOR[None], [rng])[0][0].double() for _ in range(draws)]).mean(0)
    error = float((mean - VECTOR.double()).norm()) ** 2
    bound = variance(VECTOR, VECTOR.numel()) / draws  # E‖mean − v‖² is at most this
    assert error <= 5 * bound, (error, bound)
    assert error > 0  # the encodings are random


def test_top_k_keeps_exactly_the_k_largest_and_sign_its_scale():
    kept = top_k(VECTOR, 20)
    largest = set(np.argsort(-VECTOR.abs().numpy())[:20].tolist())
    assert set(torch.nonzero(kept).reshape(-1).tolist()) == largest
    assert torch.equal(kept[list(largest)], VECTOR[list(largest)])
    signed = scaled_sign(VECTOR)
    assert torch.allclose(signed.abs(), torch.full_like(signed, float(VECTOR.abs().mean())))
    assert torch.equal(signed.sign(), VECTOR.sign())
    assert rand_k(VECTOR, 20, np.random.default_rng(0)).count_nonzero() == 20
    assert qsgd_levels(torch.zeros(5), 4, np.random.default_rng(0))[1].count_nonzero() == 0


@pytest.mark.parametrize("kind, extra, bits", [
    ("none", [], lambda P: 32 * P),
    ("fp16", [], lambda P: 16 * P),
    ("bf16", [], lambda P: 16 * P),
    ("qsgd", ["communication.uplink.levels=7"], lambda P: 32 + P * (1 + 3)),
    ("topk", ["communication.uplink.fraction=0.1"], lambda P: 32 * round(0.1 * P) + min(round(0.1 * P) * 11, P)),
    ("randk", ["communication.uplink.fraction=0.001"], lambda P: 32 * 1 + 11),
    ("sign", [], lambda P: 32 + P),
])
def test_each_upload_is_the_documented_number_of_bytes(tmp_path, kind, extra, bits):
    result = raysim.run(small_scenario(tmp_path, f"communication.uplink.kind={kind}", *extra, "execution.rounds=1"))
    events = pq.read_table(f"{result.output_dir}/events.parquet").to_pandas()
    P = result.summary["model"]["parameters"]  # 1,146: ⌈log₂ P⌉ = 11
    assert (events.bytes_up == math.ceil(bits(P) / 8)).all()
    assert upload_bits(UplinkConfig(kind=kind, levels=7, fraction=0.1 if kind == "topk" else 0.001), P) == bits(P)


def test_error_feedback_sends_what_was_left_out_at_the_clients_next_visit(tmp_path):
    def run(name, *overrides):
        result = raysim.run(small_scenario(tmp_path / name, "communication.uplink.kind=topk",
                                           "communication.uplink.fraction=0.01", "execution.rounds=12",
                                           "execution.clients_per_round=40", *overrides))
        return result.summary["final_test_accuracy"]

    without, with_ef = run("topk"), run("topk_ef", "communication.uplink.error_feedback=ef")
    # top-1% alone moves 11 of 1,146 entries a round; with the residual carried, the rest arrives later
    assert with_ef > without + 0.05


def test_error_feedback_loses_nothing_over_a_clients_visits():
    from raysim.algorithms import ClientUpdates
    from raysim.pipeline.compression import KEPT, UplinkCompression

    RESIDUAL = KEPT["ef"]

    class Context:  # what the stage reads of a task: the client's kept state and its streams
        def __init__(self, states):
            self.states, self.rngs = states, [np.random.default_rng(0)]

        def kept(self, name, default):
            return default if self.states is None else self.states[name]

    stage = UplinkCompression(UplinkConfig(kind="sign", error_feedback="ef"))
    rng = np.random.default_rng(3)
    state, sent, total = None, torch.zeros(50, dtype=torch.float64), torch.zeros(50, dtype=torch.float64)
    for _ in range(6):
        update = torch.from_numpy(rng.standard_normal((1, 50))).float()
        out = stage.update(ClientUpdates(np.array([0]), np.ones(1), np.zeros(1), update), Context(state), [{}])
        state = {RESIDUAL: out.states[RESIDUAL]}
        sent += out.vector[0].double()
        total += update[0].double()
    # what was sent over the visits plus what the client still holds is everything it computed
    torch.testing.assert_close(sent + state[RESIDUAL][0].double(), total, rtol=0, atol=1e-5)


def test_ef21_sends_the_encoded_change_and_catches_up_with_a_steady_update():
    from raysim.algorithms import ClientUpdates
    from raysim.pipeline.compression import KEPT, UplinkCompression, top_k

    class Context:
        def __init__(self, states):
            self.states, self.rngs = states, [np.random.default_rng(0)]

        def kept(self, name, default):
            return default if self.states is None else self.states[name]

    stage = UplinkCompression(UplinkConfig(kind="topk", fraction=0.1, error_feedback="ef21"))
    update = torch.from_numpy(np.random.default_rng(4).standard_normal((1, 50)))
    state, estimate = None, torch.zeros(1, 50, dtype=torch.float64)
    for visit in range(5):  # top-5 of 50 entries: the estimate holds the whole update after 10 visits
        out = stage.update(ClientUpdates(np.array([0]), np.ones(1), np.zeros(1), update), Context(state), [{}])
        estimate = estimate + top_k(update - estimate, 5)  # g + C(v − g), by hand
        torch.testing.assert_close(out.vector, estimate, rtol=0, atol=0)
        state = {KEPT["ef21"]: out.states[KEPT["ef21"]]}
        torch.testing.assert_close(state[KEPT["ef21"]], out.vector, rtol=0, atol=0)
        assert int((out.vector != 0).sum()) == 5 * (visit + 1)
    for _ in range(5):
        out = stage.update(ClientUpdates(np.array([0]), np.ones(1), np.zeros(1), update), Context(state), [{}])
        state = {KEPT["ef21"]: out.states[KEPT["ef21"]]}
    torch.testing.assert_close(out.vector, update, rtol=0, atol=0)


def test_elias_codes_have_their_textbook_lengths():
    from raysim.communication.config import elias_omega_bits, qsgd_elias_bits

    # ω(1) = 0, ω(2) = 10 0, ω(4) = 10 100 0, ω(16) = 10 100 10000 0, ω(100) = 10 110 1100100 0
    assert elias_omega_bits(np.array([1, 2, 3, 4, 7, 8, 16, 100])).tolist() == [1, 3, 3, 6, 6, 7, 11, 13]
    # levels (0, 2, 0, 0, −1): the norm, then position 2: ω(2), +, ω(2); gap 3: ω(3), −, ω(1)
    assert qsgd_elias_bits(np.array([0, 2, 0, 0, -1])) == 32 + (3 + 1 + 3) + (3 + 1 + 1)
    assert qsgd_elias_bits(np.zeros(7)) == 32


def test_elias_coded_uploads_are_timed_with_their_own_size(tmp_path):
    network = ["system.network.kind=constant", "system.network.down_mbps=10", "system.network.up_mbps=1",
               "system.network.latency_s=0.5", "system.compute.seconds_per_sample=1e-9"]
    result = raysim.run(small_scenario(tmp_path, *network, "communication.uplink.kind=qsgd",
                                       "communication.uplink.levels=2", "communication.uplink.coding=elias",
                                       "execution.rounds=2", "execution.deadline=1.00412", "system.dropout=0.2"))
    events = pq.read_table(f"{result.output_dir}/events.parquet").to_pandas()
    P = result.summary["model"]["parameters"]
    fixed = math.ceil((32 + P * (1 + 2)) / 8)
    sent = events[events.status != "failed"]
    assert sent.bytes_up.nunique() > 5 and (sent.bytes_up < fixed).all()  # each update its own, smaller size
    assert (events[events.status == "failed"].bytes_up == 0).all()
    duration = 2 * 0.5 + 4 * P * 8 / 10e6 + sent.bytes_up * 8 / 1e6
    np.testing.assert_allclose(sent.virtual_end - sent.virtual_start, duration, rtol=0, atol=1e-5)
    # the deadline keeps exactly the uploads whose own size brings them in by then (about half of them)
    assert set(sent.status) == {"applied", "late"}
    assert ((sent.status == "late") == (sent.virtual_end - sent.virtual_start > 1.00412)).all()


@pytest.mark.parametrize("overrides, line", [
    (["communication.uplink.kind=zip"], "communication.uplink.kind = 'zip': expected one of bf16, fp16, none, qsgd, "
                                        "randk, sign, topk"),
    (["communication.uplink.kind=topk", "communication.uplink.fraction=0"],
     "communication.uplink.fraction = 0.0: expected a number in (0, 1]"),
    (["communication.uplink.kind=qsgd", "communication.uplink.levels=0"],
     "communication.uplink.levels = 0: expected a positive integer"),
    (["communication.uplink.error_feedback=ef"], "communication.uplink.error_feedback = 'ef': expected no setting"),
    (["communication.uplink.kind=topk", "communication.uplink.error_feedback=true"],
     "communication.uplink.error_feedback = 'True': expected one of ef, ef21, none"),
    (["communication.uplink.kind=qsgd", "communication.uplink.coding=elias", "execution.mode=async",
      "execution.max_updates=10"], "communication.uplink.coding = 'elias': expected fixed in async mode"),
    (["communication.uplink.kind=topk", "communication.uplink.coding=elias"],
     "communication.uplink.coding = 'elias': expected no setting"),
    (["communication.uplink.kind=sign", "privacy.mechanism=local", "privacy.noise_multiplier=1"],
     "communication.uplink.kind = 'sign': expected none with privacy.mechanism=local"),
])
def test_bad_uplink_input_is_one_line(capsys, overrides, line):
    assert main(["validate", "scenarios/quickstart.yaml", "runtime.backend=local", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {line}"), err
