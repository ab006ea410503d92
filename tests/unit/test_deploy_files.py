"""Review-by-test of the files CI cannot run: the Dockerfile (no Docker engine here) and
prefect.yaml (the deploy smoke test runs the local deployment; this checks both)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


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


def test_dockerfile_is_cuda_gpu_extra_non_root() -> None:
    ins = _instructions()
    assert ins[0][0] == "FROM" and "nvidia/cuda" in ins[0][1]
    runs = " ".join(rest for op, rest in ins if op == "RUN")
    assert '.[gpu]' in runs
    users = [i for i, (op, rest) in enumerate(ins) if op == "USER"]
    assert users and ins[users[-1]][1] not in ("root", "0")
    entry = next(i for i, (op, _) in enumerate(ins) if op == "ENTRYPOINT")
    assert users[-1] < entry  # the entrypoint runs as the unprivileged user


def test_dockerfile_bakes_no_secrets_and_copies_what_exists() -> None:
    for op, rest in _instructions():
        if op in ("ENV", "ARG"):
            assert not re.search(r"(TOKEN|SECRET|PASSWORD|API_KEY)\s*=", rest, re.I), rest
        if op == "COPY":
            sources = [s for s in rest.split() if not s.startswith("--")][:-1]
            for src in sources:
                assert src == "." or (ROOT / src).exists(), src


def test_prefect_yaml_deployments() -> None:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    weekly = deployments["searchrl-weekly-gpu"]
    assert weekly["schedules"][0]["cron"].split()[4] == "1"  # weekly, Mondays
    assert weekly["work_pool"]["name"] == "gpu-docker"
    build = weekly["build"][0]["prefect_docker.deployments.steps.build_docker_image"]
    assert build["dockerfile"] == "Dockerfile"
    for d in deployments.values():
        module, _, flow_name = d["entrypoint"].partition(":")
        assert (ROOT / module).is_file() and f"def {flow_name}(" in (ROOT / module).read_text()
        assert (ROOT / d["parameters"]["config_path"]).is_file()
