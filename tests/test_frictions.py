"""A new user's frictions from issue 41, section 2, each with the behaviour that replaced it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from raysim.data.partition import dirichlet
from tests.test_bad_input import cli, one_error_line

DIGITS_500 = ["data.kind=digits", "data.num_clients=500", "data.partition.kind=dirichlet",
              "execution.clients_per_round=10"]


def test_a_dirichlet_split_that_cannot_fill_the_clients_says_how_to_and_how_many_it_can():
    """digits with 500 clients failed at every alpha with 'expected a larger alpha or fewer clients'."""
    done = cli("validate", "scenarios/quickstart.yaml", *DIGITS_500, "data.partition.alpha=100")
    assert done.returncode == 2
    assert one_error_line(done.stderr) == (
        "error: data.num_clients = 500: expected a population Dirichlet(alpha=100) can fill: no draw in 1000 gave "
        "every client a sample (1797 samples, 3.59 per client); set data.partition.min_size (with 1 every client "
        "first takes a sample at random, which fills up to 1797 clients) or take fewer clients")
    done = cli("validate", "scenarios/quickstart.yaml", *DIGITS_500, "data.partition.min_size=4")
    assert one_error_line(done.stderr) == ("error: data.partition.min_size = 4: expected at most 3 so that 500 "
                                           "clients' samples fit in 1797 (or at most 449 clients)")


def test_min_size_gives_every_client_its_samples_and_keeps_the_label_skew():
    from sklearn.datasets import load_digits

    labels = load_digits().target
    for alpha in (0.3, 100.0):
        train, test = dirichlet(labels, 500, alpha, 0.2, seed=3, min_size=3)
        sizes = np.array([len(a) + len(b) for a, b in zip(train, test)])
        assert sizes.min() >= 3 and sizes.sum() == len(labels)
        assert len(np.unique(np.concatenate(train + test))) == len(labels)  # each sample once
        again, _ = dirichlet(labels, 500, alpha, 0.2, seed=3, min_size=3)
        assert all(np.array_equal(a, b) for a, b in zip(train, again))
    skewed, _ = dirichlet(labels, 50, 0.3, 0.0, seed=0, min_size=1)
    classes = [len(np.unique(labels[idx])) for idx in skewed]
    assert np.median(classes) < 10  # most clients still miss classes at alpha 0.3


def test_every_key_a_switch_to_async_leaves_behind_is_named_in_one_message(tmp_path):
    """Switching sync -> async took three runs, one ~key per error."""
    scenario = tmp_path / "sync.yaml"
    scenario.write_text("name: switch\ndata: {kind: gaussian_mixture, num_clients: 40}\n"
                        "model: {kind: mlp, hidden: [16]}\n"
                        "algorithm: {name: fedavg, lr: 0.05}\n"
                        "execution: {mode: sync, rounds: 3, clients_per_round: 10, deadline: 5.0}\n"
                        f"runtime: {{backend: local}}\noutput: {{dir: {tmp_path}}}\n")
    done = cli("validate", str(scenario), "execution.mode=async", "execution.max_updates=100")
    assert done.returncode == 2
    sync_only = "it applies only with execution.mode = sync (here execution.mode = 'async')"
    assert one_error_line(done.stderr) == (
        f"error: execution.rounds = 3: expected no setting ({sync_only}); nor does execution.clients_per_round = 10 "
        f"({sync_only}); nor does execution.deadline = 5.0 ({sync_only}); ~execution.rounds "
        "~execution.clients_per_round ~execution.deadline unset them")
    fixed = cli("validate", str(scenario), "execution.mode=async", "execution.max_updates=100", "~execution.rounds",
                "~execution.clients_per_round", "~execution.deadline")
    assert fixed.returncode == 0, fixed.stderr


def test_validate_shows_the_time_scale_a_deadline_is_set_against(tmp_path):
    """execution.deadline: 5.0 silently made nothing late when tasks take 0.12-0.2 virtual s."""
    from raysim.engine.scheduler import task_durations
    from raysim.preparation import prepare
    from raysim.scenario import load_scenario

    args = ["scenarios/quickstart.yaml", "execution.deadline=5.0", "runtime.backend=local"]
    done = cli("validate", *args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("ok: scenarios/quickstart.yaml: 100 clients") and len(lines) == 2
    seconds = task_durations(*(lambda p: (p.scenario, p.dataset.table))(
        prepare(load_scenario(args[0], args[1:]), create_output=False)))
    median, p90, p99 = np.quantile(seconds, [0.5, 0.9, 0.99])
    assert 0.05 < median < p90 < p99 < 1.0  # the quickstart's tasks take a fraction of a virtual second
    assert lines[1] == (f"task durations: median {median:.3g}, p90 {p90:.3g}, p99 {p99:.3g} virtual s (first task "
                        "of 100 clients); execution.deadline 5 leaves 0.0% of them late")
    stragglers = cli("validate", "scenarios/stragglers/sync_deadline.yaml", "runtime.backend=local")
    assert stragglers.stdout.strip().splitlines()[1].endswith("execution.deadline 30 leaves 13.8% of them late")


def test_the_closing_line_gives_the_share_of_updates_that_did_not_count(tmp_path):
    done = cli("run", "scenarios/stragglers/sync_deadline.yaml", "execution.rounds=5", "runtime.backend=local",
               f"output.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    late = summary["tasks"]["late"]
    total = late + summary["tasks"]["applied"]
    assert late > 0 and f"client updates ({late} late of {total} tasks: {late / total:.1%}), final test accuracy" \
        in done.stdout.strip().splitlines()[-1]


def test_report_legends_and_timeline_titles_keep_sub_second_virtual_times(tmp_path):
    """'0.4 at 0 virtual s': a legend rounded a sub-second virtual time to 0."""
    from test_report import make_run

    from raysim.report.figures import _lines_figure, _timeline_figure, load_runs

    runs = load_runs([make_run(tmp_path / "fast", "fast", virtual=True, time_scale=0.04)])
    ax = _lines_figure(runs, "virtual_time", ("test_accuracy",), "Accuracy", "accuracy", target=0.5).axes[0]
    assert ax.get_legend().get_texts()[0].get_text() == "fast (0.5 at 0.04 virtual s)"
    runs[0].events["virtual_start"] = runs[0].events["virtual_start"] / 100  # tasks within half a virtual second
    runs[0].events["virtual_end"] = runs[0].events["virtual_end"] / 100
    title = _timeline_figure(runs).axes[0].get_title()
    assert title.startswith("fast: ") and not title.endswith("virtual s 0") and float(title.split()[-1]) < 1


def test_a_synchronous_staleness_histogram_has_one_integer_tick():
    """A sync run's staleness is 0 everywhere: the histogram had ticks at -0.45 ... 0.45."""
    from raysim.report.figures import _panel_histograms

    fig = _panel_histograms("Staleness", "staleness", "updates", [("sync", np.zeros(50, dtype=int))])
    fig.canvas.draw()
    ticks = [t for t in fig.axes[-1].get_xticks() if -0.5 <= t <= 0.5]
    assert ticks == [0.0]


