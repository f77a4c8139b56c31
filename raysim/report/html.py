"""``report.html``: one self-contained page of a report (:func:`raysim.report.figures.write_report`):
a summary table of the runs, the scenario keys whose values differ between them, and every plot,
embedded as a base64 PNG data URI (no other file is needed to show it)."""

from __future__ import annotations

import base64
import html
import math

import numpy as np

from raysim.output.directory import PLOTS
from raysim.schema import dotted_items

_STYLE = """body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}code{font-size:90%}
.wide{overflow-x:auto;max-width:100%}td,th{white-space:nowrap}"""
PERSONALIZED = ("personalized_accuracy", "personalized_accuracy_mean")  # summary.json's final_* of these
# summary columns of runs with exact diagnostics
QUADRATIC = ("rel_error", "grad_norm_sq", "loss_gap", "deployed_loss_gap")


def report_html(runs, images: dict[str, bytes], target: float | None = None) -> str:
    """The page for ``runs`` (:class:`raysim.report.figures.SavedRun`) and ``images`` (PLOTS name → PNG)."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>raysim report</title>"
             f"<style>{_STYLE}</style></head><body><h1>raysim report: {len(runs)} run(s)</h1>",
             "<h2>Runs</h2>", _table(*_summary(runs, target))]
    flat = [dict(dotted_items(run.scenario)) if isinstance(run.scenario, dict) else {} for run in runs]
    keys = sorted({k for f in flat for k in f})
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]  # a key left out counts as null
    parts.append("<h2>Scenario differences</h2>")
    if len(runs) < 2:
        parts.append("<p>One run: nothing to compare.</p>")
    elif differ:
        parts.append(_table(["key", *(run.label for run in runs)], [[k, *(f.get(k) for f in flat)]
                                                                    for k in differ]))
    else:
        parts.append("<p>The runs' scenario.yaml files are identical.</p>")
    parts.append("<h2>Plots</h2>")
    for name, png in images.items():
        data = base64.b64encode(png).decode()
        parts.append(f"<h3>{html.escape(name)}</h3><p>{html.escape(PLOTS[name])}</p>"
                     f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _summary(runs, target: float | None) -> tuple[list[str], list[list]]:
    """Header and rows of the runs' table (from summary.json, and the last diagnostics row)."""
    quadratic = [c for c in QUADRATIC if any(run.series("round", c) is not None for run in runs)]
    personalized = [c for c in PERSONALIZED if any(_finite((run.summary or {}).get(f"final_{c}")) for run in runs)]
    header = ["run", "status", "algorithm", "mode", "final test accuracy", "final test loss",
              *(f"final {c.replace('_', ' ')}" for c in personalized), *quadratic,
              "wall s", "virtual s", "updates", "model sha256"]
    if target is not None:
        header.insert(6, f"virtual s to {target:g}")
    rows = []
    for run in runs:
        s, scenario = run.summary or {}, run.scenario if isinstance(run.scenario, dict) else {}
        last = [_last(run, c) for c in quadratic]
        row = [run.label, s.get("status", "no summary"), (scenario.get("algorithm") or {}).get("name"),
               s.get("mode"), number_text(s.get("final_test_accuracy"), ".4f"),
               number_text(s.get("final_test_loss"), ".4g"),
               *(number_text(s.get(f"final_{c}"), ".4f") for c in personalized),
               *(number_text(v, ".3e") for v in last), number_text(s.get("wall_seconds"), ",.1f"),
               seconds_text(s.get("virtual_time")), s.get("client_updates"), (s.get("model_sha256") or "")[:12]]
        if target is not None:
            hit = run.reach(target)
            row.insert(6, "not reached" if hit is None else seconds_text(run.rounds["virtual_time"][hit]))
        rows.append(row)
    return header, rows


def _last(run, column: str) -> float | None:
    """The last finite value of a rounds column, or None."""
    series = run.series("round", column)
    return None if series is None else float(series[1][-1])


def _finite(value) -> bool:
    return isinstance(value, (int, float, np.number)) and math.isfinite(value)


def number_text(value, spec: str) -> str:
    """``value`` formatted, or "—" when missing or not finite."""
    return format(value, spec) if _finite(value) else "—"


def seconds_text(value) -> str:
    """Virtual seconds for a table: whole seconds from 100 on, else three significant digits."""
    return number_text(value, ",.0f" if _finite(value) and abs(value) >= 100 else ".3g")


def _table(header: list[str], rows: list[list]) -> str:
    """An HTML table, every cell escaped (None shows as "—"), scrolling sideways when wider than the page."""
    def cell(tag: str, value) -> str:
        return f"<{tag}>{html.escape('—' if value is None else str(value))}</{tag}>"

    lines = ["<div class='wide'><table>", "<tr>" + "".join(cell("th", h) for h in header) + "</tr>"]
    lines += ["<tr>" + "".join(cell("td", v) for v in row) + "</tr>" for row in rows]
    return "\n".join(lines + ["</table></div>"])
