"""Run the train stage's ranks through DeepSpeed's own launcher (`train.launch.mode=deepspeed`).

The stage process writes the resolved config next to the run, starts
`python -m deepspeed.launcher.runner --num_gpus R [--hostfile F --num_nodes N] --module
searchrl train --config <it>` and waits. Every rank then runs the same stage function in
"rank mode" (the marker variable below), reading its inputs from the upstream stages'
`ref.json`; rank 0 logs into the stage's MLflow run (its id passed on the command line) and
writes the stage's `ref.json`. Each rank's output goes to its own log file; rank 0's is
relayed to this process's output as it grows (progress), and when any rank fails the launcher
stops the others and the error carries every rank's last lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from searchrl.config import PipelineConfig
from searchrl.data.io import log_tail
from searchrl.train.ds import free_port

# Set for the launched ranks only: they train instead of launching again.
RANK_MARKER = "SEARCHRL_LAUNCHED_RANK"
_TAIL_LINES = 25


class LaunchError(RuntimeError):
    """The launched ranks failed; the message holds each rank's last lines."""


def launched_rank() -> int | None:
    """This process's global rank when it was started by `launch_ranks`, else None."""
    if os.environ.get(RANK_MARKER) != "1":
        return None
    return int(os.environ.get("RANK", "0"))


def launch_command(config: PipelineConfig, config_file: Path, log_dir: Path,
                   mlflow_run_id: str | None) -> list[str]:
    """The DeepSpeed launcher command line for this run's ranks."""
    launch = config.train.launch
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner",
           "--num_gpus", str(launch.ranks), "--num_nodes", str(launch.nodes),
           "--master_port", str(launch.master_port or free_port()),
           "--enable_each_rank_log", str(log_dir)]
    if launch.hostfile is not None:
        cmd += ["--hostfile", str(launch.hostfile)]
    else:  # one node: never read a stray /job/hostfile
        cmd += ["--hostfile", str(log_dir / "no_hostfile"), "--master_addr", "127.0.0.1"]
    cmd += ["--module", "searchrl", "train", "--config", str(config_file)]
    if mlflow_run_id is not None:
        cmd += ["--mlflow-run-id", mlflow_run_id]
    return cmd


def launch_ranks(config: PipelineConfig, out_dir: Path, *, mlflow_run_id: str | None,
                 tracking_uri: str | None, echo: bool = True) -> None:
    """Start the ranks, relay rank 0's output, wait; LaunchError naming every rank's last
    lines when the launcher exits non-zero (a rank failed or was killed)."""
    launch_dir = out_dir / "launch"
    log_dir = launch_dir / "logs" / time.strftime("%Y%m%dT%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    config_file = launch_dir / "config.yaml"
    resolved = config.to_dict()
    resolved["run"]["work_dir"] = str(Path(config.run.work_dir).resolve())
    config_file.write_text(yaml.safe_dump(resolved, sort_keys=False))
    env = dict(os.environ) | {RANK_MARKER: "1"}
    if tracking_uri is not None:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    if config.run.device == "cpu" or not _cuda_available():
        # gloo ranks share the cores: one thread pool each, not each the whole machine
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                  // config.train.launch.ranks)))
    cmd = launch_command(config, config_file, log_dir, mlflow_run_id)
    launcher_log = log_dir / "launcher.log"
    with launcher_log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=Path.cwd())
        stalled = _follow_rank0(proc, log_dir, config.train.launch.stall_timeout_s, echo)
    if proc.returncode != 0:
        ranks = sorted(log_dir.glob("*_rank*.log"),
                       key=lambda p: int(p.stem.rsplit("rank", 1)[-1]))
        parts = [f"--- {p.name} (last lines)\n{log_tail(p, _TAIL_LINES)}" for p in ranks]
        why = (f"rank 0 wrote nothing for train.launch.stall_timeout_s="
               f"{config.train.launch.stall_timeout_s}s, so the ranks were stopped" if stalled
               else "a rank failed or was killed; the others were stopped")
        raise LaunchError(
            f"train_policy: the DeepSpeed launcher exited with {proc.returncode} ({why}). "
            f"Re-running resumes from the "
            f"newest checkpoint. Logs: {log_dir}\n--- launcher\n{log_tail(launcher_log, 8)}\n"
            + "\n".join(parts))


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _follow_rank0(proc: subprocess.Popen[bytes], log_dir: Path, stall_timeout_s: float | None,
                  echo: bool) -> bool:
    """Wait for the launcher, printing rank 0's new log lines (progress) as they come;
    True when it was stopped for a stall."""
    offset, last_growth = 0, time.monotonic()
    while True:
        done = proc.poll() is not None
        for rank0 in log_dir.glob("*_rank0.log"):
            size = rank0.stat().st_size
            if size > offset:
                with rank0.open("rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read(size - offset)
                offset, last_growth = size, time.monotonic()
                if echo:
                    sys.stdout.write(chunk.decode("utf-8", errors="replace"))
                    sys.stdout.flush()
        if done:
            return False
        if stall_timeout_s is not None and time.monotonic() - last_growth > stall_timeout_s:
            proc.terminate()  # the launcher's SIGTERM handler stops every rank
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return True
        time.sleep(1.0)
