"""Static checks of the cluster configs in cluster/: they parse, name what raysim needs, and the
RayJob's command line is a valid raysim run. Nothing is started; no cloud or cluster is reached."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from raysim.scenario import load_scenario
from raysim.errors import ScenarioError

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"

# EC2 instance types with NVIDIA GPUs (a small, known list; extend it when aws.yaml changes).
GPU_INSTANCE_TYPES = {
    "g4dn.xlarge", "g4dn.2xlarge", "g4dn.4xlarge", "g4dn.8xlarge", "g4dn.12xlarge",
    "g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.12xlarge", "g5.48xlarge",
    "g6.xlarge", "g6.2xlarge", "g6.4xlarge", "g6.12xlarge",
    "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p4d.24xlarge", "p5.48xlarge",
}
TORCH_PIN = "torch==2.13.0"


def load_docs(relative: str) -> list:
    with open(CLUSTER / relative) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def load_one(relative: str) -> dict:
    docs = load_docs(relative)
    assert len(docs) == 1, f"{relative}: expected one YAML document, got {len(docs)}"
    return docs[0]


def test_every_yaml_parses():
    files = sorted(CLUSTER.rglob("*.yaml"))
    assert {f.relative_to(CLUSTER).as_posix() for f in files} >= {
        "aws.yaml", "kuberay/raycluster.yaml", "kuberay/rayjob.yaml"}
    for f in files:
        assert load_docs(f.relative_to(CLUSTER).as_posix()), f"{f} is empty"


# --- AWS cluster launcher --------------------------------------------------------------------

def test_aws_cluster_launcher_config():
    cfg = load_one("aws.yaml")
    assert cfg["cluster_name"]
    assert cfg["provider"]["type"] == "aws"
    assert cfg["provider"]["region"]
    assert cfg["auth"]["ssh_user"]
    types = cfg["available_node_types"]
    head = cfg["head_node_type"]
    assert head in types, f"head_node_type {head!r} is not in available_node_types"
    workers = {name: t for name, t in types.items() if name != head}
    gpu_workers = {name: t for name, t in workers.items()
                   if t["node_config"]["InstanceType"] in GPU_INSTANCE_TYPES}
    assert gpu_workers, f"no worker type with a GPU instance type: {workers}"
    for name, t in gpu_workers.items():
        assert t["max_workers"] >= 1, name
        assert 0 <= t.get("min_workers", 0) <= t["max_workers"], name
        assert t["max_workers"] <= cfg["max_workers"], name
    for t in types.values():
        assert t["node_config"]["ImageId"], "every node type names its AMI"
    assert "~/raysim" in cfg["file_mounts"]

    setup = cfg["setup_commands"]
    torch_at = [i for i, c in enumerate(setup) if TORCH_PIN in c]
    editable_at = [i for i, c in enumerate(setup) if "pip install -e" in c]
    assert torch_at, f"setup_commands must install {TORCH_PIN}"
    assert editable_at, "setup_commands must pip install -e the repository"
    assert torch_at[0] < editable_at[0], "torch must be pinned before raysim is installed"

    head_start = " ".join(cfg["head_start_ray_commands"])
    assert "ray start --head" in head_start and "--port=6379" in head_start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head_start
    assert "ray start --address=$RAY_HEAD_IP:6379" in " ".join(cfg["worker_start_ray_commands"])


def test_aws_config_matches_rays_schema():
    """The launcher's own JSON schema, when Ray (and jsonschema) are installed; ray is not imported."""
    spec = importlib.util.find_spec("ray")
    jsonschema = pytest.importorskip("jsonschema")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ray is not installed")
    schema_path = Path(list(spec.submodule_search_locations)[0]) / "autoscaler" / "ray-schema.json"
    if not schema_path.is_file():
        pytest.skip("this Ray has no autoscaler/ray-schema.json")
    validator = jsonschema.Draft7Validator(json.loads(schema_path.read_text()))
    errors = [e.message for e in validator.iter_errors(load_one("aws.yaml"))]
    assert errors == [], errors


# --- KubeRay -----------------------------------------------------------------------------------

