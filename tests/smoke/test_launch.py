"""The train stage through DeepSpeed's launcher (`train.launch.mode=deepspeed`): two gloo
ranks on CPU, started by the stage exactly as `deepspeed --num_gpus 2` starts GPU ranks.

- The Prefect flow with two launched ranks trains the same weights as the same two ranks
  started by hand (RANK / WORLD_SIZE set, no launcher): the launcher adds nothing but the
  processes. Rank 0 logs into the stage's MLflow child run.
- kill -9 of one rank mid-run fails the stage with every rank's last lines in the error;
  killing the stage process itself (SIGKILL on the re-run, SIGTERM on the next) leaves no
  launcher process or rank running; while ranks train, another trainer of the same checkpoint
  dir is refused (the dir's lock names rank 0's pid); every re-run resumes from the newest
  checkpoint and the last one finishes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import load_file

from flows.pipeline import pipeline
from searchrl.tracking import child_runs
from searchrl.train.grpo.checkpoint import CheckpointLockError, checkpoint_dir_lock
from tests.flows.test_pipeline_flow import FAST
from tests.helpers import free_port

pytestmark = [pytest.mark.smoke, pytest.mark.slow]

LAUNCH = ["train.launch.mode=deepspeed", "train.launch.ranks=2", "train.zero_stage=2",
          "train.steps=2", "train.questions_per_step=2", "rollout.group_size=2"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "searchrl", *args]


def _weights(policy_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(policy_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def launched(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[dict[str, Any], list[str]]:
    tmp = tmp_path_factory.mktemp("launch")
    overrides = [*FAST, *LAUNCH, f"run.work_dir={tmp / 'work'}",
                 f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"]
    return pipeline(config_path="configs/tiny.yaml", overrides=overrides), overrides


def test_the_flow_launches_ranks_that_train_like_hand_started_ranks(
        launched: tuple[dict[str, Any], list[str]], tmp_path: Path) -> None:
    result, overrides = launched
    work = Path(result["dataset"].corpus_path).parents[2]
    train = {c["stage"]: c for c in child_runs(result["tracking_uri"],
                                               result["parent_run_id"])}["train_policy"]
    assert train["status"] == "FINISHED" and train["metrics"]["steps"] == 2  # from rank 0
    assert train["params"]["world_size"] == "2"
    logs = sorted((work / "train_policy" / "launch" / "logs").glob("*/*_rank*.log"))
    assert [p.name.rsplit("_", 1)[-1] for p in logs] == ["rank0.log", "rank1.log"]

    # The same two ranks by hand, on a copy of the upstream stages, without the launcher.
    copy = tmp_path / "work"
    for stage in ("validate_gold_labels", "build_index", "filter_curriculum"):
        shutil.copytree(work / stage, copy / stage)
    shutil.copytree(work / "train_policy" / "sft", copy / "train_policy" / "sft")
    # The start the stage prepared, which every rank reads (train/start.py).
    shutil.copy(work / "train_policy" / "start.json", copy / "train_policy")
    port = str(free_port())
    args = ["train-rank", "--config", "configs/tiny.yaml", *overrides, f"run.work_dir={copy}"]
    procs = [subprocess.Popen(
        _cli(*args, f"--local_rank={r}"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=os.environ | {"RANK": str(r), "LOCAL_RANK": str(r),
                          "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                          "OMP_NUM_THREADS": "1"}) for r in (0, 1)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out.decode()[-3000:]
    launched_w = _weights(Path(result["checkpoint"].policy_dir))
    by_hand = _weights(copy / "train_policy" / "policy")
    assert launched_w.keys() == by_hand.keys()
    assert all(torch.equal(launched_w[k], by_hand[k]) for k in launched_w)


def _copy_upstream(work: Path, copy: Path) -> None:
    for stage in ("validate_gold_labels", "build_index", "filter_curriculum"):
        shutil.copytree(work / stage, copy / stage)
    shutil.copytree(work / "train_policy" / "sft", copy / "train_policy" / "sft")


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def _start_until(args: list[str], checkpoint: Path) -> tuple[subprocess.Popen[str],
                                                                list[psutil.Process]]:
    """The stage, once it wrote `checkpoint`, and every process under it."""
    stage = subprocess.Popen(_cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.monotonic() + 600
    while not checkpoint.is_dir():
        assert stage.poll() is None, stage.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {checkpoint.name} within 10 minutes"
        time.sleep(0.5)
    tree = psutil.Process(stage.pid).children(recursive=True)
    assert sum(any(a.startswith("--local_rank=") for a in p.cmdline()) for p in tree) == 2
    return stage, tree


def _all_gone(tree: list[psutil.Process], why: str) -> None:
    deadline = time.monotonic() + 20
    while (left := _running(tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"outlived the stage ({why}): {[p.cmdline() for p in left]}"


def test_a_killed_rank_or_stage_leaves_no_rank_running_and_the_rerun_resumes(
        launched: tuple[dict[str, Any], list[str]], tmp_path: Path) -> None:
    result, overrides = launched
    copy = tmp_path / "work"
    _copy_upstream(Path(result["dataset"].corpus_path).parents[2], copy)
    # Steps take ~0.15 s here, and the ranks of a killed stage may train up to the watchdog's
    # interval (1 s) on: enough steps that no interrupted run can reach the end (with 10, a
    # faster CI machine's SIGKILLed run saved step 10 and the next wait never ended).
    steps = 40
    args = ["train", "--config", "configs/tiny.yaml", *overrides, f"run.work_dir={copy}",
            f"train.steps={steps}", "train.checkpoint_every=2", "train.keep_checkpoints=4",
            # every step runs: the demo's early stop (dev eval every 10) could end it at 30
            "train.early_stop_patience=0"]
    ckpts = copy / "train_policy" / "checkpoints"

    def newest() -> int:
        return max((int(p.name.removeprefix("step_")) for p in ckpts.glob("step_*")), default=0)

    # kill -9 of rank 1: the stage fails naming every rank's last lines
    stage, tree = _start_until(args, ckpts / "step_000002")
    next(p for p in tree if "--local_rank=1" in p.cmdline()).kill()
    _, err = stage.communicate(timeout=300)
    assert stage.returncode != 0
    assert "DeepSpeed launcher exited" in err and "rank1.log (last lines)" in err
    assert "Re-running resumes" in err
    assert not (copy / "train_policy" / "ref.json").exists()  # nothing marked complete
    _all_gone(tree, "a rank killed")

    # SIGKILL, then SIGTERM, of the stage process itself
    for sig in (signal.SIGKILL, signal.SIGTERM):
        # a checkpoint of this run (the killed one's ranks may have saved one more)
        target = newest() + 2
        assert target < steps, f"an interrupted run trained to step {target - 2} of {steps}"
        stage, tree = _start_until(args, ckpts / f"step_{target:06d}")
        if sig == signal.SIGTERM:  # meanwhile another trainer of this dir is refused
            rank0 = next(p for p in tree if "--local_rank=0" in p.cmdline())
            with (pytest.raises(CheckpointLockError, match=f"pid {rank0.pid} on"),
                  checkpoint_dir_lock(ckpts)):
                pass
        stage.send_signal(sig)
        assert stage.wait(timeout=60) == -sig
        _all_gone(tree, sig.name)

    resume_from = newest()
    rerun = subprocess.run(_cli(*args), capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {ckpts / f'step_{resume_from:06d}'}" in rerun.stdout
    assert (copy / "train_policy" / "ref.json").is_file()
    assert newest() == steps
    logs = sorted((copy / "train_policy" / "launch" / "logs").glob("*/*_rank0.log"))
    assert len(logs) == 4 and all("resumed from" in log.read_text() for log in logs[1:])
