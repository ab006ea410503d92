"""The hostfile of a train stage on several nodes (`train.launch.nodes > 1`), checked before
DeepSpeed's launcher starts: read with DeepSpeed's own parser (`host slots=N` lines), as
many hosts as `train.launch.nodes`, and every host reachable the way the launcher reaches it
(pdsh over ssh, without a password). DeepSpeed itself tries only the first host, and a
later one fails deep in pdsh's output; this names the host and the file at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from searchrl.config import PipelineConfig

SSH_TIMEOUT_S = 10


class HostfileError(RuntimeError):
    """The hostfile is missing, malformed, too short, or names a host ssh cannot reach
    (exit code 9, with the launch errors)."""


def read_hostfile(path: Path) -> dict[str, int]:
    """Host -> slots, as DeepSpeed's launcher reads `path`."""
    from deepspeed.launcher.runner import _parse_hostfile

    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise HostfileError(f"train.launch.hostfile={path}: cannot be read ({exc})") from exc
    try:
        return dict(_parse_hostfile(lines))
    except ValueError as exc:
        raise HostfileError(f"train.launch.hostfile={path}: {exc} (expected `host slots=N` "
                            "lines, one per node)") from exc


def check_hostfile(config: PipelineConfig) -> dict[str, int]:
    """The hosts of a multi-node launch, each checked with `ssh -o BatchMode=yes host true`;
    HostfileError naming the first that fails. Nothing to check on one node."""
    launch = config.train.launch
    if launch.nodes <= 1 or launch.hostfile is None:
        return {}
    path = Path(launch.hostfile)
    hosts = read_hostfile(path)
    if len(hosts) < launch.nodes:
        raise HostfileError(f"train.launch.hostfile={path} lists {len(hosts)} hosts "
                            f"({', '.join(hosts)}) but train.launch.nodes={launch.nodes}")
    for host in list(hosts)[:launch.nodes]:
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", host,
               "true"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=SSH_TIMEOUT_S + 5, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HostfileError(f"train.launch.hostfile={path}: host {host!r} unreachable "
                                f"over ssh ({exc})") from exc
        if done.returncode != 0:
            raise HostfileError(
                f"train.launch.hostfile={path}: host {host!r} unreachable over ssh (exit "
                f"{done.returncode}: {done.stderr.strip()[-300:]}); every node must accept "
                "ssh from this host without a password (DeepSpeed's launcher runs pdsh)")
    return hosts
