"""Run the train stage's ranks through DeepSpeed's own launcher (`train.launch.mode=deepspeed`).

The stage process writes the resolved config next to the run, starts
`python -m deepspeed.launcher.runner --num_gpus R [--hostfile F --num_nodes N] --module
searchrl train-rank --config <it>` and waits. Each rank runs the rank entry point
(`python -m searchrl train-rank`: `train.stage.launched_rank`, reading its inputs from the
upstream stages' `ref.json` and the start policy the stage prepared); rank 0 logs into the
stage's MLflow run (its id passed on the command line) and writes the stage's `ref.json`.
Each rank's output goes to its own log file; rank 0's is relayed to this process's output as
it grows (progress), and when any rank fails the launcher stops the others and the error
carries every rank's last lines.

Process lifetime: ranks never outlive the stage. The launcher (runner -> launch -> ranks) runs
in a process group of its own, which the stage stops (SIGTERM, SIGKILL after a grace period)
whenever `launch_ranks` ends: normally, by an exception, or by SIGTERM to the stage (a handler,
when the stage runs in the main thread). Nothing runs in a process killed with SIGKILL, so
each rank also watches the stage process itself (`guard_rank_process`, from the stage's pid,
start time and host passed in `STAGE_ENV`): when it is gone the rank stops the whole group.
A rank also dies with its parent, DeepSpeed's launch process (PR_SET_PDEATHSIG). Rank 0
holds the checkpoint dir's lock (`checkpoint.checkpoint_dir_lock`) while it trains.

Several nodes: DeepSpeed's pdsh runner forwards only some variables to the other nodes, so
the ones the ranks need (`FORWARD_PREFIXES`) go into a `.deepspeed_env` file in the launch
dir that DeepSpeed reads (`DS_ENV_FILE`). DeepSpeed puts those values on the remote command
line (and its log), so secrets (the retriever token, `*_TOKEN`/`*_PASSWORD`/`*_SECRET`/`*_KEY`)
go instead into a 0600 file on the shared filesystem whose path the ranks get
(`SECRETS_ENV`) and read at startup; both files are removed when the launcher ends. A
retrieval service on a loopback address is refused there.

Over 400 lines because process lifetime (the group, the guards, signals, the log relay, the
secrets file) is one mechanism whose parts make sense only together.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import yaml

from searchrl.config import PipelineConfig
from searchrl.datasets.io import log_tail
from searchrl.train.distributed.deepspeed_setup import free_port
from searchrl.train.distributed.hostfile import check_hostfile

# The stage process the ranks live for: "<host>:<pid>:<start time>:<process group>".
STAGE_ENV = "SEARCHRL_STAGE_PROCESS"
SECRETS_ENV = "SEARCHRL_SECRETS_FILE"  # several nodes: where the ranks read their secrets
# Variables the ranks on other nodes need (DeepSpeed itself forwards only a few prefixes).
FORWARD_PREFIXES = ("SEARCHRL_", "MLFLOW_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_",
                    "DS_ACCELERATOR", "CUBLAS_", "PYTORCH_", "NCCL_")
ENV_FILE = "deepspeed_env"
SECRETS_FILE = "secrets.env"
_SECRET_WORDS = frozenset({"TOKEN", "PASSWORD", "SECRET", "KEY"})
_TAIL_LINES = 25
_STOP_GRACE_S = 30.0  # DeepSpeed's runner stops remote ranks (pdsh kill) within a few seconds
_KILL_WAIT_S = 30.0  # after SIGKILL: the kernel frees a killed process within this, even loaded
_WATCH_INTERVAL_S = 1.0
_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """The launched ranks failed, or the launch is refused; the message says why."""


def env_rank() -> int:
    """This process's global rank as the launcher set it (before torch.distributed starts)."""
    return int(os.environ.get("RANK", "0"))


