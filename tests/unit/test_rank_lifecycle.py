"""The DeepSpeed launch path without training: what the ranks are started with, and that they
never outlive the stage process (real processes; the full chain through DeepSpeed's launcher
is tests/smoke/test_launch.py, slow).

- Ranks guarded by `guard_rank_process` die when the stage process is killed with SIGKILL
  (their watchdog stops the launcher's process group) and when their parent dies
  (PR_SET_PDEATHSIG); `stop_group` leaves nothing of a group, even a process that ignores
  SIGTERM.
- Several nodes: DeepSpeed's real runner, with `pdsh`/`ssh` stand-ins that record what they
  would run on the nodes, gets the rank entry point, the variables the ranks need (through
  the env file) and a secrets file path instead of the retriever token; the token is on no
  command line and in no log, and both files are gone when the launch ends. A loopback
  retrieval service is refused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from searchrl.config import load_config
from searchrl.train.distributed.launcher import (
    SECRETS_ENV,
    STAGE_ENV,
    LaunchError,
    check_nodes,
    group_members,
    launch_command,
    launch_ranks,
    load_launch_secrets,
    stop_group,
)

# The stage: starts a launcher in its own process group (as launch_ranks does), which starts
# two guarded ranks; each rank writes its pid once guarded, then sleeps.
STAGE = textwrap.dedent("""
    import os, subprocess, sys, time
    from searchrl.train.distributed import launcher as launch
    env = os.environ | {launch.STAGE_ENV: launch._stage_identity()}
    rank = ("from searchrl.train.distributed.launcher import guard_rank_process; "
            "import os, sys, time; "
            "guard_rank_process(); open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(600)")
    launcher = ("import subprocess, sys; "
                "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[1], p]) "
                "for p in sys.argv[2:]]; [p.wait() for p in ps]")
    subprocess.Popen([sys.executable, '-c', launcher, rank, *sys.argv[1:]], env=env,
                     process_group=0)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _start_stage(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    pid_files = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
    stage = subprocess.Popen([sys.executable, "-c", STAGE, *map(str, pid_files)])
    deadline = time.monotonic() + 60
    while not all(p.is_file() and p.read_text() for p in pid_files):
        assert stage.poll() is None and time.monotonic() < deadline, "ranks never started"
        time.sleep(0.1)
    return stage, [int(p.read_text()) for p in pid_files]


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _kill_left(pids: list[int]) -> None:
    """After a failed check: no process of the test left behind."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_ranks_and_launcher_die_when_the_stage_is_killed_with_sigkill(tmp_path: Path) -> None:
    stage, ranks = _start_stage(tmp_path)
    launcher = _parent(ranks[0])
    try:
        assert os.getpgid(ranks[0]) == launcher != os.getpgid(stage.pid)  # a group of its own
        stage.kill()  # SIGKILL: nothing runs in the stage; the ranks' watchdog notices
        stage.wait()
        assert _gone_within([*ranks, launcher], 10), "a rank or the launcher outlived the stage"
    finally:
        _kill_left([stage.pid, launcher, *ranks])


def test_a_rank_dies_with_its_parent(tmp_path: Path) -> None:
    stage, ranks = _start_stage(tmp_path)
    try:
        os.kill(_parent(ranks[0]), signal.SIGKILL)  # the stage lives on: PR_SET_PDEATHSIG
        assert _gone_within(ranks, 10), "a rank outlived its launcher"
    finally:
        stage.kill()
        stage.wait()
        _kill_left(ranks)


def test_a_rank_started_by_hand_is_not_guarded(tmp_path: Path) -> None:
    code = ("from searchrl.train.distributed.launcher import guard_rank_process; import threading; "
            "guard_rank_process(); print(threading.active_count())")
    env = {k: v for k, v in os.environ.items() if k != STAGE_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "1"  # no watchdog thread


def test_stop_group_leaves_nothing_even_a_process_ignoring_sigterm() -> None:
    stubborn = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, "
                "signal.SIG_IGN); subprocess.Popen([sys.executable, '-c', "
                "'import time; time.sleep(600)']); print('ready', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE,
                            process_group=0)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    assert len(group_members(proc.pid)) == 2
    started = time.monotonic()
    stop_group(proc, grace_s=1.0)
    assert group_members(proc.pid) == [] and proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 20  # grace 1 s; the rest is a loaded machine's slack


# --- what the ranks are started with


def _config(tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_config("configs/tiny.yaml", [
        "train.launch.mode=deepspeed", "train.launch.ranks=2", f"run.work_dir={tmp_path}",
        *extra])


def test_the_launcher_starts_the_rank_entry_point(tmp_path: Path) -> None:
    cmd = launch_command(_config(tmp_path), Path("rel/config.yaml"), tmp_path / "logs", "run1")
    module = cmd.index("--module")
    assert cmd[module + 1: module + 4] == ["searchrl", "train-rank", "--config"]
    assert cmd[module + 4] == str(Path("rel/config.yaml").resolve())  # same path on any node
    assert cmd[-2:] == ["--mlflow-run-id", "run1"]


def test_several_nodes_refuse_a_loopback_retrieval_service(tmp_path: Path) -> None:
    nodes = ["train.launch.nodes=2", f"train.launch.hostfile={tmp_path / 'hosts'}",
             "index.mode=service"]
    with pytest.raises(LaunchError, match=r"index.service_url=http://127.0.0.1:8000.*loopback"):
        check_nodes(_config(tmp_path, *nodes))
    check_nodes(_config(tmp_path, *nodes, "index.service_host=0.0.0.0",
                        "index.service_url=http://node0:8000"))
    check_nodes(_config(tmp_path, "train.launch.nodes=2",
                        f"train.launch.hostfile={tmp_path / 'hosts'}"))  # inprocess index
    check_nodes(_config(tmp_path, "index.mode=service"))  # one node


def _stand_ins(bin_dir: Path) -> None:
    """`ssh` (the runner's reachability check and `hostname -I`) and `pdsh`, which records
    its arguments and the secrets file the command it would run names."""
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text("#!/bin/sh\necho 10.0.0.7\n")
    (bin_dir / "pdsh").write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, re, sys
        found = re.search(r"export {SECRETS_ENV}=([^;]+);", " ".join(sys.argv))
        path = found.group(1).strip('"') if found else None
        json.dump({{"argv": sys.argv[1:], "secrets": open(path).read() if path else None,
                   "mode": os.stat(path).st_mode & 0o777 if path else None}},
                  open(os.environ["PDSH_RECORD"], "w"))
        """))
    for tool in ("ssh", "pdsh"):
        (bin_dir / tool).chmod(0o755)


