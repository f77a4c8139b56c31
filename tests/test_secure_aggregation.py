"""Secure aggregation, simulated: with enough bits the server's decoded sum is the plain mean up to
the quantization, with too few it wraps around, a round with fewer survivors than the threshold
fails cleanly, the protocol's bytes and round trips are priced in virtual time, the downlink's
encoding is what clients receive, and bad input is one line."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import small_scenario

import raysim
from raysim.algorithms import ClientUpdates
from raysim.cli import main
from raysim.communication.config import SecureAggregationConfig
from raysim.communication.secure_aggregation import (EXTRA_ROUND_TRIPS, ID_BYTES, KEY_BYTES, SHARE_BYTES,
                                                     SecureAggregation)
from raysim.pipeline.compression import encode_model
from raysim.pipeline.secure_aggregation import SecureQuantize, SecureSum
from raysim.pipeline.stage import ServerInput

SECAGG = "communication.secure_aggregation"


class Context:  # what a client stage reads of a task: the clients' streams
    def __init__(self, clients):
        self.rngs = [np.random.default_rng(c) for c in range(clients)]


def secure_mean(vectors: torch.Tensor, **settings) -> tuple[torch.Tensor, float]:
    """(what the server decodes for each row, the quantization step range / Q) of ``vectors``."""
    protocol = SecureAggregation(SecureAggregationConfig(protocol="secagg", **settings), len(vectors), len(vectors))
    m = len(vectors)
    updates = ClientUpdates(np.arange(m), np.ones(m), np.zeros(m), vectors)
    quantized = SecureQuantize(protocol).update(updates, Context(m), [{}] * m)
    step, _ = SecureSum(protocol).update(ServerInput(quantized, np.full(m, 1 / m), 0), {})
    return step.updates.vector, protocol.cfg.range / protocol.largest_value


def test_with_enough_bits_the_secure_sum_is_the_plain_mean_up_to_the_quantization():
    vectors = torch.from_numpy(np.random.default_rng(0).uniform(-0.9, 0.9, (50, 300)))
    decoded, step = secure_mean(vectors, bits=32, value_bits=12, range=1.0)  # 50 × 2047 < 2^31
    mean = vectors.mean(0)
    assert torch.equal(decoded, decoded[:1].expand_as(decoded))  # every row: the one mean the server knows
    error = (decoded[0] - mean).abs()
    assert float(error.max()) < step  # each client's entry is off by less than one step
    assert float(error.max()) > 0  # and the rounding is real
    # stochastic rounding is unbiased: the errors of 300 entries average out far below one step
    assert abs(float((decoded[0] - mean).mean())) < step / 10


def test_with_too_few_bits_the_sum_wraps_around():
    vectors = torch.full((20, 10), 29490.0, dtype=torch.float64)  # every client near +range, on the grid
    decoded, step = secure_mean(vectors, bits=16, value_bits=16, range=32767.0)  # a step of 1
    # the sum 20 · 29490 leaves [−2^15, 2^15) and comes back modulo 2^16
    wrapped = (20 * 29490 + 2 ** 15) % 2 ** 16 - 2 ** 15
    assert step == 1 and torch.equal(decoded[0], torch.full((10,), wrapped / 20, dtype=torch.float64))
    assert wrapped / 20 != 29490


def test_the_quantized_entries_are_clipped_to_the_range_and_counted():
    protocol = SecureAggregation(SecureAggregationConfig(protocol="secagg", range=0.5), 2, 2)
    vectors = torch.tensor([[0.1, 0.7, -2.0, 0.0], [0.2, 0.3, 0.4, -0.1]], dtype=torch.float64)
    out = SecureQuantize(protocol).update(ClientUpdates(np.arange(2), np.ones(2), np.zeros(2), vectors), Context(2),
                                          [{}] * 2)
    assert torch.equal(out.diagnostics["secagg_clipped"], torch.tensor([0.5, 0.0], dtype=torch.float64))
    assert float(out.vector.abs().max()) == protocol.largest_value
    assert torch.equal(out.vector, out.vector.round())


def _params(result) -> torch.Tensor:
    state = torch.load(f"{result.output_dir}/model.pt")
    return torch.cat([t.reshape(-1).double() for t in state.values()])


def _run(tmp_path, *overrides):
    result = raysim.run(small_scenario(tmp_path, *overrides))
    out = result.output_dir
    return result, pq.read_table(f"{out}/rounds.parquet").to_pandas(), pq.read_table(f"{out}/events.parquet").to_pandas()


NETWORK = ["system.network.kind=constant", "system.network.down_mbps=10", "system.network.up_mbps=1",
           "system.network.latency_s=0.5", "system.compute.seconds_per_sample=1e-9"]


def test_a_round_is_priced_with_the_protocols_bytes_round_trips_and_unmasking(tmp_path):
    result, rounds, events = _run(tmp_path, *NETWORK, f"{SECAGG}.protocol=secagg_plus", f"{SECAGG}.bits=24",
                                  f"{SECAGG}.value_bits=12", f"{SECAGG}.unmask_seconds_per_entry=1e-6",
                                  "execution.rounds=2", "execution.over_selection=1.5")
    P = result.summary["model"]["parameters"]
    m, k = 18, 12  # sampled (12 × 1.5) and kept
    neighbors = 9  # ⌈2 log₂ 18⌉
    up = 2 * KEY_BYTES + neighbors * (SHARE_BYTES + KEY_BYTES) + int(np.ceil(24 * P / 8))
    down = 4 * P + neighbors * (2 * KEY_BYTES + SHARE_BYTES + ID_BYTES)
    assert (events.bytes_up == up).all() and (events.bytes_down == down).all()
    expected = 2 * (1 + EXTRA_ROUND_TRIPS) * 0.5 + down * 8 / 10e6 + up * 8 / 1e6
    np.testing.assert_allclose(events.virtual_end - events.virtual_start, expected, rtol=0, atol=1e-5)
    # the round ends when its last kept update is in, plus the server's unmasking: 12 survivors'
    # own masks and 6 dropped clients' masks with (at most) 9 surviving neighbours each
    unmask = 1e-6 * P * (k + (m - k) * neighbors)
    assert (events.status.value_counts().to_dict() == {"applied": 2 * k, "dropped": 2 * (m - k)})
    np.testing.assert_allclose(np.diff(rounds.virtual_time, prepend=0), expected + unmask, rtol=0, atol=1e-5)


def test_enough_bits_train_as_the_plain_unweighted_mean(tmp_path):
    plain, _, _ = _run(tmp_path / "plain", "system.unreliable.weights=uniform", "execution.rounds=1")
    secure, _, _ = _run(tmp_path / "secure", f"{SECAGG}.protocol=secagg", f"{SECAGG}.bits=48",
                        f"{SECAGG}.value_bits=36", "execution.rounds=1")
    # one server step of lr 1 moves the model by the mean update: off by less than a step of 2^-35
    assert 0 < float((_params(plain) - _params(secure)).abs().max()) < 2 ** -35 + 1e-7  # 1e-7: float32 model


def test_a_round_with_fewer_survivors_than_the_threshold_fails_cleanly(tmp_path):
    result, rounds, events = _run(tmp_path, f"{SECAGG}.protocol=secagg", f"{SECAGG}.threshold=11",
                                  "system.dropout=0.1", "execution.rounds=10")
    failed_rounds = rounds[rounds.aborted > 0]
    assert len(failed_rounds) and len(failed_rounds) < len(rounds)  # some rounds fail, some do not
    assert (failed_rounds.clients == 0).all() and (failed_rounds.aborted + failed_rounds.failed == 12).all()
    aborted = events[events.status == "aborted"]
    assert set(aborted["round"]) == set(failed_rounds["round"]) and (aborted.bytes_up > 0).all()
    assert aborted.train_loss.isna().all()  # never computed: the sum could not be unmasked
    # a failed round leaves the model where it was: its evaluation repeats the one before
    for r in failed_rounds["round"]:
        if r > 1:
            before = rounds[rounds["round"] == r - 1].test_accuracy.item()
            assert rounds[rounds["round"] == r].test_accuracy.item() == before
    assert result.summary["tasks"]["aborted"] == len(aborted)


def test_the_downlink_sends_the_model_rounded_to_half_precision():
    params = torch.from_numpy(np.random.default_rng(0).standard_normal(100)).float()
    half = encode_model("fp16", params)
    assert half.dtype == params.dtype and torch.equal(half, params.half().float()) and not torch.equal(half, params)
    assert torch.equal(encode_model("bf16", params), params.bfloat16().float())
    assert encode_model("none", params) is params


def test_the_downlink_halves_the_bytes_down_and_trains_from_the_rounded_model(tmp_path):
    plain, _, plain_events = _run(tmp_path / "plain", "execution.rounds=2")
    half, _, events = _run(tmp_path / "half", "communication.downlink.kind=bf16", "execution.rounds=2")
    P = plain.summary["model"]["parameters"]
    assert (plain_events.bytes_down == 4 * P).all() and (events.bytes_down == 2 * P).all()
    assert 0 < float((_params(plain) - _params(half)).abs().max()) < 0.05


@pytest.mark.parametrize("overrides, line", [
    ([f"{SECAGG}.protocol=secagg", "execution.mode=async", "execution.max_updates=10"],
     f"{SECAGG}.protocol = 'secagg': expected none in async mode (FedAsync applies each update alone"),
    ([f"{SECAGG}.protocol=secagg", f"{SECAGG}.threshold=30"],
     f"{SECAGG}.threshold = 30: expected at most execution.clients_per_round = 20"),
    ([f"{SECAGG}.protocol=secagg", f"{SECAGG}.value_bits=40"],
     f"{SECAGG}.value_bits = 40: expected at most {SECAGG}.bits = 32"),
    ([f"{SECAGG}.protocol=secagg", "algorithm.aggregator=median"],
     f"algorithm.aggregator = 'median': expected mean with {SECAGG}.protocol=secagg"),
    ([f"{SECAGG}.protocol=secagg", "communication.uplink.kind=topk"],
     f"communication.uplink.kind = 'topk': expected none with {SECAGG}.protocol=secagg"),
    ([f"{SECAGG}.protocol=shamir"], f"{SECAGG}.protocol = 'shamir': expected one of none, secagg, secagg_plus"),
    ([f"{SECAGG}.bits=16"], f"{SECAGG}.bits = 16: expected no setting"),
    ([f"{SECAGG}.protocol=secagg", f"{SECAGG}.neighbors=3"], f"{SECAGG}.neighbors = 3: expected no setting"),
    (["communication.downlink.kind=int8"], "communication.downlink.kind = 'int8': expected one of bf16, fp16, none"),
])
def test_bad_secure_aggregation_input_is_one_line(capsys, overrides, line):
    assert main(["validate", "scenarios/quickstart.yaml", "runtime.backend=local", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {line}"), err


def test_too_few_bits_for_a_round_is_a_warning_with_the_chance_of_wrapping(capsys, tmp_path):
    assert main(["validate", "scenarios/quickstart.yaml", "runtime.backend=local", f"output.dir={tmp_path}/w",
                 f"{SECAGG}.protocol=secagg", f"{SECAGG}.bits=16"]) == 0
    err = capsys.readouterr().err
    assert (f"warning: {SECAGG}.bits = 16 is too few for 20 clients of 16-bit values: their sum needs 21 bits, so it "
            "wraps around modulo 2^16 — for entries spread uniformly over ±range with probability ≈ 0.7") in err
    assert main(["validate", "scenarios/quickstart.yaml", "runtime.backend=local", f"output.dir={tmp_path}/w",
                 f"{SECAGG}.protocol=secagg"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_central_dp_noises_the_decoded_secure_sum(tmp_path):
    dp = ["privacy.mechanism=central", "privacy.noise_multiplier=0", "privacy.clip_norm=0.5", "execution.rounds=1",
          "system.dropout=0.3"]  # fewer survivors than the fixed denominator, 12
    plain, _, _ = _run(tmp_path / "plain", *dp)
    secure, _, events = _run(tmp_path / "secure", *dp, f"{SECAGG}.protocol=secagg", f"{SECAGG}.bits=48",
                             f"{SECAGG}.value_bits=36", f"{SECAGG}.range=0.5", f"{SECAGG}.threshold=1")
    applied = events[events.status == "applied"]
    assert 0 < len(applied) < 12 and (applied.norm_uploaded <= 0.5 + 1e-6).all() and (applied.secagg_clipped == 0).all()
    # clip → quantize → secure sum → (zero) noise over the fixed denominator: the clipped updates' sum
    # over 12, as without secure aggregation up to the rounding (2^-36 a survivor, below float32's own)
    assert float((_params(plain) - _params(secure)).abs().max()) < 1e-7
    mean_of_survivors, _, _ = _run(tmp_path / "survivors", *dp[3:], f"{SECAGG}.protocol=secagg",
                                   f"{SECAGG}.threshold=1")  # what secure aggregation gives without DP
    assert float((_params(plain) - _params(mean_of_survivors)).abs().max()) > 1e-3
