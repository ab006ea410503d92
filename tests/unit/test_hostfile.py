"""Training on several nodes, what can be tested on one machine (the multi-node GPU path has
not run): the hostfile read as DeepSpeed reads it, a host ssh cannot reach named before the
launcher starts (exit 9), and the variables ranks on other hosts need (NCCL settings, the
run's ids) in the launcher's env file, secrets kept out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from searchrl.config import PipelineConfig, load_config
from searchrl.exit_codes import exit_code_of
from searchrl.train.distributed.hostfile import HostfileError, check_hostfile, read_hostfile
from searchrl.train.distributed.launcher import ENV_FILE, write_launch_env


def _config(tmp_path: Path, hosts: str | None, nodes: int = 2) -> PipelineConfig:
    hostfile = tmp_path / "hosts"
    if hosts is not None:
        hostfile.write_text(hosts)
    return load_config("configs/tiny.yaml", [
        "train.launch.mode=deepspeed", "train.launch.ranks=2", f"run.work_dir={tmp_path}",
        f"train.launch.nodes={nodes}", f"train.launch.hostfile={hostfile}"])


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ssh` that reaches node0 and node1 only, recording the hosts it was asked for."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nfor a; do host="$prev"; prev="$a"; done\necho "$host" >> {asked}\n'
                   'case "$host" in node0|node1) exit 0;; esac\n'
                   'echo "ssh: Could not resolve hostname $host" >&2; exit 255\n')
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return asked


def test_every_host_is_checked_and_an_unreachable_one_is_named(
        tmp_path: Path, fake_ssh: Path) -> None:
    good = _config(tmp_path, "# two nodes\nnode0 slots=2\nnode1 slots=2\n")
    assert check_hostfile(good) == {"node0": 2, "node1": 2}
    assert fake_ssh.read_text().split() == ["node0", "node1"]
    bad = _config(tmp_path, "node0 slots=2\nnode7 slots=2\n")
    with pytest.raises(HostfileError, match=r"hosts: host 'node7' unreachable over ssh "
                                            r"\(exit 255: ssh: Could not resolve") as caught:
        check_hostfile(bad)
    assert exit_code_of(caught.value) == 9


def test_a_missing_malformed_or_short_hostfile_is_named(tmp_path: Path, fake_ssh: Path) -> None:
    with pytest.raises(HostfileError, match=r"hostfile=.*hosts: cannot be read"):
        check_hostfile(_config(tmp_path, None))
    with pytest.raises(HostfileError, match=r"bad entry: node0 2.*`host slots=N`"):
        check_hostfile(_config(tmp_path, "node0 2\n"))
    with pytest.raises(HostfileError, match=r"lists 1 hosts \(node0\) but "
                                            r"train.launch.nodes=2"):
        check_hostfile(_config(tmp_path, "node0 slots=2\n"))
    assert read_hostfile(tmp_path / "hosts") == {"node0": 2}
    assert check_hostfile(_config(tmp_path, None, nodes=1)) == {}  # one node: nothing read
    assert not fake_ssh.exists()


def test_ranks_on_other_hosts_get_nccl_settings_and_run_ids_not_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no operator .deepspeed_env here
    env = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "MLFLOW_RUN_ID": "r1",
           "SEARCHRL_STAGE_PROCESS": "h:1:2:3", "MLFLOW_TRACKING_TOKEN": "t0ken",
           "UNRELATED": "x"}
    env_file, secrets = write_launch_env(tmp_path, env, "SEARCHRL_RETRIEVER_TOKEN")
    assert env_file.name == ENV_FILE
    lines = set(env_file.read_text().splitlines())
    assert {"NCCL_SOCKET_IFNAME=eth0", "NCCL_IB_DISABLE=1", "MLFLOW_RUN_ID=r1",
            "SEARCHRL_STAGE_PROCESS=h:1:2:3"} <= lines
    assert not any(line.startswith(("UNRELATED", "MLFLOW_TRACKING_TOKEN")) for line in lines)
    assert secrets.read_text() == "MLFLOW_TRACKING_TOKEN=t0ken\n"
