"""The documentation: the generated key reference matches the schema, the README stays a front door, links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from raysim.cli import main

ROOT = Path(__file__).resolve().parents[1]
KEYS = ROOT / "docs" / "keys.md"
README = ROOT / "README.md"
LINKED = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "scenarios" / "paper" / "README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_keys_md_is_the_schema_as_generated(capsys):
    from raysim.reference import COMMAND

    assert main(["list", "--markdown"]) == 0
    generated = capsys.readouterr().out
    assert KEYS.read_text(encoding="utf-8") == generated, f"docs/keys.md is stale: run {COMMAND}"


def test_keys_md_holds_every_key_of_the_schema_and_of_each_algorithm():
    from raysim.catalog import ALGORITHMS
    from raysim.scenario import Scenario
    from raysim.schema import describe

    text = KEYS.read_text(encoding="utf-8")
    paths = [k for k, _, _ in describe(Scenario) if k != "algorithm"]
    paths += [f"algorithm.{k}" for builtin in ALGORITHMS.values() for k, _, _ in describe(builtin.keys)]
    missing = sorted({p for p in paths if f"`{p}`" not in text})
    assert not missing, f"docs/keys.md lacks {missing}"
    for entry in ("system.compute.tiers[].speed", "system.network.tiers[].latency_s",
                  "system.unreliable.local_steps.mean"):  # inside lists and optional sections too
        assert f"`{entry}`" in text
    assert "`system.compute.tiers[].latency_s`" not in text  # a network tier's key is no compute tier's


def test_keys_md_says_what_a_key_allows_and_when_it_applies():
    rows = {line.split(" | ")[0].strip("| `"): line for line in KEYS.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")}
    assert rows["data.partition.alpha"].endswith("| a number > 0 | `data.kind in {digits, blobs, mnist, "
                                                 "fashion_mnist, cifar10, cifar100}` and "
                                                 "`data.partition.kind in {dirichlet, balanced_dirichlet}` |")
    assert "`execution.mode = async` and `execution.aggregation = fedbuff`" in rows["execution.buffer_size"]
    assert "`eval.personalized_steps > 0 or eval.personalized_epochs > 0`" in rows["eval.personalized_lr"]
    assert "| perfedavg |" in rows["algorithm.hessian_delta"] and "`algorithm.variant = hf`" in rows[
        "algorithm.hessian_delta"]


def test_list_markdown_of_one_algorithm_and_torch_free_reference(capsys):
    assert main(["list", "fedprox", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("`algorithm.name: fedprox`: FedProx:") and "| `algorithm.prox_mu` | `0.01` |" in out
    probe = "import sys, raysim.reference as r; r.markdown(); print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


def test_readme_is_a_front_door_of_at_most_400_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_holds_the_ci_test_command_verbatim():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert command == 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q'
    assert command in README.read_text(encoding="utf-8")


def _anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them (a repeated one gets -1, -2, …)."""
    seen: dict[str, int] = {}
    anchors = set()
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    for heading in re.findall(r"^#+\s+(.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        anchors.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return anchors


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_into_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+:", target):  # a web address
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if ROOT not in path.parents and path != ROOT or not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text(encoding="utf-8")):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to what is not in the repository: {broken}"
