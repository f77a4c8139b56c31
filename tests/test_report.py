"""Report plots and report.html from synthetic run directories: which PNGs are written, axis scales, the
target line, labels, timeline lanes, the self-contained page, runs read from URIs, errors."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from matplotlib.image import imread
from matplotlib.legend import Legend

from raysim.errors import ScenarioError
from raysim.output.directory import PLOTS, REPORT_HTML, OutputDir
from raysim.report.figures import (assign_lanes, load_runs, read_columns, run_labels, time_to_accuracy_table,
                                   write_report, _lines_figure)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALWAYS = ["accuracy_vs_round.png", "accuracy_vs_virtual_time.png", "accuracy_vs_wall_time.png",
          "accuracy_vs_bytes_up.png", "loss_vs_round.png",
          "loss_vs_virtual_time.png", "loss_vs_wall_time.png", "participation_per_client.png"]
QUADRATIC = ["loss_vs_round.png", "loss_vs_virtual_time.png", "loss_vs_wall_time.png", "diagnostics_vs_round.png",
             "participation_per_client.png"]


def make_run(path, name: str, virtual: bool, seed: int = 0, tasks: int = 400, time_scale: float = 2.5,
             quadratic: bool = False, personalized: bool = False, byzantine: bool = False,
             private: bool = False) -> str:
    """A run directory like the simulator's; ``virtual`` adds the virtual-time scheduler's columns,
    ``quadratic`` exact diagnostics instead of accuracy, ``private`` the ε spent (at the evaluations)."""
    rng = np.random.default_rng(seed)
    os.makedirs(path)
    rounds = 10
    accuracy = [None if r % 3 else 0.5 + (0.04 - 0.01 * seed) * r for r in range(rounds)]  # evaluated every 3rd round
    columns = {
        "round": np.arange(1, rounds + 1), "virtual_time": np.arange(1, rounds + 1) * time_scale,
        "wall_time": np.cumsum(rng.uniform(0.1, 0.3, rounds)),
        "train_loss": rng.uniform(0.1, 1.0, rounds),
        "test_loss": pa.array([None if a is None else 1 - a for a in accuracy], pa.float64()),
        "test_accuracy": pa.array(accuracy, pa.float64()),
        "parameters": pa.array([None] * rounds, pa.list_(pa.float64())),
    }
    if quadratic:
        columns.update(test_loss=pa.array([None] * rounds, pa.float64()), test_accuracy=pa.array([None] * rounds,
                                                                                                  pa.float64()),
                       rel_error=0.5 ** (3 * np.arange(rounds)), grad_norm_sq=10.0 ** -np.arange(rounds),
                       loss_gap=np.geomspace(1.0, 1e-6, rounds))
    if personalized:
        columns.update(personalized_accuracy=pa.array([None if a is None else a + 0.1 for a in accuracy]),
                       personalized_accuracy_mean=pa.array([None if a is None else a + 0.08 for a in accuracy]),
                       personalized_accuracy_ci95=pa.array([None if a is None else 0.02 for a in accuracy]))
    columns["total_bytes_up"] = np.cumsum(rng.integers(10_000, 20_000, rounds))  # every run has its bytes
    if private:
        columns["epsilon"] = pa.array([None if a is None else 0.3 * (r + 1) ** 0.5 for r, a in enumerate(accuracy)])
    pq.write_table(pa.table(columns), os.path.join(path, "rounds.parquet"))
    events = {
        "round": rng.integers(1, rounds + 1, tasks), "client_id": rng.integers(0, 50, tasks),
        "actor": rng.integers(0, 4, tasks), "samples": rng.integers(10, 100, tasks),
        "train_loss": rng.uniform(0.1, 1.0, tasks), "compute_seconds": rng.uniform(0.01, 0.1, tasks),
    }
    if virtual:
        start = rng.uniform(0, 25, tasks)
        status = rng.choice(["applied", "applied", "late", "dropped", "failed", "stale"], tasks).tolist()
        status[0] = None
        events.update(virtual_start=start, virtual_end=start + rng.uniform(0.5, 3.0, tasks),
                      model_version=rng.integers(0, rounds, tasks), staleness=rng.integers(0, 5, tasks),
                      status=pa.array(status, pa.string()).dictionary_encode())
    if byzantine:
        events["byzantine"] = events["client_id"] < 10
    pq.write_table(pa.table(events), os.path.join(path, "events.parquet"))
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"name": name, "rounds": rounds, "status": "completed", "mode": "sync",
                   "final_test_accuracy": None if quadratic else accuracy[-1], "final_test_loss": 0.25,
                   "wall_seconds": 3.5, "virtual_time": rounds * time_scale, "client_updates": 120,
                   "model_sha256": f"{seed:064x}", "tasks": {"applied": 120, "late": 3}}, f)
    with open(os.path.join(path, "scenario.yaml"), "w") as f:
        yaml.safe_dump({"name": name, "seed": seed, "algorithm": {"name": "fedavg", "lr": 0.05 * (seed + 1)},
                        "output": {"dir": str(path)}}, f)
    return str(path)


def assert_png(path: str) -> None:
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert os.path.getsize(path) > 5_000


def test_report_of_several_runs_writes_every_plot(tmp_path):
    runs = [make_run(tmp_path / "alpha_1", "alpha", virtual=True, personalized=True, byzantine=True, private=True),
            make_run(tmp_path / "beta", "beta", virtual=False, seed=1),
            make_run(tmp_path / "alpha_2", "alpha", virtual=False, seed=2),
            make_run(tmp_path / "quad", "quad", virtual=False, seed=3, quadratic=True)]
    written = write_report(runs)
    assert written == [str(tmp_path / "report" / name) for name in [*PLOTS, REPORT_HTML]]
    for path in written[:-1]:
        assert_png(path)


def test_plots_without_columns_in_any_run_are_skipped(tmp_path):
    run = make_run(tmp_path / "beta", "beta", virtual=False)
    written = write_report([run])
    assert [os.path.basename(p) for p in written] == [*ALWAYS, REPORT_HTML]
    assert all(os.path.dirname(p) == run for p in written)  # one run: written into the run directory
    assert not (tmp_path / "beta" / "timeline.png").exists()
    assert not (tmp_path / "beta" / "staleness_histogram.png").exists()
    quadratic = make_run(tmp_path / "quad", "quad", virtual=False, quadratic=True)
    assert [os.path.basename(p) for p in write_report([quadratic])] == [*QUADRATIC, REPORT_HTML]


def test_explicit_out_dir_is_created(tmp_path):
    run = make_run(tmp_path / "alpha", "alpha", virtual=True)
    written = write_report([run], out_dir=str(tmp_path / "plots" / "x"))
    assert sorted(os.listdir(tmp_path / "plots" / "x")) == sorted([*ALWAYS, "staleness_histogram.png",
                                                                    "timeline.png", REPORT_HTML])
    assert len(written) == len(ALWAYS) + 3


def test_runs_are_read_from_uris(tmp_path):
    runs = [make_run(tmp_path / "a", "a", virtual=True), make_run(tmp_path / "b", "b", virtual=False, seed=1)]
    written = write_report([f"file://{r}" for r in runs], target=0.55)
    assert written[0] == str(tmp_path / "report" / "accuracy_vs_round.png")
    assert os.path.isfile(tmp_path / "report" / REPORT_HTML)


def test_axes_are_logarithmic_where_values_span_decades_and_the_target_is_drawn(tmp_path):
    runs = load_runs([make_run(tmp_path / "slow", "slow", virtual=False, time_scale=1000.0),
                      make_run(tmp_path / "fast", "fast", virtual=False, seed=1, time_scale=1.0)])
    fig = _lines_figure(runs, "virtual_time", ("test_accuracy",), "Test accuracy", "accuracy", target=0.55)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["slow (0.55 at 4,000 virtual s)", "fast (0.55 at 4 virtual s)", "target 0.55"]
    assert any(list(line.get_ydata()) == [0.55, 0.55] for line in ax.get_lines())  # the horizontal line
    close = _lines_figure(runs[1:], "virtual_time", ("test_accuracy",), "Test accuracy", "accuracy", target=0.9)
    assert close.axes[0].get_xscale() == "linear"
    assert [t.get_text() for t in close.axes[0].get_legend().get_texts()][0] == "fast (0.9 not reached)"
    assert "| slow | 4,000 |" in time_to_accuracy_table([str(tmp_path / "slow")], 0.55)


def test_runs_and_line_styles_share_one_legend(tmp_path):
    runs = load_runs([make_run(tmp_path / "a", "a", virtual=False), make_run(tmp_path / "b", "b", virtual=False, seed=1)])
    ax = _lines_figure(runs, "round", ("train_loss", "test_loss"), "Loss", "loss").axes[0]
    legends = [artist for artist in ax.get_children() if isinstance(artist, Legend)]
    assert legends == [ax.get_legend()]  # a second legend could cover the first
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "train_loss", "test_loss"]


class _Page(HTMLParser):
    """The images and table cells of a page."""

    def __init__(self):
        super().__init__()
        self.images, self.cells, self._cell = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag == "td":
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td":
            self.cells.append(self._cell)
            self._cell = None


def test_report_html_embeds_every_plot_and_every_run(tmp_path):
    runs = [make_run(tmp_path / "alpha", "alpha", virtual=True),
            make_run(tmp_path / "beta", "beta", virtual=False, seed=1),
            make_run(tmp_path / "quad", "quad", virtual=False, seed=2, quadratic=True)]
    written = write_report(runs, target=0.5)
    page = _Page()
    with open(written[-1]) as f:
        page.feed(f.read())
    assert len(page.images) == len(written) - 1
    for src in page.images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        png = base64.b64decode(src[len(prefix):], validate=True)
        assert png.startswith(PNG_SIGNATURE)
        image = imread(io.BytesIO(png), format="png")
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
    for name in ("alpha", "beta", "quad"):
        assert name in page.cells
    assert "0" * 12 in page.cells and "1.000e-09" in page.cells  # model_sha256 (short), quad's last grad_norm_sq
    differences = {page.cells[i]: page.cells[i + 1:i + 4] for i, c in enumerate(page.cells)
                   if c in ("seed", "algorithm.lr", "name", "algorithm.name")}
    assert differences["seed"] == ["0", "1", "2"] and "algorithm.lr" in differences
    assert "algorithm.name" not in differences  # the same in every run


BROWSER = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(name)), None)
# appended to a copy of report.html: after the page has loaded, writes what the browser made of each image
_IMAGE_PROBE = """<script>window.addEventListener("load", () => {
  const rows = [...document.images].map(i => `${i.alt}:${i.complete}:${i.naturalWidth}x${i.naturalHeight}`);
  document.body.insertAdjacentHTML("beforeend", `<pre id="probe">${rows.join("\\n")}</pre>`);
});</script>"""


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium (apt-get install chromium)")
def test_report_html_images_load_in_a_headless_browser(tmp_path):
    runs = [make_run(tmp_path / "alpha", "alpha", virtual=True), make_run(tmp_path / "beta", "beta", virtual=False)]
    written = write_report(runs, out_dir=str(tmp_path / "report"), target=0.5)
    page = tmp_path / "probe.html"
    page.write_text(open(written[-1]).read().replace("</body>", _IMAGE_PROBE + "</body>"))
    dom = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    probe = dom.rsplit('<pre id="probe">', 1)[1].split("</pre>", 1)[0].split("\n")  # the element, not the script
    assert [row.split(":")[0] for row in probe] == [os.path.basename(p) for p in written[:-1]]
    for row in probe:
        name, complete, size = row.split(":")
        width, height = map(int, size.split("x"))
        assert complete == "true" and width > 400 and height > 200, row  # decoded, at the PNG's own size


def test_labels_are_names_deduplicated_by_directory():
    assert run_labels(["alpha", "beta", "alpha"], ["r/alpha_1", "r/beta/", "r/alpha_2"]) == \
        ["alpha_1", "beta", "alpha_2"]
    assert run_labels([None, "x"], ["r/interrupted", "r/y"]) == ["interrupted", "x"]
    assert run_labels(["a", "a"], ["r1/run", "r2/run"]) == ["r1/run", "r2/run"]


def test_lanes_never_overlap_and_are_lowest_free():
    assert assign_lanes([0, 1, 2, 3], [2, 3, 4, 5]).tolist() == [0, 1, 0, 1]  # touching ends share a lane
    assert assign_lanes([5, 0, 1], [6, 10, 2]).tolist() == [1, 0, 1]  # input order kept
    rng = np.random.default_rng(0)
    starts = rng.uniform(0, 100, 500)
    ends = starts + rng.exponential(5, 500)
    lanes = assign_lanes(starts, ends)
    for lane in np.unique(lanes):
        order = np.argsort(starts[lanes == lane])
        s, e = starts[lanes == lane][order], ends[lanes == lane][order]
        assert np.all(s[1:] >= e[:-1])
    order = np.argsort(starts, kind="stable")
    for k, i in enumerate(order):  # the lowest lane not held by an earlier task still running
        earlier = order[:k]
        busy = set(lanes[earlier][ends[earlier] > starts[i]].tolist())
        assert lanes[i] == min(set(range(len(busy) + 1)) - busy)


def test_dictionary_status_nulls_stay_null(tmp_path):
    run = make_run(tmp_path / "alpha", "alpha", virtual=True)
    status = read_columns(OutputDir.open(run, create=False), "events.parquet", ("status",))["status"]
    assert status[0] is None and sum(s is None for s in status) == 1


@pytest.mark.parametrize("setup", ["missing", "empty"])
def test_bad_run_directory_is_a_scenario_error(tmp_path, setup):
    good = make_run(tmp_path / "good", "good", virtual=False)
    bad = tmp_path / "bad"
    if setup == "empty":
        bad.mkdir()
    with pytest.raises(ScenarioError) as err:
        write_report([good, str(bad)])
    assert str(err.value) == f"report = {str(bad)!r}: expected a run directory (one with rounds.parquet)"
    assert not (tmp_path / "report").exists()  # nothing written before the check


@pytest.mark.parametrize("target", ["0", "1.5", "-0.2"])
def test_a_target_outside_the_accuracy_range_is_one_line(tmp_path, capsys, target):
    from raysim.cli import main

    assert main(["report", str(tmp_path), "--target", target]) == 2
    assert capsys.readouterr().err.strip() == f"error: --target = {float(target)}: expected a test accuracy in (0, 1]"
