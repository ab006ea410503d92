"""Which policy a training run hands on: keep-best, early stopping, best or last.

keep-best (`train.keep_best`): every dev evaluation that beats the best so far by
`train.select_metric` (`select_mode`) is saved as `<out>/best/step_NNNNNN/` (a policy +
best.json); the trainer state records the best so far, so a checkpoint knows its best. A best
dir is kept while the current state or a kept checkpoint names it: a kill after an
improvement but before the next checkpoint leaves a dir no checkpoint names, which the resume
removes (the replayed steps re-evaluate it), and the resumed best's own dir is still there. At
the end the selected one is copied to `<out>/best_policy/` (atomically, best.json inside).

early stopping (`train.early_stop_patience`): the run ends once that many dev evaluations in
a row have not beaten the best; the step that decided it is logged with `EARLY_STOP_KEY`, so
a re-run of a finished run does not train on.

`choose_policy`: the best dev evaluation's policy under keep-best, else the last step's.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from searchrl.config import TrainConfig
from searchrl.datasets.io import atomic_write_text, publish_dir
from searchrl.train.cold_start.sft import save_policy
from searchrl.train.distributed.deepspeed_setup import all_reduce, barrier, full_parameters
from searchrl.train.grpo.checkpoint import STEP_PREFIX, CheckpointError, safe_load, state_file
from searchrl.train.grpo.errors import TrainingError
from searchrl.train.grpo.state import Best, TrainerState, TrainResult

log = logging.getLogger(__name__)

EARLY_STOP_KEY = "early_stopped"  # logged (1.0) by the step whose evaluation ended the run
BEST_ROOT = "best"
BEST_POLICY = "best_policy"
BEST_FILE = "best.json"


def improves(value: float, best: Best | None, mode: Literal["max", "min"]) -> bool:
    """Strictly better than `best` (ties keep the earlier step); NaN never improves."""
    if not np.isfinite(value):
        return False
    if best is None:
        return True
    return value > best.value if mode == "max" else value < best.value


# --- the trainer's side: called by the loop in grpo.py


def keep_if_best(state: TrainerState, done: int, metrics: dict[str, float]
                 ) -> dict[str, float]:
    """Save the policy as best/step_<done> when `train.select_metric` (rank 0's dev
    evaluation in `metrics`) beats the best so far. Every rank calls it (the save gathers
    ZeRO-3 weights); rank 0 decides and writes. Returns the best step and value to log."""
    tcfg = state.config.train
    metric, mode = tcfg.select_metric, tcfg.select_mode
    value = metrics.get(metric, math.nan)
    improved = missing = 0.0
    if state.lead:
        missing = float(metric not in metrics)
        improved = float(improves(value, state.best, mode))
    improved, missing = all_reduce([improved, missing], "max")
    if missing:
        raise TrainingError(f"train.select_metric={metric!r} is not among the dev metrics "
                            f"({sorted(k for k in metrics if k.startswith('dev_'))})")
    if improved:
        target = best_dir(state.out_dir, done)
        with full_parameters(state.engine):
            if state.lead:
                save_policy(state.engine.module, state.tokenizer, target)
        if state.lead:
            state.best = Best(step=done, metric=metric, mode=mode, value=value)
            write_best_file(target, state.best)
        barrier()
    if state.best is None:
        return {}
    return {"best_step": float(state.best.step), "best_value": state.best.value}


def patience_exhausted(state: TrainerState, done: int, metrics: dict[str, float]) -> bool:
    """Whether `train.early_stop_patience` dev evaluations in a row, the one in `metrics` (of
    step `done`) included, have not beaten the best. Rank 0 holds the evaluations and decides;
    every rank calls this and gets its answer."""
    tcfg = state.config.train
    if not tcfg.early_stop_patience:
        return False
    exhausted = 0.0
    if state.lead and state.best is not None and tcfg.select_metric in metrics:
        since = sum(h["step"] > state.best.step and tcfg.select_metric in h
                    for h in state.history) + (done > state.best.step)
        exhausted = float(since >= tcfg.early_stop_patience)
    return bool(all_reduce([exhausted], "max")[0])


def stopped_early(history: Sequence[dict[str, Any]]) -> bool:
    """Whether the run's last logged step ended it by early stopping."""
    return bool(history) and bool(history[-1].get(EARLY_STOP_KEY))


