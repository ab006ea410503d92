"""Checkpoints: atomic, verified, pickle-free; RNG and optimizer state round-trip."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from searchrl.train.grpo.checkpoint import (
    CheckpointError,
    CheckpointLockError,
    capture_rng,
    checkpoint_dir_lock,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    step_dir,
)


class FakeEngine:
    """The slice of a ZeRO-0 DeepSpeed engine the checkpoint code touches."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.module = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7))
        self.module[1].weight = self.module[0].weight  # tied, like the tiny Llama's head
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=0.1)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / 3))

    def zero_optimization_stage(self) -> int:
        return 0

    def train_step(self) -> None:
        loss = self.module(torch.tensor([1, 2, 3])).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.lr_scheduler.step()


def _params(engine: FakeEngine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.module.parameters()]


def test_roundtrip_restores_model_optimizer_scheduler_and_state(tmp_path: Path) -> None:
    a = FakeEngine()
    for _ in range(3):
        a.train_step()
    path = save_checkpoint(tmp_path, 3, a, {"sampler": {"position": 5}, "note": "x"})
    b = FakeEngine(seed=1)
    state = load_checkpoint(path, b)
    assert state["step"] == 3 and state["sampler"] == {"position": 5}
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b), strict=True))
    assert b.lr_scheduler.last_epoch == a.lr_scheduler.last_epoch
    # Same state -> the next step is identical (optimizer moments restored, not reset).
    a.train_step()
    b.train_step()
    assert all(torch.equal(x, y) for x, y in zip(_params(a), _params(b), strict=True))


def test_rng_roundtrip() -> None:
    state = capture_rng()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


def test_latest_skips_incomplete_and_corrupt(tmp_path: Path) -> None:
    eng = FakeEngine()
    save_checkpoint(tmp_path, 2, eng, {}, keep=5)
    save_checkpoint(tmp_path, 4, eng, {}, keep=5)
    # A crash mid-save leaves a temp dir: never taken as a checkpoint.
    (tmp_path / ".step_000006.tmp").mkdir()
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 4)
    # Corrupt the newest: its checksum fails, the previous one is used.
    weights = step_dir(tmp_path, 4) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 2)
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(step_dir(tmp_path, 4), FakeEngine())
    # A dir without a manifest (written last) is incomplete.
    (step_dir(tmp_path, 2) / "manifest.json").unlink()
    assert latest_checkpoint(tmp_path) is None


def test_prunes_to_keep_and_clears_stale_temps(tmp_path: Path) -> None:
    eng = FakeEngine()
    (tmp_path / ".step_000001.tmp").mkdir(parents=True)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, eng, {}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000003"]


class Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("pickled code ran",))


def test_refuses_pickled_objects(tmp_path: Path) -> None:
    eng = FakeEngine()
    path = save_checkpoint(tmp_path, 1, eng, {})
    torch.save({"evil": Evil()}, path / "trainer_state.pt")
    # Re-sign the manifest so only the pickle guard stands in the way.
    manifest = json.loads((path / "manifest.json").read_text())
    import hashlib

    manifest["files"]["trainer_state.pt"] = hashlib.sha256(
        (path / "trainer_state.pt").read_bytes()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="refused"):
        load_checkpoint(path, FakeEngine())


def test_mismatched_model_is_an_error(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 1, FakeEngine(), {})
    other = FakeEngine()
    other.module = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(path, other)


# --- one trainer per checkpoint dir

_HOLD = ("import sys, time; from pathlib import Path; "
         "from searchrl.train.grpo.checkpoint import checkpoint_dir_lock\n"
         "with checkpoint_dir_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True); time.sleep(600)")


def test_a_second_process_cannot_train_into_a_locked_checkpoint_dir(tmp_path: Path) -> None:
    root = tmp_path / "train_policy" / "checkpoints"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(root)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with (pytest.raises(CheckpointLockError, match=rf"pid {holder.pid} on .*wait for it"),
              checkpoint_dir_lock(root)):
            pass
        assert not root.exists()  # refused before touching the dir
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock with the process
        holder.wait()
    with checkpoint_dir_lock(root) as lock:
        assert lock == root.with_name("checkpoints.lock")
        assert f"pid {os.getpid()} " in lock.read_text()
        with checkpoint_dir_lock(root):  # re-entrant in one process (stage + rank 0)
            pass
        probe = subprocess.run([sys.executable, "-c", _HOLD.replace("600", "0"), str(root)],
                               capture_output=True, text=True)
        assert probe.returncode != 0 and f"pid {os.getpid()} " in probe.stderr
    assert lock.read_text() == ""  # released: no holder named

