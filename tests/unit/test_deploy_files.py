"""Review-by-test of the files CI cannot run (no Docker engine here): the Dockerfile, its
.dockerignore, the image's entrypoint, the GPU lock and prefect.yaml. The GPU deployment's job
variables are rendered into container settings by prefect-docker's own worker code and handed
to docker-py as its `create()` would; the entrypoint runs the command that worker sets. The
local deployment runs for real in tests/flows/test_deploy.py (slow)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from docker.models.containers import _create_container_args
from packaging.requirements import Requirement
from prefect.client.schemas.objects import FlowRun
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.utilities.templating import find_placeholders
from prefect_docker.worker import DockerWorker, DockerWorkerJobConfiguration

from searchrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
LOCK = ROOT / "docker" / "requirements-gpu.txt"
APP_DIR = "/opt/searchrl"  # the image's WORKDIR, where `COPY . .` puts the repository
VOLUME = PurePosixPath("/data/searchrl")  # the data volume inside the container


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest))
    return out


def _deployments() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in spec["deployments"]}


def _dockerignore_regexes() -> list[re.Pattern[str]]:
    """.dockerignore patterns as Docker matches them: Go filepath.Match per segment, `**` for
    any number of directories, no leading slash; an excluded directory excludes its files."""
    out = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pat = raw.strip()
        if not pat or pat.startswith("#"):
            continue
        assert not pat.startswith("!"), "exceptions are not modelled here: " + pat
        rx = ""
        for part in re.split(r"(\*\*/|/\*\*|\*\*|\*|\?)", pat.strip("/")):
            rx += {"**/": "(?:.*/)?", "/**": "(?:/.*)?", "**": ".*", "*": "[^/]*",
                   "?": "[^/]"}.get(part, re.escape(part))
        out.append(re.compile(rx + "(?:/.*)?"))
    return out


def _ignored(path: str, regexes: list[re.Pattern[str]]) -> bool:
    return any(rx.fullmatch(path) for rx in regexes)


def test_dockerfile_base_by_digest_lock_only_non_root() -> None:
    ins = _instructions()
    arg = next(rest for op, rest in ins if op == "ARG" and rest.startswith("BASE_IMAGE="))
    assert re.fullmatch(r"BASE_IMAGE=nvidia/cuda:[\w.-]+@sha256:[0-9a-f]{64}", arg), arg
    assert next(rest for op, rest in ins if op == "FROM") == "${BASE_IMAGE}"
    pip = [rest for op, rest in ins if op == "RUN" and "pip install" in rest]
    # One resolution, the lock's: every install takes no dependencies of its own, and the only
    # requirement file is the hashed lock (no separate torch that vLLM would replace).
    assert pip and all("--no-deps" in cmd for cmd in pip), pip
    assert any("--require-hashes" in cmd and "-r docker/requirements-gpu.txt" in cmd
               for cmd in pip), pip
    assert not any(re.search(r"\btorch\b|\.\[", cmd) for cmd in pip), pip
    users = [i for i, (op, rest) in enumerate(ins) if op == "USER"]
    assert users and ins[users[-1]][1] not in ("root", "0")
    entry = next(i for i, (op, _) in enumerate(ins) if op == "ENTRYPOINT")
    assert users[-1] < entry  # the entrypoint runs as the unprivileged user
    assert yaml.safe_load(ins[entry][1]) == [f"{APP_DIR}/docker/entrypoint.sh"]
    assert os.access(ENTRYPOINT, os.X_OK)
    assert not any(op == "CMD" for op, _ in ins)  # no arguments -> the entrypoint's default


def test_gpu_lock_is_exclusive_pinned_and_hashed() -> None:
    text = LOCK.read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M))
    assert "faiss-gpu-cu12" in pins and "faiss-cpu" not in pins  # one `faiss` module
    assert {"vllm", "torch", "deepspeed", "prefect"} <= set(pins)
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert all("--hash=sha256:" in e for e in entries if e.strip()), "unhashed lock entry"
    # Every direct dependency of the image (base + gpu extra) is in the lock.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")
             for req in [*project["dependencies"], *project["optional-dependencies"]["gpu"]]}
    assert names <= {n.lower() for n in pins}, names - {n.lower() for n in pins}
    assert "faiss-cpu" not in " ".join(project["dependencies"])


def test_dockerfile_bakes_no_secrets_and_copies_what_exists() -> None:
    regexes = _dockerignore_regexes()
    for op, rest in _instructions():
        if op in ("ENV", "ARG"):
            assert not re.search(r"(TOKEN|SECRET|PASSWORD|API_KEY)\s*=", rest, re.I), rest
        if op == "COPY":
            sources = [s for s in rest.split() if not s.startswith("--")][:-1]
            for src in sources:
                assert src == "." or (ROOT / src).exists(), src
                assert src == "." or not _ignored(src, regexes), src


def test_dockerignore_keeps_state_and_secrets_out_and_every_tracked_file_in() -> None:
    regexes = _dockerignore_regexes()
    for path in ("runs/tiny/validate_gold_labels/ref.json", "mlflow.db", "mlartifacts/1/x",
                 "mlruns/0/meta.yaml", ".venv/bin/python", ".env", ".env.local",
                 "configs/.env", ".git/HEAD", "src/searchrl/__pycache__/io.cpython-311.pyc",
                 "src/searchrl.egg-info/PKG-INFO", ".prefect/storage/k", "id_rsa.pem",
                 "data/wiki-18/wiki-18.jsonl", "data/nq_hotpotqa_train/train.parquet"):
        assert _ignored(path, regexes), path
    # What this checkout has that git ignores (local state) stays out of the image ...
    present = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    leaked = [p for p in present if not _ignored(p.rstrip("/"), regexes)]
    assert not leaked, f"ignored by git but copied into the image: {leaked[:10]}"
    # ... and every tracked file the image runs from goes in.
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    dropped = [p for p in tracked
               if _ignored(p, regexes) and p not in (".gitignore", ".dockerignore")
               and not p.startswith(".ci/")]
    assert not dropped, f"tracked files left out of the image: {dropped[:10]}"


def _render_gpu_container() -> dict[str, Any]:
    """The container settings a Docker worker builds for a flow run of the weekly deployment,
    through prefect-docker's own template, job configuration and settings code."""
    values = {**_deployments()["searchrl-weekly-gpu"]["work_pool"]["job_variables"],
              "image": "searchrl:2026-01-05t03-00-00"}  # what the build step returns
    template = DockerWorker.get_default_base_job_template()
    # A remote API URL: the worker then needs no Docker engine for host-gateway lookups.
    with temporary_settings({PREFECT_API_URL: "http://prefect.internal:4200/api"}):
        config = asyncio.run(
            DockerWorkerJobConfiguration.from_template_and_values(template, values))
        config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="weekly"))
        return DockerWorker(work_pool_name="gpu-docker")._build_container_settings(
            None, config)  # type: ignore[arg-type]


