"""Trainer faults, with the real trainer (DeepSpeed CPU engine, real checkpoints) in a
subprocess (tests/faults/_driver.py) that is SIGKILLed at precise points:

- kill -9 mid-step (after the optimizer step, before metrics/checkpoint), then resume: final
  weights, per-step losses and metrics.jsonl equal an uninterrupted run;
- kill -9 inside a checkpoint write (data files written / manifest written, not yet renamed):
  the previous checkpoint stays usable, the partial one is never picked, resume succeeds;
- a truncated checkpoint file fails its checksum with an error naming the file, is skipped on
  resume (from the previous checkpoint, same result), and the trainer says so in its log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from searchrl.train.grpo.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    step_dir,
    verify_checkpoint,
)

DRIVER = Path(__file__).with_name("_driver.py")
REPO = DRIVER.parents[2]
# The first DeepSpeed CPU init JIT-builds an op (~35 s, cached after); a loaded box is slow.
PAUSE_TIMEOUT_S = 420.0
RUN_TIMEOUT_S = 600.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Each run picks its own rendezvous port (a killed run must not leave one behind in env).
    for key in ("MASTER_PORT", "MASTER_ADDR", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return env


def _driver(*args: str) -> list[str]:
    return [sys.executable, str(DRIVER), *args]


def run_to_end(init: Path, out: Path) -> dict[str, Any]:
    """Run the driver to completion; its result JSON plus the captured log (`log`)."""
    proc = subprocess.run(_driver("--init", str(init), "--out", str(out)), env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["log"] = proc.stderr
    return result


def run_and_kill(init: Path, out: Path, point: str) -> None:
    """Start the driver, wait until it sits at `point`, SIGKILL it; assert it died by it."""
    marker = out.parent / f"{out.name}.paused"
    marker.unlink(missing_ok=True)
    err = out.parent / f"{out.name}.stderr"
    with err.open("w") as err_fh:
        proc = subprocess.Popen(
            _driver("--init", str(init), "--out", str(out), "--pause-at", point, "--marker",
                    str(marker)), env=_env(), stdout=subprocess.DEVNULL, stderr=err_fh)
        try:
            deadline = time.monotonic() + PAUSE_TIMEOUT_S
            while not marker.exists():
                assert proc.poll() is None, (f"driver exited ({proc.returncode}) before "
                                             f"reaching {point}:\n{err.read_text()[-4000:]}")
                assert time.monotonic() < deadline, f"driver never reached {point}"
                time.sleep(0.1)
            assert marker.read_text() == point
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"tensors differ: {differ}"


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _tmp_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob(".*"))


def _assert_same_as_baseline(result: dict[str, Any], out: Path, base: dict[str, Any],
                             base_out: Path) -> None:
    """Resumed from step 2, and everything the run leaves equals the uninterrupted run."""
    assert result["resumed_from"] == 2 and result["steps_done"] == 4
    assert result["losses"] == base["losses"]
    rows, base_rows = _metrics(out), _metrics(base_out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # replayed steps not duplicated
    assert [r["loss"] for r in rows] == [r["loss"] for r in base_rows]
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in base_rows]
    _assert_same_weights(out / "policy" / "model.safetensors",
                         base_out / "policy" / "model.safetensors")
    assert latest_checkpoint(out / "checkpoints") == step_dir(out / "checkpoints", 4)
    _assert_same_weights(step_dir(out / "checkpoints", 4) / "model.safetensors",
                         step_dir(base_out / "checkpoints", 4) / "model.safetensors")
    assert _tmp_dirs(out) == []  # a stale temp dir is cleaned up, never kept around


# --- fixtures: the tiny starting policy and one uninterrupted run


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("init") / "policy"
    subprocess.run(_driver("--init", str(out)), env=_env(), check=True, timeout=RUN_TIMEOUT_S,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, init_dir: Path
             ) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("baseline") / "run"
    result = run_to_end(init_dir, out)
    assert result["resumed_from"] == 0 and result["steps_done"] == 4
    assert len(result["losses"]) == 4
    # The policy moved: comparing final weights below is not comparing two copies of init.
    start, end = _weights(init_dir / "model.safetensors"), _weights(
        out / "policy" / "model.safetensors")
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "run_key.json", "step_000002", "step_000004"]
    return result, out


# --- 1. kill -9 mid-step, then resume


@pytest.mark.slow  # ~16 s (two trainer processes): CI's slow step; the checkpoint-write
# kill below keeps a kill-and-resume in the default run
def test_kill_mid_step_then_resume_equals_uninterrupted(
        tmp_path: Path, init_dir: Path, baseline: tuple[dict[str, Any], Path]) -> None:
    base, base_out = baseline
    out = tmp_path / "run"
    # Step 4's optimizer step is done in memory; step 3 is logged but not checkpointed.
    run_and_kill(init_dir, out, "update:4")
    assert not (out / "policy").exists()
    assert latest_checkpoint(out / "checkpoints") == step_dir(out / "checkpoints", 2)
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3]
    assert [r["loss"] for r in _metrics(out)] == base["losses"][:3]

    resumed = run_to_end(init_dir, out)
    _assert_same_as_baseline(resumed, out, base, base_out)


# --- 2. kill -9 during a checkpoint write


@pytest.mark.parametrize("moment", [
    pytest.param("data", marks=pytest.mark.slow),  # ~17 s; the manifest case runs by default
    "manifest"])
def test_kill_during_checkpoint_write_keeps_the_previous_one(
        tmp_path: Path, init_dir: Path, baseline: tuple[dict[str, Any], Path],
        moment: str) -> None:
    base, base_out = baseline
    out = tmp_path / "run"
    root = out / "checkpoints"
    run_and_kill(init_dir, out, f"save:4:{moment}")
    # It really died mid-write: the partial checkpoint is there, under its temp name only.
    partial = root / ".step_000004.tmp"
    assert partial.is_dir() and (partial / "model.safetensors").is_file()
    assert not step_dir(root, 4).exists()
    if moment == "data":
        with pytest.raises(CheckpointError, match=r"no manifest\.json"):
            verify_checkpoint(partial)
    else:
        assert verify_checkpoint(partial)["step"] == 4  # complete, yet not renamed: not final
    # The previous checkpoint is intact and is the one resume will pick.
    assert verify_checkpoint(step_dir(root, 2))["step"] == 2
    assert latest_checkpoint(root) == step_dir(root, 2)

    resumed = run_to_end(init_dir, out)
    assert f"resumed from {step_dir(root, 2)}" in resumed["log"]
    _assert_same_as_baseline(resumed, out, base, base_out)


# --- 3. a truncated checkpoint file


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "trainer_state.pt"])
def test_truncated_file_fails_its_checksum_naming_the_file(
        tmp_path: Path, baseline: tuple[dict[str, Any], Path], name: str) -> None:
    _, base_out = baseline
    root = tmp_path / "checkpoints"
    shutil.copytree(base_out / "checkpoints", root)
    bad = step_dir(root, 4) / name
    _truncate(bad)
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(step_dir(root, 4))
    assert str(bad) in str(info.value) and "checksum mismatch" in str(info.value)
    # Loading it directly fails the same way, before anything touches the engine.
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(step_dir(root, 4), engine=None)
    assert latest_checkpoint(root) == step_dir(root, 2)


def test_truncated_manifest_is_an_error_naming_it(
        tmp_path: Path, baseline: tuple[dict[str, Any], Path]) -> None:
    _, base_out = baseline
    root = tmp_path / "checkpoints"
    shutil.copytree(base_out / "checkpoints", root)
    manifest = step_dir(root, 4) / "manifest.json"
    _truncate(manifest)
    with pytest.raises(CheckpointError, match="not valid JSON") as info:
        verify_checkpoint(step_dir(root, 4))
    assert str(manifest) in str(info.value)
    assert latest_checkpoint(root) == step_dir(root, 2)


@pytest.fixture(scope="module")
def resumed_past_corrupt(tmp_path_factory: pytest.TempPathFactory, init_dir: Path,
                         baseline: tuple[dict[str, Any], Path]
                         ) -> tuple[dict[str, Any], Path, Path]:
    """A run whose newest checkpoint (step 4) has a truncated model file, resumed."""
    _, base_out = baseline
    out = tmp_path_factory.mktemp("corrupt") / "run"
    out.mkdir()
    shutil.copytree(base_out / "checkpoints", out / "checkpoints")
    shutil.copy(base_out / "metrics.jsonl", out / "metrics.jsonl")
    bad = step_dir(out / "checkpoints", 4) / "model.safetensors"
    _truncate(bad)
    return run_to_end(init_dir, out), out, bad


def test_resume_skips_a_truncated_checkpoint_and_matches_uninterrupted(
        resumed_past_corrupt: tuple[dict[str, Any], Path, Path],
        baseline: tuple[dict[str, Any], Path]) -> None:
    result, out, _ = resumed_past_corrupt
    base, base_out = baseline
    assert f"resumed from {step_dir(out / 'checkpoints', 2)}" in result["log"]
    _assert_same_as_baseline(result, out, base, base_out)  # step 4 rewritten, verified


def test_trainer_warns_naming_the_skipped_corrupt_checkpoint(
        resumed_past_corrupt: tuple[dict[str, Any], Path, Path]) -> None:
    result, _, bad = resumed_past_corrupt
    warnings = [line for line in result["log"].splitlines() if line.startswith("WARNING")]
    assert any(str(bad) in line and "checksum" in line for line in warnings), warnings