def launch_command(config: PipelineConfig, config_file: Path, log_dir: Path,
                   mlflow_run_id: str | None) -> list[str]:
    """The DeepSpeed launcher command line for this run's ranks."""
    launch = config.train.launch
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner",
           "--num_gpus", str(launch.ranks), "--num_nodes", str(launch.nodes),
           "--master_port", str(launch.master_port or free_port()),
           "--enable_each_rank_log", str(log_dir.resolve())]
    if launch.hostfile is not None:
        cmd += ["--hostfile", str(Path(launch.hostfile).resolve())]
    else:  # one node: never read a stray /job/hostfile
        cmd += ["--hostfile", str(log_dir / "no_hostfile"), "--master_addr", "127.0.0.1"]
    cmd += ["--module", "searchrl", "train-rank", "--config", str(config_file.resolve())]
    if mlflow_run_id is not None:
        cmd += ["--mlflow-run-id", mlflow_run_id]
    return cmd


def check_nodes(config: PipelineConfig) -> None:
    """LaunchError when ranks on other nodes could not reach the retrieval service."""
    index = config.index
    if config.train.launch.nodes <= 1 or index.mode != "service":
        return
    host = urlsplit(index.service_url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        raise LaunchError(
            f"train.launch.nodes={config.train.launch.nodes} with index.service_url="
            f"{index.service_url}: ranks on the other nodes cannot reach a loopback address. "
            "Serve the index on an address they reach (index.service_host=0.0.0.0 and "
            "index.service_url=http://<this host>:<port>, or an external service with "
            "index.service_managed=false), or use index.mode=inprocess")


def rank_env(config: PipelineConfig, tracking_uri: str | None) -> dict[str, str]:
    """The launcher's environment: this process's, the stage's identity for the ranks'
    watchdog, the tracking URI, and one thread pool per CPU rank."""
    env = dict(os.environ) | {STAGE_ENV: _stage_identity()}
    env.pop("DS_ENV_FILE", None)
    if tracking_uri is not None:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    if config.run.device == "cpu" or not _cuda_available():
        # gloo ranks share the cores: one thread pool each, not each the whole machine
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                  // config.train.launch.ranks)))
    return env


def is_secret(name: str, token_env: str) -> bool:
    """Whether variable `name` holds a secret (kept off DeepSpeed's remote command line)."""
    return name == token_env or bool(_SECRET_WORDS & set(name.split("_")))


def write_launch_env(launch_dir: Path, env: dict[str, str], token_env: str
                     ) -> tuple[Path, Path]:
    """For ranks on other nodes: DeepSpeed's env file (`K=V` lines, read through
    `DS_ENV_FILE`: an operator's own `~/.deepspeed_env` and `./.deepspeed_env` lines, then
    ours) and the secrets file it names (0600). Moves the secrets out of `env`, which
    DeepSpeed would otherwise forward on the command line. Returns (env file, secrets file)."""
    env_file, secrets_file = launch_dir / ENV_FILE, launch_dir / SECRETS_FILE
    lines: list[str] = []
    for own in (Path.home() / ".deepspeed_env", Path(".deepspeed_env")):
        if own.is_file():
            lines += [line for line in own.read_text().splitlines() if "=" in line]
    secrets: list[str] = []
    for name in sorted(env):
        if not (name.startswith(FORWARD_PREFIXES) or name == token_env):
            continue
        if "\n" in env[name] or "\r" in env[name]:
            raise LaunchError(f"${name} holds a line break, which cannot be passed to the "
                              f"ranks on other nodes ({env_file}); remove it")
        if is_secret(name, token_env):
            secrets.append(f"{name}={env.pop(name)}")
        else:
            lines.append(f"{name}={env[name]}")
    lines.append(f"{SECRETS_ENV}={secrets_file}")
    for path, text, mode in ((secrets_file, secrets, 0o600), (env_file, lines, 0o644)):
        path.unlink(missing_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w") as fh:
            fh.write("\n".join(text) + "\n")
    return env_file, secrets_file


def load_launch_secrets() -> None:
    """In a rank on any node: the secrets the stage left for it (`SECRETS_ENV`), into this
    process's environment (variables already set win)."""
    path = os.environ.get(SECRETS_ENV)
    if not path:
        return
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise LaunchError(f"{path} ({SECRETS_ENV}): the secrets file the train stage wrote "
                          f"for the ranks cannot be read ({exc}); it must be on a filesystem "
                          "every node shares, like run.work_dir") from exc
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            os.environ.setdefault(name, value)


def launch_ranks(config: PipelineConfig, out_dir: Path, *, mlflow_run_id: str | None,
                 tracking_uri: str | None, echo: bool = True) -> None:
    """Start the ranks, relay rank 0's output, wait; LaunchError naming every rank's last
    lines when the launcher exits non-zero (a rank failed or was killed). However this ends,
    no launcher process or rank is left running."""
    check_nodes(config)
    check_hostfile(config)  # every host reachable, before the launcher starts
    launch_dir = out_dir / "launch"
    log_dir = launch_dir / "logs" / time.strftime("%Y%m%dT%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    config_file = launch_dir / "config.yaml"
    resolved = config.to_dict()
    resolved["run"]["work_dir"] = str(Path(config.run.work_dir).resolve())
    config_file.write_text(yaml.safe_dump(resolved, sort_keys=False))
    env = rank_env(config, tracking_uri)
    cmd = launch_command(config, config_file, log_dir, mlflow_run_id)
    launcher_log = log_dir / "launcher.log"
    written: tuple[Path, ...] = ()

    def remove_written() -> None:
        for path in written:
            path.unlink(missing_ok=True)

    try:
        if config.train.launch.nodes > 1:  # DeepSpeed reads it only to reach other nodes
            written = write_launch_env(launch_dir.resolve(), env,
                                       config.index.service_token_env)
            env["DS_ENV_FILE"] = str(written[0])
        with launcher_log.open("w") as out:
            # its own process group: stopping the group reaches runner, launch and ranks
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=Path.cwd(), process_group=0)
            with _stop_group_on_sigterm(proc, remove_written):
                try:
                    stalled = _follow_rank0(proc, log_dir, config.train.launch.stall_timeout_s,
                                            echo)
                finally:
                    stop_group(proc)
    finally:
        remove_written()
    if proc.returncode != 0:
        raise _launch_error(config, proc.returncode, stalled, log_dir, launcher_log)


def _launch_error(config: PipelineConfig, returncode: int, stalled: bool, log_dir: Path,
                  launcher_log: Path) -> LaunchError:
    ranks = sorted(log_dir.glob("*_rank*.log"), key=lambda p: int(p.stem.rsplit("rank", 1)[-1]))
    parts = [f"--- {p.name} (last lines)\n{log_tail(p, _TAIL_LINES)}" for p in ranks]
    why = (f"rank 0 wrote nothing for train.launch.stall_timeout_s="
           f"{config.train.launch.stall_timeout_s}s, so the ranks were stopped" if stalled
           else "a rank failed or was killed; the others were stopped")
    return LaunchError(
        f"train_policy: the DeepSpeed launcher exited with {returncode} ({why}). "
        f"Re-running resumes from the newest checkpoint. Logs: {log_dir}\n--- launcher\n"
        f"{log_tail(launcher_log, 8)}\n" + "\n".join(parts))


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _follow_rank0(proc: subprocess.Popen[bytes], log_dir: Path, stall_timeout_s: float | None,
                  echo: bool) -> bool:
    """Wait for the launcher, printing rank 0's new log lines (progress) as they come;
    True when it stalled (the caller stops it)."""
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
            return True
        time.sleep(1.0)


# --- the launcher's process group


@dataclass(frozen=True)
class _Proc:
    state: str
    ppid: int
    pgrp: int
    start: int


def _proc(pid: int) -> _Proc | None:
    """/proc/<pid>/stat's state, parent, process group and start time; None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return _Proc(state=fields[0], ppid=int(fields[1]), pgrp=int(fields[2]),
                 start=int(fields[19]))


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group `pgid`."""
    if not Path("/proc/self/stat").exists():  # not Linux: ask the kernel about the group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    procs = {int(e.name): _proc(int(e.name)) for e in os.scandir("/proc") if e.name.isdigit()}
    return [pid for pid, p in procs.items()
            if p is not None and p.pgrp == pgid and p.state not in ("Z", "X")]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = _STOP_GRACE_S) -> None:
    """Stop the launcher's process group (its leader is `proc`): SIGTERM (DeepSpeed's
    runner and launch processes stop their ranks, also on other nodes), SIGKILL to whatever
    is left after `grace_s`; reaps `proc`."""
    pgid = proc.pid
    if proc.poll() is None or group_members(pgid):
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie would count as a member elsewhere
            if not group_members(pgid):
                break
            time.sleep(0.1)
        else:
            _signal_group(pgid, signal.SIGKILL)
            # SIGKILL is delivered asynchronously (a loaded machine may take a while to run
            # the exits): return only when no member is left, so callers may trust "stopped".
            _wait_group_gone(pgid, _KILL_WAIT_S)
    proc.wait()


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:  # still there after SIGKILL: stuck in the kernel (D state); say so, never hide it
        raise RuntimeError(
            f"process group {pgid}: pids {left} survived SIGKILL for {timeout_s:.0f} s")


@contextlib.contextmanager
def _stop_group_on_sigterm(proc: subprocess.Popen[bytes], cleanup: Callable[[], None]
                           ) -> Iterator[None]:
    """While the launcher runs, SIGTERM to this process first stops the launcher's group,
    then does what it did before (by default: terminate). Only the main thread may set a
    handler; elsewhere the ranks' watchdog stops the group once this process is gone."""
    previous = signal.getsignal(signal.SIGTERM)
    if (threading.current_thread() is not threading.main_thread()
            or previous in (signal.SIG_IGN, None)):
        yield
        return

    def stop_then_forward(signum: int, frame: FrameType | None) -> None:
        stop_group(proc)
        cleanup()
        signal.signal(signal.SIGTERM, previous)
        signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop_then_forward)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is stop_then_forward:
            signal.signal(signal.SIGTERM, previous)