def test_gpu_job_variables_request_gpus_shm_and_the_volume() -> None:
    settings = _render_gpu_container()
    # docker-py turns them into the create call as ContainerCollection.create does; an
    # argument it does not know raises here.
    host = _create_container_args({**settings, "version": "1.44"})["host_config"]
    assert host["DeviceRequests"] == [{"Driver": "nvidia", "Count": -1, "DeviceIDs": [],
                                       "Capabilities": [["gpu"]], "Options": {}}]
    assert host["ShmSize"] >= 16 * 1024**3  # NCCL's shared-memory transport
    assert {"Name": "memlock", "Soft": -1, "Hard": -1} in host["Ulimits"]
    (bind,) = host["Binds"]
    assert PurePosixPath(bind.split(":")[1]) == VOLUME and bind.startswith("/")
    env = settings["environment"]
    for key in ("PREFECT_LOCAL_STORAGE_PATH", "HF_HOME"):
        assert PurePosixPath(env[key]).is_relative_to(VOLUME), key
    tracking = env["MLFLOW_TRACKING_URI"]
    assert tracking.startswith("http") or PurePosixPath(
        tracking.removeprefix("sqlite:///")).is_relative_to(VOLUME), tracking


def test_gpu_deployment_keeps_state_and_inputs_on_the_volume() -> None:
    weekly = _deployments()["searchrl-weekly-gpu"]
    config = load_config(str(ROOT / weekly["parameters"]["config_path"]),
                         weekly["parameters"]["overrides"])
    state = {"run.work_dir": config.run.work_dir,
             "validate.overrides_path": config.validate_.overrides_path,
             **{f"data.{k}": v for k, v in config.data.model_dump().items()
                if k.endswith("_path") and v}}
    assert {"data.train_path", "data.corpus_path"} <= set(state)
    for name, value in state.items():
        assert PurePosixPath(str(value)).is_relative_to(VOLUME), f"{name}={value}"
    # What the run reads from the image instead ships in it.
    regexes = _dockerignore_regexes()
    for shipped in (config.validate_.contracts_dir, config.train.deepspeed_config):
        assert (ROOT / shipped).exists() and not _ignored(str(shipped), regexes), shipped


