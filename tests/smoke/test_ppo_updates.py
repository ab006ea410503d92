"""PPO machinery of the trainer with real DeepSpeed (CPU, ZeRO 0) on the tiny policy: old
log-probs from the sampling policy, several optimizer steps per rollout batch, the ratio
leaving 1 (and the clip firing) after the first mini-batch, exactly 1 with one step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from searchrl.train.grpo import update
from searchrl.train.grpo.trainer import TrainResult, train_grpo
from tests.train_fixture import build_init_policy, fake_rollouts, tiny_config, train_examples

pytestmark = pytest.mark.smoke


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_init_policy(tmp_path_factory.mktemp("init") / "policy")


def _run(tmp: Path, init_dir: Path, out: str, stop_after: int | None = None,
         **train: Any) -> tuple[TrainResult, list[dict[str, Any]]]:
    cfg = tiny_config(tmp, **train)
    result = train_grpo(cfg, train_examples(), None, init_dir,  # type: ignore[arg-type]
                        tmp / out, rollout_fn=fake_rollouts, progress=False,
                        stop_after=stop_after)
    rows = [json.loads(x) for x in (tmp / out / "metrics.jsonl").read_text().splitlines()]
    return result, rows


def test_one_mini_batch_one_epoch_is_one_on_policy_step(tmp_path: Path, init_dir: Path) -> None:
    _, rows = _run(tmp_path, init_dir, "one", steps=2, checkpoint_every=0)
    assert len(rows) == 2  # the loop below checks every step
    for row in rows:
        # The old log-probs come from the gradient pass itself: no separate pass, ratio
        # exactly 1, the clip never fires.
        assert "time_old_logprobs_s" not in row
        assert row["optimizer_steps"] == 1.0
        assert row["ratio_max_abs_dev"] == 0.0 and row["clip_fraction"] == 0.0
        assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert row["logprob_mismatch"] < 1e-4  # the hf sampler is the engine's module


def test_mini_batches_step_several_times_and_the_ratio_leaves_one(
        tmp_path: Path, init_dir: Path) -> None:
    _, rows = _run(tmp_path, init_dir, "mini", steps=2, checkpoint_every=0,
                   ppo_mini_batches=2, ppo_epochs=2, clip_eps=0.05)
    assert len(rows) == 2  # the loop below checks every step
    for row in rows:
        assert row["optimizer_steps"] == 4.0  # 2 mini-batches x 2 epochs
        assert row["time_old_logprobs_s"] > 0.0  # the second mini-batch needs its own pass
        # Every mini-batch after the first sees a policy the earlier steps moved.
        assert row["ratio_max_abs_dev"] > 0.0
        assert row["ratio_mean"] != 1.0
    assert any(row["clip_fraction"] > 0.0 for row in rows)


@pytest.mark.parametrize("ppo", [{}, {"ppo_mini_batches": 2, "ppo_epochs": 2}])
def test_old_logprobs_from_the_gradient_pass_equal_a_separate_pass(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch,
        ppo: dict[str, int]) -> None:
    """Taking the first mini-batch's old log-probs from its gradient pass (no optimizer step
    yet) trains exactly as one no-grad pass of the sampling policy over every micro-batch."""
    own, own_rows = _run(tmp_path, init_dir, "own", steps=2, checkpoint_every=0, **ppo)
    original = update._sampling_logprobs

    def separate_pass(*args: Any, own_pass: set[Any]) -> Any:
        return original(*args, own_pass=set())

    monkeypatch.setattr(update, "_sampling_logprobs", separate_pass)
    sep, sep_rows = _run(tmp_path, init_dir, "separate", steps=2, checkpoint_every=0, **ppo)
    assert len(sep_rows) == len(own_rows) == 2
    assert all(row["time_old_logprobs_s"] > 0.0 for row in sep_rows)
    assert own.losses == sep.losses
    for key in ("entropy", "logprob_mismatch", "ratio_mean", "clip_fraction"):
        assert [r[key] for r in own_rows] == pytest.approx([r[key] for r in sep_rows],
                                                             rel=1e-6, abs=1e-9), key
    a = load_file(str(tmp_path / "own" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "separate" / "policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mini_batch_epochs_resume_bit_for_bit(tmp_path: Path, init_dir: Path) -> None:
    """The shuffled mini-batch order is seeded by step and epoch: a resumed run replays it."""
    ppo = {"ppo_mini_batches": 2, "ppo_epochs": 2}
    full, _ = _run(tmp_path, init_dir, "full", **ppo)
    _run(tmp_path, init_dir, "part", stop_after=2, **ppo)
    resumed, _ = _run(tmp_path, init_dir, "part", **ppo)
    assert resumed.resumed_from == 2 and resumed.losses == full.losses
    a = load_file(str(tmp_path / "full" / "policy" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "policy" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    one, _ = _run(tmp_path, init_dir, "one")
    assert one.losses[1:] != full.losses[1:]  # the extra steps did change the training