def test_the_runs_table_shows_final_personalized_accuracy(tmp_path):
    from test_report import make_run

    from raysim.report.figures import load_runs
    from raysim.report.html import _summary

    path = make_run(tmp_path / "p", "p", virtual=False, personalized=True)
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    summary.update(final_personalized_accuracy=0.8125, final_personalized_accuracy_mean=0.79)
    (tmp_path / "p" / "summary.json").write_text(json.dumps(summary))
    header, rows = _summary(load_runs([path]), None)
    assert rows[0][header.index("final personalized accuracy")] == "0.8125"
    assert rows[0][header.index("final personalized accuracy mean")] == "0.7900"
    plain, _ = _summary(load_runs([make_run(tmp_path / "q", "q", virtual=False)]), None)
    assert "final personalized accuracy" not in plain


def test_the_server_state_example_of_the_guide_runs_as_it_says(tmp_path):
    """docs/custom_algorithm.md never described server-side state (state.extra, init_extra)."""
    import pyarrow.parquet as pq

    import raysim
    from conftest import small_scenario

    guide = (Path(__file__).parent.parent / "docs" / "custom_algorithm.md").read_text()
    example = (Path(__file__).parent.parent / "examples" / "server_warmup.py").read_text()
    shown = guide.split("## Server-side state")[1].split("```python\n")[1].split("```")[0]
    assert shown.strip() in example  # the guide shows the file's code, not a copy that could drift
    cfg = small_scenario(tmp_path, "algorithm.name=examples.server_warmup:FedAvgWarmup", "algorithm.warmup_steps=4",
                         "execution.rounds=6")
    raysim.run(cfg)
    warmup = pq.read_table(tmp_path / "out" / "rounds.parquet").column("warmup").to_pylist()
    assert warmup == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_a_steady_rate_from_too_short_a_window_is_flagged_in_the_plot():
    """A sweep of very short runs showed noise as parallel efficiency (1.95 on 2 actors)."""
    from raysim.sweep.plots import _plot
    from raysim.sweep.results import too_short

    def row(actors, ups, seconds):
        return {"runtime.num_actors": actors, "status": "completed", "steady_updates_per_second": ups,
                "steady_seconds": seconds, "output_dir": f"/x/actors={actors}"}

    short = [row(1, 100.0, 0.3), row(2, 390.0, 0.2)]
    assert too_short(short) == short
    title = _plot(short, [], "parallel_efficiency", "runtime.num_actors").axes[0].get_title()
    assert "steady window under 2 s at some points: noise" in title
    long = [row(1, 100.0, 30.0), row(2, 190.0, 25.0)]
    assert too_short(long) == []
    assert "noise" not in _plot(long, [], "parallel_efficiency", "runtime.num_actors").axes[0].get_title()