def _entrypoint(*args: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([str(ENTRYPOINT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**base, **(env or {})})


def test_entrypoint_runs_the_workers_command_and_seeds_the_overrides_once(
        tmp_path: Path) -> None:
    command = _render_gpu_container()["command"]
    assert command == "prefect flow-run execute"
    # Without a flow run id, Prefect's own CLI answers: the entrypoint ran it, not the pipeline.
    proc = _entrypoint(*shlex.split(command), env={"PREFECT_HOME": str(tmp_path / "home")})
    assert proc.returncode != 0
    assert "Could not determine the ID of the flow run" in proc.stdout + proc.stderr
    assert "usage: pipeline.py" not in proc.stdout + proc.stderr

    data = tmp_path / "data"
    data.mkdir()
    proc = _entrypoint("python", "-c", "import sys; print(sys.argv[1:])", "a b", "--c",
                       env={"SEARCHRL_DATA_DIR": str(data)})
    assert proc.returncode == 0 and proc.stdout.strip() == "['a b', '--c']", proc.stderr
    seeded = data / "data_contracts" / "overrides.yaml"
    assert seeded.read_text() == (ROOT / "data_contracts" / "overrides.yaml").read_text()
    seeded.write_text("- {id: q1, action: accept, reason: checked, steward: ann}\n")
    _entrypoint("true", env={"SEARCHRL_DATA_DIR": str(data)})
    assert "steward: ann" in seeded.read_text()  # a steward's file is never overwritten


def test_entrypoint_runs_the_pipeline_without_arguments(tmp_path: Path) -> None:
    # `docker run IMAGE`: the pipeline on $SEARCHRL_CONFIG (a missing file: fails naming it).
    absent = tmp_path / "absent.yaml"
    proc = _entrypoint(env={"SEARCHRL_CONFIG": str(absent)}, timeout=300)
    assert proc.returncode != 0
    assert f"{absent}: config file not found" in proc.stderr, proc.stderr[-2000:]


def test_prefect_yaml_deployments() -> None:
    deployments = _deployments()
    weekly = deployments["searchrl-weekly-gpu"]
    assert weekly["schedules"][0]["cron"].split()[4] == "1"  # weekly, Mondays
    assert weekly["work_pool"]["name"] == "gpu-docker"
    build = weekly["build"][0]["prefect_docker.deployments.steps.build_docker_image"]
    assert build["dockerfile"] == "Dockerfile"
    assert "tag" not in build  # a new tag per deploy: a rebuild never changes a deployment
    assert re.fullmatch(r"[a-z0-9][a-z0-9._/-]*", build["image_name"]), build["image_name"]
    for d in deployments.values():
        module, _, flow_name = d["entrypoint"].partition(":")
        assert (ROOT / module).is_file() and f"def {flow_name}(" in (ROOT / module).read_text()
        assert (ROOT / d["parameters"]["config_path"]).is_file()
        # One run at a time (one work dir, one service port); a second waits, not cancelled.
        assert d["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}


def test_prefect_yaml_placeholders_resolve() -> None:
    """Prefect substitutes `{{ name }}` only: anything else (a Jinja filter) stays literal in
    the deployment. Environment placeholders are the ones deploy_smoke.sh and the operator's
    page (docs/operations.md) set."""
    text = (ROOT / "prefect.yaml").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    found = find_placeholders(body)
    written = set(re.findall(r"{{.*?}}", body))
    assert written == {p.full_match for p in found}, "a {{ ... }} Prefect will not substitute"
    env_vars = {p.name.removeprefix("$") for p in found if p.name.startswith("$")}
    assert env_vars == {"SEARCHRL_REPO_DIR", "SEARCHRL_DATA_DIR"}
    smoke = (ROOT / "scripts/deploy_smoke.sh").read_text()
    readme = (ROOT / "docs/operations.md").read_text()
    for var in env_vars:
        assert f"export {var}=" in smoke and var in readme, var


def test_local_deployment_state_follows_the_data_dir() -> None:
    local = _deployments()["searchrl-tiny-local"]
    assert "run.work_dir={{ $SEARCHRL_DATA_DIR }}/work" in local["parameters"]["overrides"]
    env = local["work_pool"]["job_variables"]["env"]
    assert env["PREFECT_LOCAL_STORAGE_PATH"] == "{{ $SEARCHRL_DATA_DIR }}/prefect-results"


def test_deployments_send_heartbeats_well_within_the_lost_run_window() -> None:
    """prefect-automations.yaml's searchrl-run-lost marks a run Crashed when no heartbeat
    came for `within` seconds: every deployment sets the heartbeat (Prefect's default was off
    before 3.6.22, and every run over the window was then Crashed) at Prefect's minimum of
    30 s or more, a third of the window at most (a late beat or two never crashes a live run);
    pyproject.toml asks for a Prefect that sends them from every flow run (>= 3.6.27)."""
    spec = yaml.safe_load((ROOT / "prefect-automations.yaml").read_text())
    (lost,) = [a for a in spec["automations"] if a["name"] == "searchrl-run-lost"]
    window = lost["trigger"]["within"]
    assert "prefect.flow-run.heartbeat" in lost["trigger"]["expect"]
    envs = {name: d["work_pool"]["job_variables"]["env"] for name, d in _deployments().items()}
    envs["searchrl-weekly-gpu (rendered)"] = _render_gpu_container()["environment"]
    for name, env in envs.items():
        beat = int(env.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", 0))
        assert 30 <= beat <= window / 3, (name, beat, window)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (prefect,) = [Requirement(r) for r in project["dependencies"]
                  if Requirement(r).name == "prefect"]
    assert not prefect.specifier.contains("3.6.26") and prefect.specifier.contains("3.6.27")
