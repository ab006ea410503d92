"""train.keep_best on the real trainer (DeepSpeed CPU, tiny policy, the fixture's fake rollouts)
with a scripted dev metric: the best evaluation's policy is kept (max and min, ties keep the
earlier step; the start, evaluated as step 0, is a candidate), handed on instead of the last
step's, and survives a kill + resume."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import searchrl.train.grpo.trainer as grpo
from searchrl.config import PipelineConfig
from searchrl.gate.report import training_steps
from searchrl.train.grpo.errors import TrainingError
from searchrl.train.grpo.selection import BEST_FILE, best_dir, choose_policy
from searchrl.train.grpo.state import Best
from searchrl.train.grpo.trainer import train_grpo
from tests.train_fixture import build_init_policy, fake_rollouts, tiny_config, train_examples

pytestmark = pytest.mark.smoke

# Dev EM of the start (step 0) and after each step: peaks at 3 and stays there (a tie),
# lowest at 1 (the start is below every step but the first).
DEV = {0: 0.35, 1: 0.3, 2: 0.5, 3: 0.6, 4: 0.6}


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_init_policy(tmp_path_factory.mktemp("init") / "policy")


def scripted(values: dict[int, float]) -> Callable[..., dict[str, float]]:
    """A dev evaluation reporting `values[step]` for the step just done (0: the start's,
    evaluated before any step under keep_best)."""
    def evaluate(state: Any, examples: Any) -> dict[str, float]:
        done = sum(h["step"] >= 1 for h in state.history)
        start_pending = state.config.train.keep_best and not state.history
        return {"dev_em": values[0 if start_pending else done + 1], "dev_em_all": 0.0}
    return evaluate


def _config(tmp: Path, **train: Any) -> PipelineConfig:
    return tiny_config(tmp, **({"eval_every": 1, "keep_best": True} | train))


def _train(cfg: PipelineConfig, init_dir: Path, out: Path, **kwargs: Any) -> grpo.TrainResult:
    return train_grpo(cfg, train_examples(), None, init_dir, out,  # type: ignore[arg-type]
                      eval_examples=train_examples()[:2], rollout_fn=fake_rollouts,
                      progress=False, **kwargs)


def _same(a: Path, b: Path) -> bool:
    """Equal weights (a checkpoint also stores the tied lm_head that save_pretrained drops)."""
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    shared = x.keys() & y.keys()
    return len(shared) >= len(x) - 1 and all(torch.equal(x[k], y[k]) for k in shared)


@pytest.mark.parametrize(("mode", "step"), [("max", 3), ("min", 1)])
def test_the_best_dev_step_is_kept_and_handed_on(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch,
        mode: str, step: int) -> None:
    monkeypatch.setattr(grpo, "evaluate", scripted(DEV))
    cfg = _config(tmp_path, select_mode=mode, checkpoint_every=1, keep_checkpoints=4)
    result = _train(cfg, init_dir, tmp_path / "out")
    assert result.best == Best(step=step, metric="dev_em", mode=mode,  # type: ignore[arg-type]
                               value=DEV[step])
    best = tmp_path / "out" / "best_policy"
    assert result.best_policy_dir == best
    assert json.loads((best / BEST_FILE).read_text()) == {
        "step": step, "metric": "dev_em", "mode": mode, "value": DEV[step]}
    # The weights after that step (its checkpoint), not the last step's.
    assert _same(best, tmp_path / "out" / "checkpoints" / f"step_{step:06d}")
    assert not _same(best, tmp_path / "out" / "policy")
    choice = choose_policy(result, cfg.train)
    assert (choice.policy_dir, choice.selection, choice.selected_step) == (best, "best", step)
    assert (choice.selected_value, choice.last_step, choice.last_value) == (DEV[step], 4, 0.6)
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().split("\n")
            if x]
    assert rows[-1]["best_step"] == step and rows[-1]["dev_em"] == DEV[4]


def test_without_keep_best_the_last_policy_is_handed_on(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpo, "evaluate", scripted(DEV))
    cfg = _config(tmp_path, keep_best=False, steps=2)
    result = _train(cfg, init_dir, tmp_path / "out")
    assert result.best is None and not (tmp_path / "out" / "best_policy").exists()
    choice = choose_policy(result, cfg.train)
    assert (choice.selection, choice.policy_dir, choice.selected_step) == (
        "last", tmp_path / "out" / "policy", 2)
    assert choice.last_value == DEV[2]


def test_an_unknown_select_metric_stops_with_the_valid_ones(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpo, "evaluate", scripted(DEV))
    cfg = _config(tmp_path, select_metric="dev_em_hop9", steps=1)
    with pytest.raises(TrainingError, match=r"dev_em_hop9.*'dev_em', 'dev_em_all'"):
        _train(cfg, init_dir, tmp_path / "out")


def test_the_best_so_far_survives_a_kill_and_resume(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpo, "evaluate", scripted(DEV))
    cfg = _config(tmp_path, checkpoint_every=2)
    full = _train(cfg, init_dir, tmp_path / "full")
    assert full.best is not None and full.best.step == 3
    part = tmp_path / "part"
    first = _train(cfg, init_dir, part, stop_after=3)
    assert first.best_policy_dir is None  # published only when the run is done
    assert best_dir(part, 3).is_dir() and best_dir(part, 2).is_dir()
    # Killed after step 3's best was saved but before its checkpoint was written.
    shutil.rmtree(part / "checkpoints" / "step_000003")
    # After the resume, step 3 evaluates lower than step 2's best (recorded in checkpoint 2).
    monkeypatch.setattr(grpo, "evaluate", scripted(DEV | {3: 0.45, 4: 0.2}))
    resumed = _train(cfg, init_dir, part)
    assert resumed.resumed_from == 2
    assert resumed.best == Best(step=2, metric="dev_em", mode="max", value=0.5)
    assert not best_dir(part, 3).exists()  # the killed run's step-3 best is gone
    # The kept policy is bit for bit the one after step 2 of an uninterrupted run.
    assert resumed.best_policy_dir is not None
    assert _same(resumed.best_policy_dir, tmp_path / "full" / "checkpoints" / "step_000002")


# Dev EM after each step of a 6-step run: peaks at 2, then no new best (3 ties it).
PEAK_EARLY = {0: 0.2, 1: 0.3, 2: 0.6, 3: 0.6, 4: 0.5, 5: 0.7, 6: 0.8}


def test_early_stopping_ends_after_patience_evaluations_without_a_new_best(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patience 2: steps 3 (a tie) and 4 do not beat step 2, so training ends after step 4
    with a checkpoint there, the final policy saved and the best handed on; the same run
    without early stopping goes on (and finds step 5's better evaluation)."""
    monkeypatch.setattr(grpo, "evaluate", scripted(PEAK_EARLY))
    cfg = _config(tmp_path, steps=6, checkpoint_every=5, early_stop_patience=2)
    result = _train(cfg, init_dir, tmp_path / "early")
    assert result.stopped_early and result.steps_done == 4
    assert result.best is not None and result.best.step == 2
    assert (tmp_path / "early" / "policy" / "model.safetensors").is_file()
    assert (tmp_path / "early" / "checkpoints" / "step_000004").is_dir()
    choice = choose_policy(result, cfg.train)
    assert (choice.selected_step, choice.last_step) == (2, 4)
    rows = [json.loads(x) for x in (tmp_path / "early" / "metrics.jsonl").read_text().split("\n")
            if x]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and rows[-1]["early_stopped"] == 1.0
    # A re-run resumes from step 4's checkpoint, sees the early stop and trains no more.
    again = _train(cfg, init_dir, tmp_path / "early")
    assert again.resumed_from == 4 and again.steps_done == 4 and again.stopped_early
    assert again.best is not None and again.best.step == 2
    # It reports what the training cost (every step's time and more), not the seconds of a
    # run that trained no more.
    trained = sum(r.get("step_seconds", 0) for r in rows)  # the start's row has none
    assert trained < again.earlier_attempts_seconds <= result.seconds
    # Without early stopping the run goes on and finds the later, better evaluations.
    full = _train(_config(tmp_path, steps=6, checkpoint_every=5), init_dir, tmp_path / "full")
    assert not full.stopped_early and full.steps_done == 6 and full.best is not None
    assert full.best.step == 6