def resumed_best(state: TrainerState, best: Best | None) -> Best | None:
    """The checkpoint's best, if it still applies and its policy is on disk; best dirs that
    no kept checkpoint up to the resumed step names are removed (rank 0)."""
    tcfg = state.config.train
    if not tcfg.keep_best:
        return None
    if best is not None and (best.metric, best.mode) != (tcfg.select_metric, tcfg.select_mode):
        log.warning("the checkpoint's best is by %s (%s), train.select_metric/select_mode now "
                    "say %s (%s): the best starts over", best.metric, best.mode,
                    tcfg.select_metric, tcfg.select_mode)
        best = None
    if not state.lead:
        return None
    prune_best(state.out_dir, state.checkpoints, best, upto=state.start_step)
    if best is not None and not best_dir(state.out_dir, best.step).is_dir():
        log.warning("the best policy of step %d is missing under %s: the best starts over",
                    best.step, state.out_dir / BEST_ROOT)
        best = None
    return best


def clear_bests(out_dir: Path, *, resumed: bool) -> None:
    """At the start of a run (rank 0): a fresh run removes another run's best dirs; either way
    `best_policy/` goes (published again when this run finishes; until then it would be
    another run's)."""
    if not resumed:
        shutil.rmtree(out_dir / BEST_ROOT, ignore_errors=True)  # another run's bests
    shutil.rmtree(out_dir / BEST_POLICY, ignore_errors=True)


def publish_final_best(out_dir: Path, best: Best | None, tcfg: TrainConfig) -> Path | None:
    """At the end of a run (rank 0): under `train.keep_best` the best dev evaluation's policy
    copied to `best_policy/`, returned; None without one (warned: the last step's is used)."""
    if tcfg.keep_best and best is not None:
        return publish_best(out_dir, best)
    if tcfg.keep_best:
        log.warning("train.keep_best: no dev evaluation gave a finite %s (no dev "
                    "questions?); the last step's policy is used", tcfg.select_metric)
    return None


# --- the policy handed on


@dataclass(frozen=True)
class PolicyChoice:
    """The policy the train stage hands to evaluation and the registry, and why."""

    policy_dir: Path
    selection: Literal["best", "last"]
    selected_step: int
    selected_value: float | None
    last_step: int
    last_value: float | None
    metric: str


def choose_policy(result: TrainResult, tcfg: TrainConfig) -> PolicyChoice:
    """The best dev evaluation's policy under `train.keep_best` (when there was one), else
    the last step's; both steps and their `train.select_metric` recorded either way."""
    last = (result.steps_done, result.last_value)
    if tcfg.keep_best and result.best is not None and result.best_policy_dir is not None:
        return PolicyChoice(result.best_policy_dir, "best", result.best.step, result.best.value,
                            *last, tcfg.select_metric)
    return PolicyChoice(result.policy_dir, "last", *last, *last, tcfg.select_metric)


# --- best dirs on disk


def best_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / BEST_ROOT / f"{STEP_PREFIX}{step:06d}"


def write_best_file(policy_dir: Path, best: Best) -> None:
    atomic_write_text(Path(policy_dir) / BEST_FILE, json.dumps(best.to_dict(), indent=2))


def checkpoint_best(path: Path) -> Best | None:
    """The best recorded in checkpoint `path`'s (rank 0) trainer state; None if none."""
    state = safe_load(Path(path) / state_file(0))
    return Best.from_json(state.get("best")) if isinstance(state, dict) else None


def prune_best(out_dir: Path, checkpoints: Path, current: Best | None,
               upto: int | None = None) -> None:
    """Remove every best dir neither `current` nor a kept checkpoint (of step <= `upto`, all
    when None) names. Rank 0 only."""
    root = Path(out_dir) / BEST_ROOT
    if not root.is_dir():
        return
    keep = {current.step} if current is not None else set()
    for ckpt in sorted(p for p in Path(checkpoints).glob(f"{STEP_PREFIX}*") if p.is_dir()):
        if upto is not None and int(ckpt.name.removeprefix(STEP_PREFIX)) > upto:
            continue
        try:
            named = checkpoint_best(ckpt)
        except (CheckpointError, OSError, KeyError, ValueError) as exc:
            log.warning("best policy pruning: cannot read %s (%s); kept its bests", ckpt, exc)
            return
        if named is not None:
            keep.add(named.step)
    for path in root.iterdir():
        step = path.name.removeprefix(STEP_PREFIX)
        if path.name.startswith(STEP_PREFIX) and step.isdigit() and int(step) in keep:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def publish_best(out_dir: Path, best: Best) -> Path:
    """Copy best/step_N to `<out>/best_policy/` (temp sibling + rename); returns it."""
    source = best_dir(out_dir, best.step)
    if not source.is_dir():
        raise CheckpointError(f"{source}: the best policy (step {best.step}) is missing")
    final = Path(out_dir) / BEST_POLICY
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(source, tmp)
    write_best_file(tmp, best)
    publish_dir(tmp, final)
    return final