def test_several_nodes_get_the_ranks_environment_through_deepspeeds_runner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(tmp_path / "bin")
    (tmp_path / "hosts").write_text("node0 slots=2\nnode1 slots=2\n")
    token = "s3cret-token-value"
    config = _config(tmp_path / "work", "train.launch.nodes=2",
                     f"train.launch.hostfile={tmp_path / 'hosts'}", "index.mode=service",
                     "index.service_host=0.0.0.0", "index.service_url=http://node0:8000")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("PDSH_RECORD", str(tmp_path / "pdsh.json"))
    monkeypatch.setenv(config.index.service_token_env, token)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    Path(".deepspeed_env").write_text("OPERATOR_SETTING=kept\n")  # an operator's own file
    out_dir = tmp_path / "work" / "train_policy"
    launch_ranks(config, out_dir, mlflow_run_id="run1", tracking_uri="http://mlflow:5000",
                 echo=False)

    record = json.loads((tmp_path / "pdsh.json").read_text())
    argv = record["argv"]
    assert argv[argv.index("-w") + 1] == "node0,node1"
    remote = " ".join(argv)
    exports = dict(re.findall(r"export (\w+)=([^;]*);", remote))
    assert exports["OPERATOR_SETTING"] == "kept" and exports["HF_HUB_OFFLINE"] == "1"
    assert exports["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert exports[STAGE_ENV].strip('"').split(":")[1] == str(os.getpid())
    assert "-m deepspeed.launcher.launch" in remote and "--master_addr=10.0.0.7" in remote
    assert argv[argv.index("--module") + 2:][:3] == ["searchrl", "train-rank", "--config"]
    # The token reaches the ranks through the 0600 secrets file only.
    assert record["secrets"] == f"{config.index.service_token_env}={token}\n"
    assert record["mode"] == 0o600
    assert exports[SECRETS_ENV].strip('"') == str((out_dir / "launch" / "secrets.env").resolve())
    logs = [p.read_text() for p in (out_dir / "launch").rglob("*.log")]
    assert token not in remote and logs and not any(token in log for log in logs)
    assert sorted(p.name for p in (out_dir / "launch").iterdir()) == ["config.yaml", "logs"]


def test_a_rank_reads_its_secrets_from_the_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secrets.env").write_text("SEARCHRL_RETRIEVER_TOKEN=abc=def\n")
    monkeypatch.setenv(SECRETS_ENV, str(tmp_path / "secrets.env"))
    monkeypatch.delenv("SEARCHRL_RETRIEVER_TOKEN", raising=False)
    load_launch_secrets()
    assert os.environ["SEARCHRL_RETRIEVER_TOKEN"] == "abc=def"
    monkeypatch.setenv(SECRETS_ENV, str(tmp_path / "missing.env"))
    with pytest.raises(LaunchError, match=r"missing\.env.*shares"):
        load_launch_secrets()
