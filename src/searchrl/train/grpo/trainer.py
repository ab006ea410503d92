"""The GRPO trainer, top down: setup -> (rollout -> advantages -> update -> re-estimate ->
evaluate -> log -> checkpoint)* -> save. The loop and its steps are here; what they work on
and call lives beside it: `state.py` (the trainer's records: its state, best, result),
`setup.py` (building and resuming that state), `update.py` (the PPO/GRPO update engine),
`selection.py` (keep-best, early stopping, best or last), `train/seeds.py`, and
`plots.plot_curve`. The policy it starts from is prepared before it runs (`train/start.py`).

Each step rolls out `questions_per_step` questions x `group_size` samples with the live
policy, scores them, turns the rewards into group-relative advantages, and makes
`ppo_epochs x ppo_mini_batches` optimizer steps on them through the DeepSpeed engine.

Weight sync: the `hf` generator holds the engine's module, so it always samples with the
weights just updated (in-process, nothing to copy); the `vllm` generator owns a copy, which
gets the engine's parameters after every update and after a resume (`generator.update_weights`,
gathered first under ZeRO-3).

Several ranks (`deepspeed --num_gpus N`, or N gloo processes on CPU): rank r samples its own
shard of the curriculum (every N-th question from r, order kept) and rolls out
`questions_per_step / N` questions with its own seeds; the update keeps the averaged gradient
the single-process one (`update.py`); rank 0 alone writes metrics, evaluates, and saves.

The GRPO choices made here, against DeepSeekMath (Shao et al. 2024) eq. 3:
- advantage: group mean baseline, divided by the group std (`train.std_normalize`; off ->
  Dr. GRPO's unnormalised advantage); see `rl/advantages.py`.
- KL: k3 estimator to a frozen copy of the starting policy, *in the loss* (as eq. 3, not as
  a reward penalty), weight `train.kl_coef` (0 skips the reference forward).
- aggregation: `train.loss_agg`, default `token_mean` over every policy token of the
  mini-batch (DAPO) instead of eq. 3's mean of per-sequence means; see `rl/loss.py`.
- masking: only tokens the policy sampled carry loss; inserted `<information>` text and
  template glue are masked out (Search-R1's retrieved-token masking).
- temperature: log-probs (ratio, KL, entropy) are of softmax(logits / rollout.temperature),
  the distribution the rollout sampled from, not of the raw logits.
- old log-probs: the engine's before the first optimizer step on the batch, i.e. of the
  policy that sampled it (with the hf backend the engine's module *is* the sampler): the
  first mini-batch's from its own gradient pass (detached), the others' from one no-grad
  pass before that step. The sampler's own log-probs are not used for the ratio; their mean
  absolute difference to the engine's is logged as `logprob_mismatch`.
- ratio and mini-batches: the batch is split into `train.ppo_mini_batches` mini-batches, one
  optimizer step each, for `train.ppo_epochs` epochs (mini-batch order shuffled per epoch,
  seeded by step and epoch, so a resume replays it). The ratio is exactly 1 on the first
  mini-batch and departs from it after; the PPO clip (`train.clip_eps`) bounds it, logged as
  `clip_fraction`, `ratio_mean` and `ratio_max_abs_dev`. With 1 and 1 (the default): one
  optimizer step per rollout batch, ratio 1, the clip never fires.
- dynamic sampling (`curriculum.dynamic_filtering`): groups without reward variance are
  dropped and the batch is refilled from the curriculum sampler (DAPO), a bounded number of
  rounds.
- PPO-ptx (`train.ptx_coef`, off by default; InstructGPT eq. 2, not in eq. 3): every
  optimizer step adds `ptx_coef` x the SFT loss on gold demonstrations of synthetic worlds the
  cold start never saw, so the copying the cold start taught is not unlearnt where the outcome
  reward does not check it; see `ptx.py`.

Entry points: `train_policy_run` (a rank's GRPO from the start policy the train stage
prepared, `train/stage.py`) and `train_grpo` (the loop, from a policy dir).

Over 400 lines because the loop and its steps read top down here; what they call lives beside it
(above).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from searchrl.codehash import code_fingerprint
from searchrl.config import PipelineConfig
from searchrl.curriculum.difficulty import estimate_difficulty, fill_informative_groups
from searchrl.datasets.io import atomic_write_text, read_passages, read_qa
from searchrl.generation.base import Generator
from searchrl.generation.factory import make_generator, resolve_device
from searchrl.plots import plot_curve
from searchrl.retrieval.base import Searcher
from searchrl.rl.advantages import advantage_stats, group_advantages
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch, rollout_metrics, run_rollouts
from searchrl.sinks import MetricsSink
from searchrl.train.cold_start.sft import save_policy
from searchrl.train.distributed import deepspeed_setup as ds
from searchrl.train.grpo import selection
from searchrl.train.grpo.checkpoint import save_checkpoint
from searchrl.train.grpo.errors import TrainingError
from searchrl.train.grpo.setup import setup_trainer
from searchrl.train.grpo.state import GeneratorFactory, RolloutFn, TrainerState, TrainResult
from searchrl.train.grpo.update import ppo_update, sync_weights, timed
from searchrl.train.seeds import rollout_seed
from searchrl.types import QAExample

log = logging.getLogger(__name__)

__all__ = ["TrainResult", "TrainerState", "setup_trainer", "train_grpo", "train_policy_run"]


# --- entry points: a rank's GRPO from the prepared start, and the GRPO loop


def train_policy_run(config: PipelineConfig, train_path: Path, corpus_path: Path,
                     searcher: Searcher, init_dir: Path, out_dir: Path, *,
                     init_seconds: float = 0.0, dev_path: Path | None = None,
                     sink: MetricsSink | None = None, progress: bool = True) -> TrainResult:
    """GRPO on `train_path` (curriculum order) from the start policy in `init_dir`, which the
    train stage prepared before any rank runs (`train/start.py`: the cold start, or the champion
    under train.init=champion); `init_seconds` is its time charged to training (the cold
    start's, 0 for a champion). `dev_path` questions feed the greedy learning curve.
    """
    train = read_qa(train_path)
    if not train:
        raise TrainingError(f"{train_path}: no training questions (curriculum dropped all?)")
    passages = read_passages(corpus_path)
    ds.init_distributed(resolve_device(config.run.device))
    dev = read_qa(dev_path)[: config.train.eval_questions] if dev_path else []
    result = train_grpo(config, train, searcher, init_dir, out_dir, sink=sink, eval_examples=dev,
                        progress=progress, exclude_names={p.title for p in passages if p.title})
    result.sft_seconds = init_seconds
    return result


def train_grpo(config: PipelineConfig, train_examples: Sequence[QAExample], searcher: Searcher,
               init_dir: Path, out_dir: Path, *, sink: MetricsSink | None = None,
               eval_examples: Sequence[QAExample] = (), rollout_fn: RolloutFn = run_rollouts,
               stop_after: int | None = None, progress: bool = True,
               generator_factory: GeneratorFactory = make_generator,
               exclude_names: Collection[str] = ()) -> TrainResult:
    """GRPO from the policy in `init_dir`; writes under `out_dir`:

        policy/          final policy (save_pretrained + tokenizer)
        best_policy/     train.keep_best: the best dev evaluation's policy + best.json
                         {step, metric, mode, value} (best/step_NNNNNN/ while training)
        checkpoints/     step_NNNNNN every `train.checkpoint_every` steps (+ at the end)
        metrics.jsonl    one JSON line per step (rewritten atomically each step); under
                         train.keep_best a step-0 line first: the start's dev evaluation
        curve.png        the training curve

    Resumes from the newest verified checkpoint when `train.resume`. `stop_after` ends the
    loop after that many steps of this call (for tests and preemption drills); the policy is
    then not saved as final. Raises TrainingError after `train.max_nonfinite_steps` skipped
    steps. `generator_factory(config, policy_dir=, model=, tokenizer=)` builds the
    rollout backend (default: `generation.factory.make_generator`). `exclude_names` (this
    run's corpus titles) never become targets of the PPO-ptx demonstrations (`train.ptx_coef`).
    """
    started = time.perf_counter()
    state = setup_trainer(config, train_examples, searcher, init_dir, out_dir, sink=sink,
                          rollout_fn=rollout_fn, generator_factory=generator_factory,
                          # the trainer's code is part of the run's identity (resume)
                          trainer_code=code_fingerprint(train_policy_run),
                          exclude_names=exclude_names)
    state.started = started
    tcfg = config.train
    end = tcfg.steps if stop_after is None else min(tcfg.steps, state.start_step + stop_after)
    if selection.stopped_early(state.history):
        end = state.start_step  # resumed after an early stop: the run is over
    if state.start_step == 0 and eval_examples and tcfg.eval_every and tcfg.keep_best:
        evaluate_start(state, eval_examples)
    bar = tqdm(range(state.start_step, end), desc="grpo", disable=not (progress and state.lead),
               initial=state.start_step, total=tcfg.steps)
    for step in bar:
        t0 = time.perf_counter()
        # --- rollout (G samples per question, with the live weights)
        rollouts = generate(state, step)
        # --- reward and advantages
        advantages, metrics = step_advantages(state, rollouts)
        # --- update (every rank takes the same branch)
        metrics |= update(state, step, rollouts, advantages)
        times: dict[str, float] = {}
        # --- periodic difficulty re-estimate: retire questions the policy now always solves
        if _every(config.curriculum.reestimate_every, step) and step + 1 < end:
            with timed(times, "time_reestimate_s"):
                metrics |= reestimate(state, step)
        # --- eval (greedy, for the learning curve) and the best policy so far
        if eval_examples and tcfg.eval_every and (
                _every(tcfg.eval_every, step) or step + 1 == tcfg.steps):
            with timed(times, "time_eval_s"):
                if state.lead:
                    metrics |= evaluate(state, eval_examples)
            with timed(times, "time_keep_best_s"):
                if tcfg.keep_best:
                    metrics |= selection.keep_if_best(state, step + 1, metrics)
            if selection.patience_exhausted(state, step + 1, metrics):
                metrics[selection.EARLY_STOP_KEY] = 1.0
        metrics |= times
        # --- log
        log_step(state, step, metrics, seconds=time.perf_counter() - t0)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}",
                        acc=f"{metrics['correct_rate']:.2f}",
                        srch=f"{metrics['searches_per_rollout']:.1f}")
        # --- checkpoint (and the end, when the dev metric stopped improving)
        stop = selection.EARLY_STOP_KEY in metrics
        if _every(tcfg.checkpoint_every, step) or step + 1 == end or stop:
            checkpoint(state, step + 1)
        if stop:
            log.info("early stop after step %d: %d dev evaluations without beating step %s",
                     step + 1, tcfg.early_stop_patience,
                     state.best.step if state.best else "?")
            break
    bar.close()
    # --- save
    return finish(state, init_dir)


def _every(period: int, step: int) -> bool:
    """Whether `step` (0-based) ends a period of `period` steps (0: never)."""
    return bool(period) and (step + 1) % period == 0


# --- rollout


@dataclass
class Rollouts:
    """One step's rollouts: the groups to learn from, and every record rolled out."""

    records: list[RolloutRecord]
    all_records: list[RolloutRecord]
    metrics: dict[str, float]


def generate(state: TrainerState, step: int) -> Rollouts:
    """Roll out this rank's questions of `step` (refilled with informative groups under
    `curriculum.dynamic_filtering`), seeded by step, call and rank."""
    config, times = state.config, dict[str, float]()
    group = config.rollout.group_size
    batches: list[RolloutBatch] = []

    def roll(examples: Sequence[QAExample]) -> list[RolloutRecord]:
        seed = rollout_seed(config.run.seed, step, len(batches), state.rank, "rollout")
        batches.append(state.rollout_fn(examples, state.generator, state.searcher,
                                        config.rollout, config.reward, group_size=group,
                                        seed=seed))
        return batches[-1].records

    per_rank = config.train.questions_per_step // state.n_ranks
    fill: dict[str, float] = {}
    with timed(times, "time_rollout_s"):
        if config.curriculum.dynamic_filtering:
            groups, fill = fill_informative_groups(state.sampler, per_rank, group, roll,
                                                   config.curriculum.max_refill_rounds)
            records = [r for g in groups for r in g]
        else:
            records = roll(state.sampler.draw(per_rank))
    metrics = {f"fill_{k}": v for k, v in fill.items() if k != "zero_variance_fraction"}
    for key in ("time_generation_s", "time_retrieval_s"):
        metrics[key] = sum(b.stats.get(key, 0.0) for b in batches)
    metrics.update(times)
    return Rollouts(records=records, all_records=[r for b in batches for r in b.records],
                    metrics=metrics)


# --- reward and advantages


def step_advantages(state: TrainerState, rollouts: Rollouts
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages of the groups to learn from, and the step's rollout metrics
    over every record (averaged over ranks)."""
    group, tcfg = state.config.rollout.group_size, state.config.train
    rewards = torch.tensor([r.reward for r in rollouts.records], dtype=torch.float32)
    advantages = (group_advantages(rewards, group, std_normalize=tcfg.std_normalize)
                  if rollouts.records else rewards)
    stats = advantage_stats(torch.tensor([r.reward for r in rollouts.all_records]), group)
    metrics = rollout_metrics(rollouts.all_records) | {
        "reward_mean": stats.reward_mean, "reward_std": stats.reward_std,
        "zero_variance_fraction": stats.zero_variance_fraction,
        "groups_used": len(rollouts.records) / group}
    if state.n_ranks > 1:
        keys = sorted(metrics)
        means = ds.all_reduce([metrics[k] for k in keys])
        metrics = {k: v / state.n_ranks for k, v in zip(keys, means, strict=True)}
    return advantages, metrics | rollouts.metrics


# --- update (the engine: update.py)


def update(state: TrainerState, step: int, rollouts: Rollouts, advantages: torch.Tensor
           ) -> dict[str, float]:
    """The policy update of `step` on every rank, or a skip every rank agrees on: no rank has
    a group to learn from (nothing to learn), or some value is non-finite (counted; raises
    TrainingError past `train.max_nonfinite_steps`). A rank without groups of its own joins
    with zero-weight micro-batches on its first group."""
    records = rollouts.records
    anyone_has = ds.all_reduce([float(bool(records))], "max")[0]
    all_finite = ds.all_reduce([float(bool(torch.isfinite(advantages).all()))], "min")[0]
    if not anyone_has:
        log.warning("step %d: no group with reward variance; nothing to learn", step)
        return {"skipped": 1.0}
    result = None
    if all_finite:
        if records:
            result = ppo_update(state, step, records, advantages)
        else:
            filler = rollouts.all_records[:state.config.rollout.group_size]
            result = ppo_update(state, step, filler, torch.zeros(len(filler)), weight=0.0)
        sync_weights(state.generator, state.engine)
    if result is None:
        state.skipped += 1
        log.warning("step %d skipped: non-finite advantages or loss (%d so far)", step,
                    state.skipped)
        limit = state.config.train.max_nonfinite_steps
        if state.skipped > limit:
            raise TrainingError(
                f"{state.skipped} steps skipped for non-finite values (limit "
                f"train.max_nonfinite_steps={limit}); lower train.lr or check rewards")
        return {"skipped": 1.0}
    state.losses.append(result["loss"])
    return result


# --- difficulty re-estimate


def reestimate(state: TrainerState, step: int) -> dict[str, float]:
    """Roll out the whole remaining pool; retire the questions the policy always solves."""
    config = state.config
    pool = list(state.sampler.pool)
    estimate = state.rollout_fn(pool, state.generator, state.searcher, config.rollout,
                                config.reward, group_size=config.rollout.group_size,
                                seed=rollout_seed(config.run.seed, step, 0, state.rank,
                                                  "reestimate"))
    difficulties = estimate_difficulty(pool, estimate.records)
    solved = {d.example_id for d in difficulties if d.pass_rate == 1.0}
    retired = state.sampler.retire(solved)
    return {"reestimate_solved_share": len(solved) / len(difficulties),
            "reestimate_retired": float(retired), "pool_size": float(len(state.sampler.pool))}


# --- eval


def evaluate(state: TrainerState, examples: Sequence[QAExample]) -> dict[str, float]:
    """Greedy dev EM (overall as `dev_em`, and by hop count) for the learning curve."""
    ev = greedy_eval(examples, state.generator, state.searcher, state.config, state.rollout_fn)
    return {f"dev_{k}": v for k, v in ev.items()} | {"dev_em": ev["em_all"]}


def evaluate_start(state: TrainerState, examples: Sequence[QAExample]) -> None:
    """The start policy is a candidate too (train.keep_best): its dev evaluation is step 0's,
    a row of metrics.jsonl without training figures, and its policy best/step_000000. When no
    step beats it, the start is handed on (training changed nothing, and the gate says so)
    rather than the best of policies that are all worse on dev than where RL began."""
    metrics = evaluate(state, examples) if state.lead else {}
    metrics |= selection.keep_if_best(state, 0, metrics)
    record(state, 0, metrics)


def greedy_eval(examples: Sequence[QAExample], generator: Generator, searcher: Searcher,
                config: PipelineConfig, rollout_fn: RolloutFn = run_rollouts,
                mode: str = "agentic") -> dict[str, float]:
    """Greedy EM and searches per question, overall and by hop count (for the curve)."""
    batch = rollout_fn(examples, generator, searcher, config.rollout, config.reward,
                       group_size=1, greedy=True, seed=0, mode=mode)
    by_ex = {e.id: e for e in examples}
    out: dict[str, float] = {}
    groups: dict[str, list[RolloutRecord]] = {"all": list(batch.records)}
    for r in batch.records:
        groups.setdefault(f"hop{by_ex[r.example_id].hops}", []).append(r)
    for name, recs in groups.items():
        out[f"em_{name}"] = sum(r.correct for r in recs) / len(recs)
        out[f"searches_{name}"] = sum(len(r.queries) for r in recs) / len(recs)
    return out


# --- log and checkpoint


def log_step(state: TrainerState, step: int, metrics: dict[str, float], *,
             seconds: float) -> None:
    """Send the step's metrics to the sink and (rank 0) rewrite metrics.jsonl."""
    metrics["step_seconds"] = seconds
    metrics["lr"] = float(state.engine.get_lr()[0])
    record(state, step + 1, metrics)


def record(state: TrainerState, done: int, metrics: dict[str, float]) -> None:
    """Send the metrics of step `done` (0: the start's evaluation) to the sink, add them to
    the history and (rank 0) rewrite metrics.jsonl."""
    state.sink.log_metrics(metrics, step=done)
    state.history.append({"step": done, **metrics})
    if state.lead:
        atomic_write_text(state.metrics_path,
                          "".join(json.dumps(h) + "\n" for h in state.history))


def checkpoint(state: TrainerState, done: int) -> None:
    """Checkpoint after `done` steps: engine, skip count, sampler state, history and the best
    dev evaluation so far (then best dirs no kept checkpoint names are dropped)."""
    save_checkpoint(state.checkpoints, done, state.engine,
                    {"skipped": state.skipped, "sampler": state.sampler.state_dict(),
                     "seconds": state.seconds_so_far(),
                     "history": json.dumps(state.history),
                     "best": json.dumps(state.best.to_dict() if state.best else None)},
                    keep=state.config.train.keep_checkpoints)
    if state.lead and state.config.train.keep_best:
        selection.prune_best(state.out_dir, state.checkpoints, state.best)


# --- save


def finish(state: TrainerState, init_dir: Path) -> TrainResult:
    """Save the final policy and the curve once every step is done (rank 0), and report."""
    tcfg = state.config.train
    steps_done = max([h["step"] for h in state.history], default=0)
    policy_dir = state.out_dir / "policy"
    curve: Path | None = None
    best_policy: Path | None = None
    early = selection.stopped_early(state.history)
    if steps_done >= tcfg.steps or early:
        with ds.full_parameters(state.engine):
            if state.lead:
                save_policy(state.engine.module, state.tokenizer, policy_dir)
        if state.lead:
            curve = plot_curve(state.history, state.out_dir / "curve.png")
            best_policy = selection.publish_final_best(state.out_dir, state.best, tcfg)
        ds.barrier()
    last: dict[str, Any] = next(
        (h for h in reversed(state.history) if h["step"] == steps_done), {})
    last_value = last.get(tcfg.select_metric)
    return TrainResult(policy_dir=policy_dir, sft_dir=init_dir, metrics_path=state.metrics_path,
                       curve_path=curve, steps_done=steps_done, resumed_from=state.start_step,
                       skipped_steps=state.skipped,
                       seconds=state.seconds_so_far(),
                       earlier_attempts_seconds=state.earlier_seconds, losses=state.losses,
                       final_metrics=state.history[-1] if state.history else {},
                       best=state.best if best_policy is not None else None,
                       best_policy_dir=best_policy,
                       last_value=float(last_value) if last_value is not None else None,
                       stopped_early=early)
