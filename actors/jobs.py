"""`raysim submit` and `raysim jobs`: runs as Ray jobs through Ray's Job Submission SDK.

The job's working_dir is a staging directory built for it (:func:`shipped_files`): the code and
scenarios the README lists (``raysim/``, ``actors/``, ``scenarios/``, ``examples/``), the scenario
or sweep file wherever it lies (under ``submitted/`` when it lies outside them, with the scenario
files a sweep names beside it) and the local code of the scenario's custom ``package.module:name``
entries (:func:`local_modules`), and nothing else: no secrets, data or results that sit in the
checkout. The job runs ``python -m raysim.cli run SCENARIO key=value …`` (or ``resume OUTPUT_DIR
…``, or ``sweep FILE …`` for a file with a ``sweep:`` section) on the cluster; the working_dir is on
the job's ``sys.path``, so the package need not be installed there.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
import time
from fnmatch import fnmatch
from pathlib import Path

from raysim.errors import RunError, ScenarioError, first_line

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("raysim", "actors", "scenarios", "examples")  # the repository's parts a job needs (README: Clusters)
SKIPPED = ("__pycache__", "*.pyc", "*.egg-info", ".*")  # never shipped from them
SUBMITTED = "submitted"  # where a scenario file from outside them goes in the working_dir
# What the job's Python needs beyond Ray and torch (a pip runtime environment, unless ``--no-pip``:
# Ray builds it on top of the node's own packages, so what is there already is not installed again).
PIP = ["omegaconf>=2.3", "pyarrow>=14", "tqdm>=4.60", "scikit-learn>=1.3", "matplotlib>=3.7", "psutil>=5.9"]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def client(address: str):
    """A JobSubmissionClient for ``address``; ScenarioError naming --address if unreachable.

    A cluster started by ``ray start`` requires Ray's authentication token: when this
    machine has one (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``)
    and ``RAY_AUTH_MODE`` is not set, it is sent."""
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH", os.path.expanduser("~/.ray/auth_token"))
    if "RAY_AUTH_MODE" not in os.environ and ("RAY_AUTH_TOKEN" in os.environ or os.path.exists(token_file)):
        os.environ["RAY_AUTH_MODE"] = "token"
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, ValueError for a bad URL, …
        raise ScenarioError("--address", address,
                            f"a reachable Ray job server, e.g. http://HEAD:8265 ({first_line(exc)})") from None


def shipped_files(scenario: str | None, scenario_files=(), modules=()) -> tuple[dict, str | None]:
    """({path in the working_dir: local file}, the scenario's path there): the files of
    :data:`SHIPPED`; ``scenario`` (a scenario or sweep file; None for ``resume``) and the
    ``scenario_files`` a sweep names, under ``submitted/`` when they lie outside :data:`SHIPPED`
    (a sweep's files keep their place relative to it); and ``modules`` (:func:`local_modules`:
    package directories or module files), at the top, where the job imports them."""
    files = {}
    for part in SHIPPED:
        files.update(_tree(REPO / part, part))
    for module in map(Path, modules):
        files.update(_tree(module, module.name) if module.is_dir() else {module.name: module})
    if scenario is None:
        return files, None
    main = Path(scenario).resolve()
    inside = _shipped_path(main)
    if inside is not None:
        return files, inside
    for other in map(lambda f: Path(f).resolve(), scenario_files):
        if _shipped_path(other) is None:
            if not other.is_relative_to(main.parent):
                raise ScenarioError("sweep.scenario", str(other), f"a scenario file beside {scenario} or below "
                                    f"its directory, or in one of {', '.join(SHIPPED)}/ (it travels with the job)")
            files[f"{SUBMITTED}/{other.relative_to(main.parent)}"] = other
    files[f"{SUBMITTED}/{main.name}"] = main
    return files, f"{SUBMITTED}/{main.name}"


def _shipped_path(path: Path) -> str | None:
    """``path`` inside the working_dir when it lies in one of :data:`SHIPPED`, else None."""
    if path.is_relative_to(REPO) and path.relative_to(REPO).parts[:1] in [(p,) for p in SHIPPED]:
        return str(path.relative_to(REPO))
    return None


def _tree(root: Path, under: str) -> dict:
    """{under/relative path: file} of every file below ``root`` but those :data:`SKIPPED`."""
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not any(fnmatch(d, pattern) for pattern in SKIPPED))
        for name in sorted(names):
            if not any(fnmatch(name, pattern) for pattern in SKIPPED):
                path = Path(folder) / name
                files[f"{under}/{path.relative_to(root)}"] = path
    return files


def stage(files: dict, into: Path) -> None:
    """Copy ``files`` ({path in the working_dir: local file}) into the directory ``into``."""
    for relative, source in files.items():
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def entrypoint(command: list) -> str:
    """The job's command line, ``python -m raysim.cli COMMAND…``: its start-up stages, plain progress
    lines and closing line are the job's logs, which ``--follow`` streams."""
    return " ".join(["python -m raysim.cli", *map(shlex.quote, command)])


def local_modules(cfg) -> list:
    """The local code that a scenario's custom ``package.module:name`` entries (``algorithm.name``,
    ``model.kind``, ``data.kind``, ``algorithm.aggregator``) live in, when it lies neither in the
    repository's shipped parts (:data:`SHIPPED`) nor among installed packages: each top-level
    package directory or module file, to ship at the top of the job's working_dir."""
    installed = {Path(p).resolve() for k, p in sysconfig.get_paths().items() if k in ("stdlib", "purelib", "platlib")}
    found = set()
    for target in (cfg.algorithm.name, cfg.model.kind, cfg.data.kind, cfg.algorithm.get("aggregator") or ""):
        if ":" not in target:
            continue
        spec = importlib.util.find_spec(target.split(":")[0].split(".")[0])  # importable: checked by validation
        where = Path(spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin).resolve()
        if _shipped_path(where) is None and not any(where.is_relative_to(p) for p in installed):
            found.add(str(where))
    return sorted(found)


def submit(address: str, command: list, follow: bool, wait: bool, pip: bool, files: dict) -> int:
    """Submit ``raysim COMMAND…`` as a job (``["run", scenario, *overrides]`` or ``["resume", run_dir,
    *overrides]``) whose working_dir holds ``files`` (:func:`shipped_files`); print the job id at
    once; optionally stream its logs; return its exit status."""
    jobs = client(address)
    logging.getLogger("ray").setLevel(logging.WARNING)  # no INFO lines about packaging the working_dir
    with tempfile.TemporaryDirectory(prefix="raysim-job-") as staging:  # uploaded by submit_job
        stage(files, Path(staging))
        runtime_env = {"working_dir": staging, **({"pip": PIP} if pip else {})}
        job_id = _submit_with_retries(jobs, entrypoint=entrypoint(command), runtime_env=runtime_env,
                                      metadata={"raysim_command": command[0], "raysim_target": command[1]})
    print(f"submitted job {job_id} to {address}", flush=True)
    if not wait:
        return 0
    try:
        if follow:
            asyncio.run(_stream(jobs, job_id))
        status = _wait(jobs, job_id)
    except KeyboardInterrupt:
        print(f"job {job_id} keeps running; stop it with: raysim jobs --address {address} --stop {job_id}",
              file=sys.stderr)
        return 130
    if status != "SUCCEEDED":
        raise RunError(f"job {job_id} {status}: {_reason(jobs, job_id)} (logs: ray job logs --address {address} {job_id})")
    print(f"job {job_id} SUCCEEDED")
    return 0


def _submit_with_retries(jobs, tries: int = 20, **job) -> str:
    """submit_job, retried while a freshly started head's job agent is not up yet."""
    for attempt in range(tries):
        try:
            return jobs.submit_job(**job)
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or attempt == tries - 1:
                raise RunError(f"the job server refused the job: {first_line(exc)}") from None
            time.sleep(1.0)


def _reason(jobs, job_id: str) -> str:
    """The job's own one-line error (raysim prints 'error: …'), else the end of Ray's message."""
    lines = [line.strip() for line in (jobs.get_job_info(job_id).message or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no message"])[-1]


async def _stream(jobs, job_id: str) -> None:
    async for lines in jobs.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def _wait(jobs, job_id: str) -> str:
    while True:
        status = str(jobs.get_job_status(job_id).value)
        if status in TERMINAL:
            return status
        time.sleep(0.5)


def list_or_stop(address: str, stop: str | None) -> int:
    """Print the cluster's jobs, or stop one."""
    jobs = client(address)
    if stop is not None:
        stopped = jobs.stop_job(stop)
        print(f"job {stop}: {'stop requested' if stopped else 'was not running'}")
        return 0
    for job in sorted(jobs.list_jobs(), key=lambda j: j.start_time or 0):
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((job.start_time or 0) / 1000))
        print(f"{job.submission_id or job.job_id}  {str(job.status.value):9s}  {started}  {job.entrypoint}")
    return 0


JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for the driver of a Ray job


def job_address() -> str | None:
    """The cluster of the Ray job this process is the driver of, else None (a ``RAY_ADDRESS``
    exported in a shell is not a job's: a run without ``runtime.address`` starts its own Ray)."""
    return os.environ.get("RAY_ADDRESS") if JOB_ENV in os.environ else None