# Every step is worse on dev than the start.
START_BEST = {0: 0.7, 1: 0.3, 2: 0.5, 3: 0.6, 4: 0.6}


def test_when_no_step_beats_the_start_the_start_is_handed_on(
        tmp_path: Path, init_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's dev evaluation is step 0's: no step beats it, so early stopping ends the
    run after `patience` evaluations, the start's weights are handed on (not the best of the
    worse steps), the kept start survives a kill + resume, and the gate's training condition
    says training changed nothing."""
    monkeypatch.setattr(grpo, "evaluate", scripted(START_BEST))
    cfg = _config(tmp_path, steps=4, checkpoint_every=1, early_stop_patience=2)
    part = tmp_path / "part"
    first = _train(cfg, init_dir, part, stop_after=1)
    assert best_dir(part, 0).is_dir() and first.best_policy_dir is None
    result = _train(cfg, init_dir, part)  # resumed from step 1's checkpoint
    assert result.resumed_from == 1 and result.stopped_early and result.steps_done == 2
    assert result.best == Best(step=0, metric="dev_em", mode="max", value=0.7)
    assert result.best_policy_dir is not None and _same(result.best_policy_dir, init_dir)
    assert not _same(result.best_policy_dir, part / "policy")  # the steps did change it
    choice = choose_policy(result, cfg.train)
    assert (choice.selection, choice.selected_step, choice.last_step) == ("best", 0, 2)
    rows = [json.loads(x) for x in (part / "metrics.jsonl").read_text().split("\n") if x]
    assert [r["step"] for r in rows] == [0, 1, 2] and "reward_mean" not in rows[0]
    steps = training_steps(part / "metrics.jsonl", choice.selected_step)
    assert steps is not None and steps.steps == 2  # the start's row is not a training step
    check = steps.check()
    assert not check.passed and "no dev evaluation beat the start" in check.detail


def test_early_stopping_needs_keep_best(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="early_stop_patience"):
        _config(tmp_path, keep_best=False, early_stop_patience=2)