def check_ray_cluster_spec(spec: dict, where: str):
    head = spec["headGroupSpec"]
    head_container = head["template"]["spec"]["containers"][0]
    assert head_container["image"], f"{where}: head image"
    assert head["rayStartParams"].get("num-cpus") == "0", f"{where}: the head runs the driver only"
    assert all(isinstance(v, str) for v in head["rayStartParams"].values()), \
        f"{where}: rayStartParams values must be strings"
    groups = spec["workerGroupSpecs"]
    gpu_groups = [g for g in groups
                  if any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
                         for c in g["template"]["spec"]["containers"])]
    assert gpu_groups, f"{where}: no worker group requests nvidia.com/gpu in its limits"
    for g in gpu_groups:
        assert g["groupName"]
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], f"{where}: {g['groupName']} replicas"
        assert g["maxReplicas"] >= 1


def test_raycluster():
    cfg = load_one("kuberay/raycluster.yaml")
    assert cfg["apiVersion"] == "ray.io/v1"
    assert cfg["kind"] == "RayCluster"
    assert cfg["metadata"]["name"] == "raysim"
    assert cfg["spec"]["rayVersion"]
    check_ray_cluster_spec(cfg["spec"], "raycluster.yaml")


def entrypoint_parts(entrypoint: str) -> tuple[str, list]:
    """(scenario, key=value overrides) of ``python -m raysim.cli run SCENARIO k=v … [--flags]``."""
    argv = shlex.split(entrypoint)
    assert argv[:4] == ["python", "-m", "raysim.cli", "run"], argv
    args = [a for a in argv[4:] if not a.startswith("--")]
    scenario, overrides = args[0], args[1:]
    assert all("=" in o for o in overrides), overrides
    return scenario, overrides


def test_rayjob():
    cfg = load_one("kuberay/rayjob.yaml")
    assert cfg["apiVersion"] == "ray.io/v1"
    assert cfg["kind"] == "RayJob"
    spec = cfg["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 600

    scenario, overrides = entrypoint_parts(spec["entrypoint"])
    path = REPO / scenario
    assert path.is_file(), f"the RayJob's scenario {scenario} is not in the repository"
    try:
        cfg_run = load_scenario(str(path), overrides)
    except ScenarioError as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"the RayJob's entrypoint has a bad override: {exc}")
    assert cfg_run.output.dir.startswith("/mnt/results/"), "results go to the shared volume"

    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"], "the job needs the code as a working_dir URI"
    assert "://" in runtime_env["working_dir"], "a RayJob cannot upload a local directory"
    assert isinstance(runtime_env.get("pip", []), list)

    cluster = spec["rayClusterSpec"]
    check_ray_cluster_spec(cluster, "rayjob.yaml")
    mounts = [m for c in cluster["headGroupSpec"]["template"]["spec"]["containers"]
              for m in c.get("volumeMounts", [])]
    assert "/mnt/results" in [m["mountPath"] for m in mounts], "the driver's output.dir volume"
    claims = [v["persistentVolumeClaim"]["claimName"]
              for v in cluster["headGroupSpec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == ["raysim-results"]


def test_results_pvc_is_shared():
    pvc = load_one("kuberay/results-pvc.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim"
    assert pvc["metadata"]["name"] == "raysim-results"
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]


def test_rayjob_bad_override_would_be_caught():
    """The override check above is real: an unknown key fails."""
    with pytest.raises(ScenarioError):
        load_scenario(str(REPO / "scenarios" / "quickstart.yaml"), ["runtime.gpus_per_actr=0.25"])


# --- local cluster script and README -------------------------------------------------------------

def test_local_cluster_script():
    script = CLUSTER / "local_cluster.sh"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    assert "0.0.0.0" not in text, "the local cluster must not ask for all interfaces"
    assert "--node-ip-address" in text and "127.0.0.1" in text
    for sub in ("up)", "down)", "status)"):
        assert sub in text
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    done = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        done = subprocess.run([shellcheck, str(script)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout


def test_readme_mentions_every_file():
    readme = (CLUSTER / "README.md").read_text()
    files = [f.relative_to(CLUSTER).as_posix() for f in CLUSTER.rglob("*")
             if f.is_file() and f.name != "README.md" and "__pycache__" not in f.parts]
    assert files
    missing = [f for f in files if f not in readme]
    assert not missing, f"cluster/README.md does not mention {missing}"