# --- inside each rank


def _stage_identity() -> str:
    me = _proc(os.getpid())
    return f"{socket.gethostname()}:{os.getpid()}:{me.start if me else 0}:{os.getpgid(0)}"


def guard_rank_process() -> None:
    """Tie this rank's life to the train stage's (call first thing in a rank). It dies with
    its parent, DeepSpeed's launch process; on the stage's host, a watchdog thread stops
    the launcher's whole process group once the stage process is gone (killed with SIGKILL,
    say). A rank started without `STAGE_ENV` (by hand) gets neither."""
    stage = os.environ.get(STAGE_ENV, "").split(":")
    if len(stage) != 4:
        return
    host, pid, start, stage_pgid = stage[0], int(stage[1]), int(stage[2]), int(stage[3])
    _die_with_parent()
    if host != socket.gethostname():  # a rank on another node: DeepSpeed's runner stops it
        return
    # Stopping our group is safe only when the launcher got one of its own.
    own_group = os.getpgid(0) != stage_pgid
    threading.Thread(target=_watch_stage, args=(pid, start, own_group), daemon=True,
                     name="stage-watchdog").start()


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "prctl"):  # not Linux: the watchdog alone
        return
    parent = os.getppid()
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before the call: we were re-parented already
        os._exit(1)


def stage_alive(pid: int, start: int) -> bool:
    """The stage process `pid` (started at `start` clock ticks) still runs (not a zombie,
    not a new process that reused the pid)."""
    p = _proc(pid)
    return p is not None and p.state not in ("Z", "X") and (start == 0 or p.start == start)


def _watch_stage(pid: int, start: int, own_group: bool) -> None:
    while stage_alive(pid, start):
        time.sleep(_WATCH_INTERVAL_S)
    print(f"train-rank: the train stage process (pid {pid}) is gone; stopping the launcher "
          "and every rank", file=sys.stderr, flush=True)
    if secrets := os.environ.get(SECRETS_ENV):  # the stage had no chance to remove it
        Path(secrets).unlink(missing_ok=True)
    if not own_group:
        os._exit(1)
    pgid = os.getpgid(0)
    _signal_group(pgid, signal.SIGTERM)  # DeepSpeed's runner/launch stop their ranks
    time.sleep(5.0)  # reached only when this rank outlived SIGTERM (a handler of its own)
    _signal_group(pgid, signal.SIGKILL)
