"""The GRPO trainer, top down: setup -> (generate -> score -> update -> re-estimate ->
evaluate -> log -> checkpoint)* -> save.

Each step rolls out `questions_per_step` questions x `group_size` samples with the live
policy, scores them, turns the rewards into group-relative advantages, and makes
`ppo_epochs x ppo_mini_batches` optimizer steps on them through the DeepSpeed engine (each
mini-batch accumulates gradients over its micro-batches and steps once).

Weight sync: the `hf` generator holds the engine's module, so it always samples with the
weights just updated (in-process, nothing to copy); the `vllm` generator owns a copy, which
gets the engine's parameters after every update and after a resume (`generator.update_weights`,
gathered first under ZeRO-3).

Several ranks (`deepspeed --num_gpus N`, or N gloo processes on CPU): rank r samples its own
shard of the curriculum (every N-th question from r, order kept), rolls out
`questions_per_step / N` questions with its own seeds, and each mini-batch's loss is
normalised by that mini-batch's token count over all ranks, so the averaged gradient is the
single-process one. Every rank runs the same number of mini-batches and, in each, of
micro-batches (a rank short of informative groups runs zero-weight ones: ZeRO-2 reduces
gradients inside every backward), the ranks agree on skipping a non-finite step, and rank 0
alone writes metrics, evaluates, and saves the policy.

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

Entry points: `train_policy_run` (cold start + GRPO; `python -m searchrl train` and the flow
call it) and `train_grpo` (GRPO from a given start policy).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from matplotlib.figure import Figure
from tqdm import tqdm
from transformers import PreTrainedModel

from searchrl.codehash import code_fingerprint
from searchrl.config import PipelineConfig, TrainConfig
from searchrl.curriculum.difficulty import (
    RefillingSampler,
    estimate_difficulty,
    fill_informative_groups,
)
from searchrl.data.io import atomic_write_text, read_passages, read_qa
from searchrl.generation.base import Generator
from searchrl.generation.factory import make_generator, resolve_device
from searchrl.models.tiny import init_policy, load_policy
from searchrl.plots import save_figure
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.rl.advantages import advantage_stats, group_advantages
from searchrl.rl.loss import aggregate_denominator, grpo_loss
from searchrl.rl.prompts import ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, build_prompt, format_passages
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch, rollout_metrics, run_rollouts
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train.checkpoint import (
    BEST_POLICY,
    BEST_ROOT,
    Best,
    best_dir,
    improves,
    load_checkpoint,
    prepare_checkpoint_dir,
    prune_best,
    publish_best,
    run_identity,
    save_checkpoint,
    write_best_file,
)
from searchrl.train.demos import SearcherFactory, build_demos, corpus_documents, world_demos
from searchrl.train.ds import (
    all_reduce,
    barrier,
    build_engine,
    full_parameters,
    init_distributed,
    rank,
    world_size,
)
from searchrl.train.sft import run_sft, save_policy
from searchrl.train.tensors import PackedBatch, pack_records, token_entropy, token_logprobs
from searchrl.types import Passage, QAExample, SearchHit

log = logging.getLogger(__name__)

RolloutFn = Callable[..., RolloutBatch]
GeneratorFactory = Callable[..., Generator]
SFT_KEY_FILE = "searchrl_sft.json"
SFT_STATS_FILE = "searchrl_sft_stats.json"


class TrainingError(RuntimeError):
    """Training cannot continue (too many non-finite steps, bad inputs); names the setting."""


@dataclass
class TrainResult:
    policy_dir: Path
    sft_dir: Path
    metrics_path: Path
    curve_path: Path | None
    steps_done: int
    resumed_from: int
    skipped_steps: int
    seconds: float  # GRPO wall seconds, earlier attempts' included (below)
    sft_seconds: float = 0.0
    # A resumed run: the training seconds of earlier attempts up to the checkpoint resumed
    # from (their work after it was redone, so it is not counted twice).
    earlier_attempts_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)
    # train.keep_best: the best dev evaluation and its policy (None: off, or never evaluated);
    # `last_value` is `train.select_metric` at the last step, when it was evaluated.
    best: Best | None = None
    best_policy_dir: Path | None = None
    last_value: float | None = None
    stopped_early: bool = False  # train.early_stop_patience ended the run before train.steps


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --- seeds: every random draw of the loop is a pure function of where it happens, not of
# global RNG state, so a resumed run replays it exactly. Changing a value changes every result.

SeedPurpose = Literal["rollout", "reestimate", "minibatch_order"]
WORLD_SEED_STRIDE = 7_919  # extra synthetic worlds of the cold start: base + stride * (i + 1)
_RUN_STRIDE = 1_000_003  # run seed -> a block of training-rollout seeds
_STEP_STRIDE = 31  # step -> room for 31 rollout calls (refills) per step
_RANK_STRIDE = 7_777_777  # rank -> its own seeds
_REESTIMATE_RUN_STRIDE = 7_919
_ORDER_SALT = 0x5EED


def rollout_seed(base_seed: int, step: int, call: int, rank: int,
                 purpose: SeedPurpose) -> int:
    """The seed of one random draw of the trainer.

    rollout          the `call`-th rollout call of `step` (refills count up) on `rank`
    reestimate       the difficulty re-estimate after `step` (`call` unused)
    minibatch_order  the mini-batch order of epoch `call` of `step` (the same on every rank)
    """
    if purpose == "rollout":
        return (base_seed * _RUN_STRIDE + step) * _STEP_STRIDE + call + _RANK_STRIDE * rank
    if purpose == "reestimate":
        return base_seed * _REESTIMATE_RUN_STRIDE + step + _RANK_STRIDE * rank
    return ((base_seed * _RUN_STRIDE + step) * _STEP_STRIDE + call) ^ _ORDER_SALT


# --- cold start


def information_block(hits: Sequence[SearchHit]) -> str:
    """The `<information>` block exactly as the rollout loop inserts it (before truncation)."""
    return f"{INFO_OPEN}{format_passages(hits)}{INFO_CLOSE}"


def cold_start(config: PipelineConfig, train_examples: Sequence[QAExample],
               passages: Sequence[Passage], searcher: Searcher, out_dir: Path,
               sink: MetricsSink | None = None) -> Path:
    """The policy RL starts from, saved (model + tokenizer) in `out_dir`; returns it.

    Tiny model: tokenizer trained on corpus + demonstrations, model built from config, SFT on
    scripted demonstrations. Pretrained: loaded, then SFT if `train.sft.enabled`, else the
    model is saved unchanged. Reused as is when `out_dir` holds a policy made from the same
    config sections, data and code (`code_fingerprint(cold_start)`: the demo builder, its
    BM25 searcher, SFT and model code it reaches, so an edited demo builder never reuses an
    old cold start; a key file is written last, so a half-built dir is never reused).
    """
    sink = sink or NullSink()
    cfg = config.train.sft
    key = {"model": config.to_dict()["model"], "sft": cfg.model_dump(mode="json"),
           "rollout_format": [config.rollout.top_k, config.rollout.info_token_budget],
           "seed": config.run.seed, "train_ids": [e.id for e in train_examples],
           "n_passages": len(passages), "code": code_fingerprint(cold_start)}
    if cfg.extra_worlds and cfg.extra_world_demos:
        key["extra_world"] = config.data.synthetic.model_dump(mode="json")
    key_file = out_dir / SFT_KEY_FILE
    if key_file.is_file() and json.loads(key_file.read_text()) == key:
        return out_dir
    started = time.perf_counter()
    seed_everything(config.run.seed)
    demos: list[Any] = []
    if config.model.kind == "tiny" or cfg.enabled:
        demo_kwargs: dict[str, Any] = {
            "prompt_fn": build_prompt, "info_fn": information_block,
            "top_k": config.rollout.top_k, "imperfect_fraction": cfg.imperfect_fraction,
            "imperfect_kinds": cfg.imperfect_kinds,
            "baseline_fraction": cfg.baseline_fraction, "answer_open": ANSWER_OPEN}
        demos, stats = build_demos(train_examples, {p.id: p for p in passages}, searcher,
                                   n_demos=cfg.n_demos, seed=config.run.seed, **demo_kwargs)
        extra, extra_stats = world_demos(
            config.data.synthetic, extra_world_seeds(config), _bm25_searcher(config),
            exclude_names={p.title for p in passages if p.title},
            n_demos=cfg.extra_world_demos, **demo_kwargs)
        demos += extra
        if cfg.corpus_lm:
            demos += corpus_documents(passages, information_block)
        stats.built += extra_stats.built
        for kind, n in extra_stats.kinds.items():
            stats.kinds[kind] = stats.kinds.get(kind, 0) + n
        sink.log_metrics({"sft_demos_extra_worlds": extra_stats.built,
                          "sft_demos": stats.built,
                          "sft_demos_skipped_no_chain": stats.skipped_no_chain,
                          "sft_demos_skipped_not_retrieved": stats.skipped_gold_not_retrieved}
                         | {f"sft_demos_{k}": v for k, v in stats.kinds.items()})
    corpus_texts = [p.contents for p in passages] + [d.text for d in demos]
    model, tokenizer = init_policy(config.model, corpus_texts, seed=config.run.seed)
    if demos and (config.model.kind == "tiny" or cfg.enabled):
        result = run_sft(model, tokenizer, demos, cfg, seed=config.run.seed,
                         on_step=lambda s, loss: sink.log_metrics({"sft_loss": loss}, step=s))
        sink.log_metrics({"sft_seconds": result.seconds, "sft_steps": result.steps,
                          "sft_final_loss": result.losses[-1]})
    save_policy(model, tokenizer, out_dir)
    atomic_write_text(out_dir / SFT_STATS_FILE,
                      json.dumps({"seconds": time.perf_counter() - started,
                                  "demos": len(demos)}))
    atomic_write_text(key_file, json.dumps(key))
    return out_dir


def extra_world_seeds(config: PipelineConfig) -> list[int]:
    """Seeds of the extra synthetic worlds the cold start draws demonstrations from (none
    equals the evaluated world's)."""
    base = config.data.synthetic.seed
    return [base + WORLD_SEED_STRIDE * (i + 1) for i in range(config.train.sft.extra_worlds)]


def _bm25_searcher(config: PipelineConfig) -> SearcherFactory:
    """An in-memory BM25 searcher per extra world (the index stage's BM25 settings)."""
    icfg = config.index.model_copy(update={"retriever": "bm25"})

    def make(passages: Sequence[Passage]) -> Searcher:
        bm25 = BM25Index.build([p.contents for p in passages], k1=icfg.bm25_k1, b=icfg.bm25_b,
                               stopwords=icfg.bm25_stopwords)
        return LocalSearcher(passages, icfg, bm25=bm25)

    return make


# --- the trainer


@dataclass
class TrainerState:
    """Everything the loop works on: built by `setup_trainer`, advanced by the loop's steps."""

    config: PipelineConfig
    engine: Any  # the DeepSpeed engine (its module is the policy)
    ref: PreTrainedModel | None  # frozen start policy for the KL term (None: kl_coef == 0)
    generator: Generator
    tokenizer: Any
    sampler: RefillingSampler
    searcher: Searcher
    rollout_fn: RolloutFn
    sink: MetricsSink
    out_dir: Path
    rank: int
    n_ranks: int
    start_step: int = 0
    skipped: int = 0
    earlier_seconds: float = 0.0  # earlier attempts' seconds up to the resumed checkpoint
    started: float = field(default_factory=time.perf_counter)  # this attempt
    best: Best | None = None  # train.keep_best: the best dev evaluation so far (rank 0)
    history: list[dict[str, Any]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lead: bool = field(init=False)  # rank 0: logs, evaluates, saves
    checkpoints: Path = field(init=False)
    metrics_path: Path = field(init=False)
    pad_id: int = field(init=False)

    def seconds_so_far(self) -> float:
        """Training wall seconds of this run: earlier attempts' and this one's so far."""
        return self.earlier_seconds + time.perf_counter() - self.started

    def __post_init__(self) -> None:
        self.lead = self.rank == 0
        self.checkpoints = self.out_dir / "checkpoints"
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self.pad_id = int(self.tokenizer.pad_token_id)


@dataclass
class Rollouts:
    """One step's rollouts: the groups to learn from, and every record rolled out."""

    records: list[RolloutRecord]
    all_records: list[RolloutRecord]
    metrics: dict[str, float]


def train_grpo(config: PipelineConfig, train_examples: Sequence[QAExample], searcher: Searcher,
               init_dir: Path, out_dir: Path, *, sink: MetricsSink | None = None,
               eval_examples: Sequence[QAExample] = (), rollout_fn: RolloutFn = run_rollouts,
               stop_after: int | None = None, progress: bool = True,
               generator_factory: GeneratorFactory = make_generator) -> TrainResult:
    """GRPO from the policy in `init_dir`; writes under `out_dir`:

        policy/          final policy (save_pretrained + tokenizer)
        best_policy/     train.keep_best: the best dev evaluation's policy + best.json
                         {step, metric, mode, value} (best/step_NNNNNN/ while training)
        checkpoints/     step_NNNNNN every `train.checkpoint_every` steps (+ at the end)
        metrics.jsonl    one JSON line per step (rewritten atomically each step)
        curve.png        the training curve

    Resumes from the newest verified checkpoint when `train.resume`. `stop_after` ends the
    loop after that many steps of this call (for tests and preemption drills); the policy is
    then not saved as final. Raises TrainingError after `train.max_nonfinite_steps` skipped
    steps. `generator_factory(config, policy_dir=, model=, tokenizer=)` builds the
    rollout backend (default: `generation.factory.make_generator`).
    """
    started = time.perf_counter()
    state = setup_trainer(config, train_examples, searcher, init_dir, out_dir, sink=sink,
                          rollout_fn=rollout_fn, generator_factory=generator_factory)
    state.started = started
    tcfg = config.train
    end = tcfg.steps if stop_after is None else min(tcfg.steps, state.start_step + stop_after)
    if stopped_early(state.history):
        end = state.start_step  # resumed after an early stop: the run is over
    bar = tqdm(range(state.start_step, end), desc="grpo", disable=not (progress and state.lead),
               initial=state.start_step, total=tcfg.steps)
    for step in bar:
        t0 = time.perf_counter()
        # --- rollout (G samples per question, with the live weights)
        rollouts = generate(state, step)
        # --- reward and advantages
        advantages, metrics = score(state, rollouts)
        # --- update (every rank takes the same branch)
        metrics |= update(state, step, rollouts, advantages)
        times: dict[str, float] = {}
        # --- periodic difficulty re-estimate: retire questions the policy now always solves
        if _every(config.curriculum.reestimate_every, step) and step + 1 < end:
            with _timed(times, "time_reestimate_s"):
                metrics |= reestimate(state, step)
        # --- eval (greedy, for the learning curve) and the best policy so far
        if eval_examples and tcfg.eval_every and (
                _every(tcfg.eval_every, step) or step + 1 == tcfg.steps):
            with _timed(times, "time_eval_s"):
                if state.lead:
                    metrics |= evaluate(state, eval_examples)
            with _timed(times, "time_keep_best_s"):
                if tcfg.keep_best:
                    metrics |= keep_if_best(state, step + 1, metrics)
            if patience_exhausted(state, step + 1, metrics):
                metrics[EARLY_STOP_KEY] = 1.0
        metrics |= times
        # --- log
        log_step(state, step, metrics, seconds=time.perf_counter() - t0)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}",
                        acc=f"{metrics['correct_rate']:.2f}",
                        srch=f"{metrics['searches_per_rollout']:.1f}")
        # --- checkpoint (and the end, when the dev metric stopped improving)
        if _every(tcfg.checkpoint_every, step) or step + 1 == end or EARLY_STOP_KEY in metrics:
            checkpoint(state, step + 1)
        if EARLY_STOP_KEY in metrics:
            log.info("early stop after step %d: %d dev evaluations without beating step %s",
                     step + 1, tcfg.early_stop_patience,
                     state.best.step if state.best else "?")
            break
    bar.close()
    # --- save
    return finish(state, init_dir)


EARLY_STOP_KEY = "early_stopped"


def stopped_early(history: Sequence[dict[str, Any]]) -> bool:
    """Whether the run's last logged step ended it by early stopping."""
    return bool(history) and bool(history[-1].get(EARLY_STOP_KEY))


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


def _every(period: int, step: int) -> bool:
    """Whether `step` (0-based) ends a period of `period` steps (0: never)."""
    return bool(period) and (step + 1) % period == 0


def setup_trainer(config: PipelineConfig, train_examples: Sequence[QAExample],
                  searcher: Searcher, init_dir: Path, out_dir: Path, *,
                  sink: MetricsSink | None, rollout_fn: RolloutFn,
                  generator_factory: GeneratorFactory) -> TrainerState:
    """Seeds, policy, reference, engine, generator and sampler; resumed from this run's newest
    verified checkpoint when `train.resume` (another run's are moved aside)."""
    tcfg, rcfg = config.train, config.rollout
    device = resolve_device(config.run.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.run.seed)
    model, tokenizer = load_policy(init_dir, config.model.dtype)
    model.to(torch.device(device))  # type: ignore[arg-type]
    ref: PreTrainedModel | None = None
    if tcfg.kl_coef != 0.0:
        ref = copy.deepcopy(model)
        ref.train(False)
        for p in ref.parameters():
            p.requires_grad_(False)
    if tcfg.zero_stage == 3 and rcfg.backend == "hf":
        raise TrainingError("train.zero_stage=3 partitions the weights the hf rollout backend "
                            "generates with (an all-gather per token); use rollout.backend=vllm "
                            "or train.zero_stage<=2")
    engine = build_engine(model, tcfg, tcfg.questions_per_step * rcfg.group_size, device)
    n_ranks, me = world_size(), rank()
    if tcfg.questions_per_step % n_ranks or len(train_examples) < n_ranks:
        raise TrainingError(f"train.questions_per_step={tcfg.questions_per_step} and the "
                            f"{len(train_examples)} training questions must split over "
                            f"{n_ranks} ranks")
    generator = generator_factory(config, policy_dir=init_dir, model=engine.module,
                                  tokenizer=tokenizer)
    sampler = RefillingSampler(pool=list(train_examples)[me::n_ranks],
                               seed=config.run.seed + me)
    state = TrainerState(config=config, engine=engine, ref=ref, generator=generator,
                         tokenizer=tokenizer, sampler=sampler, searcher=searcher,
                         rollout_fn=rollout_fn, out_dir=out_dir, rank=me, n_ranks=n_ranks,
                         sink=sink if sink is not None and me == 0 else NullSink())
    run_key = run_identity(config, [e.id for e in train_examples], init_dir, n_ranks,
                           init_key_file=init_dir / SFT_KEY_FILE)
    ckpt = prepare_checkpoint_dir(state.checkpoints, run_key, resume=tcfg.resume)
    if ckpt is not None:
        saved = load_checkpoint(ckpt, engine)
        state.start_step, state.skipped = int(saved["step"]), int(saved["skipped"])
        state.earlier_seconds = float(saved.get("seconds", 0.0))  # absent: older checkpoints
        sampler.load_state_dict(saved["sampler"])
        state.history = json.loads(saved["history"])
        state.losses = [h["loss"] for h in state.history if "loss" in h]
        state.best = _resumed_best(state, Best.from_json(saved.get("best")))
        _sync_weights(generator, engine)
        log.info("resumed from %s (step %d)", ckpt, state.start_step)
    elif state.lead:
        shutil.rmtree(out_dir / BEST_ROOT, ignore_errors=True)  # another run's bests
    if state.lead:
        # Published again when this run finishes; until then it would be another run's.
        shutil.rmtree(out_dir / BEST_POLICY, ignore_errors=True)
    state.sink.log_params({"train": tcfg.model_dump(mode="json"), "device": device,
                           "zero_stage": int(engine.zero_optimization_stage()),
                           "world_size": n_ranks, "resumed_from_step": state.start_step})
    return state


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
    with _timed(times, "time_rollout_s"):
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


def score(state: TrainerState, rollouts: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages of the groups to learn from, and the step's rollout metrics
    over every record (averaged over ranks)."""
    group, tcfg = state.config.rollout.group_size, state.config.train
    stats = advantage_stats(torch.tensor([r.reward for r in rollouts.all_records]), group)
    metrics = rollout_metrics(rollouts.all_records) | {
        "reward_mean": stats.reward_mean, "reward_std": stats.reward_std,
        "zero_variance_fraction": stats.zero_variance_fraction,
        "groups_used": len(rollouts.records) / group}
    if state.n_ranks > 1:
        keys = sorted(metrics)
        means = all_reduce([metrics[k] for k in keys])
        metrics = {k: v / state.n_ranks for k, v in zip(keys, means, strict=True)}
    rewards = torch.tensor([r.reward for r in rollouts.records], dtype=torch.float32)
    advantages = (group_advantages(rewards, group, std_normalize=tcfg.std_normalize)
                  if rollouts.records else rewards)
    return advantages, metrics | rollouts.metrics


def update(state: TrainerState, step: int, rollouts: Rollouts, advantages: torch.Tensor
           ) -> dict[str, float]:
    """The policy update of `step` on every rank, or a skip every rank agrees on: no rank has
    a group to learn from (nothing to learn), or some value is non-finite (counted; raises
    TrainingError past `train.max_nonfinite_steps`). A rank without groups of its own joins
    with zero-weight micro-batches on its first group."""
    records = rollouts.records
    anyone_has = all_reduce([float(bool(records))], "max")[0]
    all_finite = all_reduce([float(bool(torch.isfinite(advantages).all()))], "min")[0]
    if not anyone_has:
        log.warning("step %d: no group with reward variance; nothing to learn", step)
        return {"skipped": 1.0}
    result = None
    if all_finite:
        if records:
            result = _update(state, step, records, advantages)
        else:
            filler = rollouts.all_records[:state.config.rollout.group_size]
            result = _update(state, step, filler, torch.zeros(len(filler)), weight=0.0)
        _sync_weights(state.generator, state.engine)
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


def evaluate(state: TrainerState, examples: Sequence[QAExample]) -> dict[str, float]:
    """Greedy dev EM (overall as `dev_em`, and by hop count) for the learning curve."""
    ev = greedy_eval(examples, state.generator, state.searcher, state.config, state.rollout_fn)
    return {f"dev_{k}": v for k, v in ev.items()} | {"dev_em": ev["em_all"]}


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


def _resumed_best(state: TrainerState, best: Best | None) -> Best | None:
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


def log_step(state: TrainerState, step: int, metrics: dict[str, float], *,
             seconds: float) -> None:
    """Send the step's metrics to the sink and (rank 0) rewrite metrics.jsonl."""
    metrics["step_seconds"] = seconds
    metrics["lr"] = float(state.engine.get_lr()[0])
    state.sink.log_metrics(metrics, step=step + 1)
    state.history.append({"step": step + 1, **metrics})
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
        prune_best(state.out_dir, state.checkpoints, state.best)


def finish(state: TrainerState, init_dir: Path) -> TrainResult:
    """Save the final policy and the curve once every step is done (rank 0), and report."""
    tcfg = state.config.train
    steps_done = max([h["step"] for h in state.history], default=0)
    policy_dir = state.out_dir / "policy"
    curve: Path | None = None
    best_policy: Path | None = None
    early = stopped_early(state.history)
    if steps_done >= tcfg.steps or early:
        with full_parameters(state.engine):
            if state.lead:
                save_policy(state.engine.module, state.tokenizer, policy_dir)
        if state.lead:
            curve = plot_curve(state.history, state.out_dir / "curve.png")
            if tcfg.keep_best and state.best is not None:
                best_policy = publish_best(state.out_dir, state.best)
            elif tcfg.keep_best:
                log.warning("train.keep_best: no dev evaluation gave a finite %s (no dev "
                            "questions?); the last step's policy is used", tcfg.select_metric)
        barrier()
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


def _sync_weights(generator: Generator, engine: Any) -> None:
    """Push the engine's parameters into a generator that keeps its own copy (vLLM); the hf
    generator shares the engine's module and has no `update_weights`."""
    update_weights = getattr(generator, "update_weights", None)
    if update_weights is not None:
        with full_parameters(engine):
            update_weights(engine.module)


# --- the policy update: old log-probs, then mini-batches x epochs of optimizer steps

Rows = tuple[int, int]  # [start, stop) rows of the packed batch


@dataclass(frozen=True)
class _Plan:
    """Per mini-batch: its micro-batches `(rows, real)` and its loss denominator. Every rank
    runs as many micro-batches in each mini-batch (padding: its last one again at weight 0)."""

    minis: list[list[tuple[Rows, bool]]]
    denominators: list[float]


def _micro_slices(start: int, stop: int, micro: int) -> list[Rows]:
    return [(i, min(i + micro, stop)) for i in range(start, stop, micro)]


def _plan(packed: PackedBatch, weight: float, cfg: TrainConfig, n_ranks: int) -> _Plan:
    """Split the rank's rows into `ppo_mini_batches` contiguous, near-equal mini-batches
    (records are question-major: groups stay together when the sizes allow) of micro-batches.

    A mini-batch's denominator is the mean over ranks of their denominators of it (DeepSpeed
    then averages the ranks' gradients: the all-rank token mean; a zero-weight rank adds 0).
    A mini-batch empty on every rank gets no micro-batch and no optimizer step.
    """
    n, m = int(packed.advantages.numel()), cfg.ppo_mini_batches
    rows = [(n * j // m, n * (j + 1) // m) for j in range(m)]
    minis = [_micro_slices(a, b, cfg.micro_batch_size) for a, b in rows]
    real = [len(s) if weight > 0.0 else 0 for s in minis]
    counts = all_reduce([float(r) for r in real], "max")
    local = [aggregate_denominator(packed.loss_mask[a:b], cfg.loss_agg) if r else 0.0
             for (a, b), r in zip(rows, real, strict=True)]
    fallback = (0, min(cfg.micro_batch_size, n))
    plan = []
    for slices, n_real, count in zip(minis, real, counts, strict=True):
        pad = slices[-1] if slices else fallback
        plan.append([(s, True) for s in slices[:n_real]] + [(pad, False)] * (int(count) - n_real))
    return _Plan(plan, [d / n_ranks for d in all_reduce(local)])


def no_grad_logprobs(model: Any, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """Token log-probs of softmax(logits / temperature) `[N, L-1]`, without gradient."""
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    use_cache=False)
        return token_logprobs(out.logits.float() / temperature, batch.input_ids)


def _update(state: TrainerState, step: int, records: Sequence[RolloutRecord],
            advantages: torch.Tensor, *, weight: float = 1.0) -> dict[str, float] | None:
    """Old log-probs, then `ppo_epochs` passes over `ppo_mini_batches` mini-batches, one
    optimizer step each; None if a loss was non-finite on any rank (that mini-batch's
    gradients are discarded and the update stops there; earlier steps stand). `weight=0`
    makes every micro-batch a zero-weight one (a rank with nothing to learn).

    The first mini-batch to run takes its old log-probs from its own gradient pass (detached):
    no optimizer step has happened yet, so that pass *is* the sampling policy's and a separate
    no-grad pass over it would compute the same numbers again. With one mini-batch and one
    epoch (the default) there is no separate pass at all.
    """
    tcfg = state.config.train
    packed = pack_records(records, advantages, state.pad_id)
    plan = _plan(packed, weight, tcfg, state.n_ranks)
    orders = [_minibatch_order(state.config.run.seed, step, epoch, plan)
              for epoch in range(tcfg.ppo_epochs)]
    first = {micro for micro, _ in plan.minis[orders[0][0]]} if orders[0] else set()
    times: dict[str, float] = {}
    olds, refs, metrics = _sampling_logprobs(state, packed, plan, times, own_pass=first)
    steps = _ppo_steps(state, packed, plan, orders, olds, refs, metrics, times)
    if steps is None:
        return None
    return metrics | steps | times | {
        "update_tokens": float(packed.attention_mask.sum()) * tcfg.ppo_epochs}


def _minibatch_order(seed: int, step: int, epoch: int, plan: _Plan) -> list[int]:
    """The mini-batches of `epoch` with micro-batches, in their (seeded, shuffled) order."""
    order = list(range(len(plan.minis)))
    random.Random(rollout_seed(seed, step, epoch, 0, "minibatch_order")).shuffle(order)
    return [j for j in order if plan.minis[j]]


@contextmanager
def _timed(times: dict[str, float], key: str) -> Iterator[None]:
    """Add the block's wall seconds to `times[key]` (the step's time breakdown)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[key] = times.get(key, 0.0) + time.perf_counter() - t0


def _sampling_metrics(metrics: dict[str, float], logits: torch.Tensor, logps: torch.Tensor,
                      mb: PackedBatch, tokens: float) -> None:
    """Add the sampling policy's entropy and `logprob_mismatch` over `mb`'s policy tokens."""
    with torch.no_grad():
        m = mb.loss_mask
        metrics["entropy"] += float((token_entropy(logits) * m).sum()) / tokens
        metrics["logprob_mismatch"] += float(
            ((logps - mb.old_logprobs).abs() * m).sum()) / tokens


def _sampling_logprobs(state: TrainerState, packed: PackedBatch, plan: _Plan,
                       times: dict[str, float], *, own_pass: set[Rows]
                       ) -> tuple[dict[Rows, torch.Tensor], dict[Rows, torch.Tensor],
                                  dict[str, float]]:
    """Old log-probs (the engine's policy before any optimizer step on this batch: the one
    that sampled it) of every micro-batch but those in `own_pass` (they take theirs from
    their gradient pass), reference log-probs of every micro-batch, and the sampling
    policy's entropy and `logprob_mismatch` to the sampler's own log-probs (token means over
    policy tokens; `_ppo_steps` adds the `own_pass` micro-batches' share).

    The policy that sampled is softmax(logits / T): ratios, KL and entropy use the same
    distribution as the sampler (`generation.base.sample_next`).
    """
    temperature = state.config.rollout.temperature
    tokens = max(float(packed.loss_mask.sum()), 1.0)
    olds: dict[Rows, torch.Tensor] = {}
    refs: dict[Rows, torch.Tensor] = {}
    metrics = {"entropy": 0.0, "logprob_mismatch": 0.0}
    state.engine.eval()
    for micro, real in (m for mini in plan.minis for m in mini):  # as many forwards per rank
        mb = packed.slice(*micro)
        if micro not in own_pass and micro not in olds:
            with _timed(times, "time_old_logprobs_s"), torch.no_grad():
                logits = state.engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                      use_cache=False).logits.float() / temperature
                olds[micro] = token_logprobs(logits, mb.input_ids)
            if real:
                _sampling_metrics(metrics, logits, olds[micro], mb, tokens)
        if state.ref is not None and micro not in refs:
            with _timed(times, "time_ref_logprobs_s"):
                refs[micro] = no_grad_logprobs(state.ref, mb, temperature)
    return olds, refs, metrics


def _ppo_steps(state: TrainerState, packed: PackedBatch, plan: _Plan, orders: list[list[int]],
               olds: dict[Rows, torch.Tensor], refs: dict[Rows, torch.Tensor],
               sampling: dict[str, float], times: dict[str, float]) -> dict[str, float] | None:
    """`ppo_epochs` x the mini-batches (in `orders`, the same on every rank), gradients
    accumulated over each mini-batch's micro-batches, one optimizer step at its last. A
    micro-batch without old log-probs (the first mini-batch's) takes them from this pass.
    Loss metrics: means over the optimizer steps (by denominator share, so one step reports
    the batch loss); ratio and clip: token means over every pass (max for the deviation)."""
    tcfg, engine = state.config.train, state.engine
    temperature, epochs = state.config.rollout.temperature, tcfg.ppo_epochs
    tokens = max(float(packed.loss_mask.sum()), 1.0)
    total_denom = max(sum(plan.denominators), 1e-9)
    totals = dict.fromkeys(("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean",
                            "ratio_max_abs_dev", "optimizer_steps"), 0.0)
    engine.train()
    try:
        for order in orders:
            for j in order:
                for k, (micro, real) in enumerate(plan.minis[j]):
                    mb = packed.slice(*micro)
                    with _timed(times, "time_forward_s"):
                        logits = engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                        use_cache=False).logits.float() / temperature
                        logps = token_logprobs(logits, mb.input_ids)
                        if micro not in olds:
                            olds[micro] = logps.detach()
                            if real:
                                _sampling_metrics(sampling, logits.detach(), olds[micro], mb,
                                                  tokens)
                        out = grpo_loss(logps, olds[micro], refs.get(micro), mb.advantages,
                                        mb.loss_mask, clip_eps=tcfg.clip_eps,
                                        kl_coef=tcfg.kl_coef, agg=tcfg.loss_agg,
                                        denominator=max(plan.denominators[j], 1e-9))
                    if not all_reduce([float(bool(torch.isfinite(out.loss)))], "min")[0]:
                        engine.zero_grad()
                        return None
                    engine.set_gradient_accumulation_boundary(k == len(plan.minis[j]) - 1)
                    with _timed(times, "time_backward_s"):
                        engine.backward(out.loss if real else out.loss * 0.0,
                                        scale_wrt_gas=False)
                    with _timed(times, "time_optimizer_s"):
                        engine.step()
                    if not real:
                        continue
                    step_share = plan.denominators[j] / total_denom / epochs
                    share = float(mb.loss_mask.sum()) / tokens / epochs
                    totals["loss"] += float(out.loss.detach()) * step_share
                    totals["pg_loss"] += out.pg_loss * step_share
                    totals["kl"] += out.kl * share
                    totals["clip_fraction"] += out.clip_fraction * share
                    totals["ratio_mean"] += out.ratio_mean * share
                    totals["ratio_max_abs_dev"] = max(totals["ratio_max_abs_dev"],
                                                      out.ratio_max_abs_dev)
                totals["optimizer_steps"] += 1
    finally:
        engine.set_gradient_accumulation_boundary(None)
    return totals


# --- the curve


def plot_curve(history: Sequence[dict[str, Any]], path: Path) -> Path:
    """Reward / correctness / searches per step, and greedy dev EM by hop where measured."""
    steps = [h["step"] for h in history]
    fig = Figure(figsize=(14, 4))
    axes = fig.subplots(1, 3)
    axes[0].plot(steps, [h["reward_mean"] for h in history], label="reward mean")
    axes[0].plot(steps, [h["correct_rate"] for h in history], label="correct rate (sampled)")
    axes[0].set_xlabel("step")
    axes[0].legend()
    axes[0].set_title("training rollouts")
    axes[1].plot(steps, [h["searches_per_rollout"] for h in history], label="searches/rollout")
    axes[1].plot(steps, [h.get("kl", math.nan) for h in history], label="KL (k3)")
    axes[1].set_xlabel("step")
    axes[1].legend()
    evals = [h for h in history if "dev_em_all" in h]
    for key in sorted({k for h in evals for k in h if k.startswith("dev_em_")}):
        axes[2].plot([h["step"] for h in evals], [h.get(key, math.nan) for h in evals],
                     marker="o", label=key.removeprefix("dev_"))
    axes[2].set_xlabel("step")
    axes[2].set_title("greedy dev exact match")
    if evals:
        axes[2].legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


# --- library entry used by the Prefect task and the CLI


def train_policy_run(config: PipelineConfig, train_path: Path, corpus_path: Path,
                     searcher: Searcher, out_dir: Path, *, sft_train_path: Path | None = None,
                     dev_path: Path | None = None, sink: MetricsSink | None = None,
                     progress: bool = True) -> TrainResult:
    """Cold start (cached in `out_dir/sft`) then GRPO on `train_path` (curriculum order).

    `sft_train_path` is the split the demonstrations come from (default `train_path`); the
    pipeline passes the validated train split so the cold start the curriculum stage made is
    reused (same key). `dev_path` questions feed the greedy learning curve.
    """
    train = read_qa(train_path)
    if not train:
        raise TrainingError(f"{train_path}: no training questions (curriculum dropped all?)")
    passages = read_passages(corpus_path)
    sft_examples = read_qa(sft_train_path) if sft_train_path else train
    t0 = time.perf_counter()
    # Several ranks: rank 0 builds (or finds) the cold start, the others then reuse its key.
    init_distributed(resolve_device(config.run.device))
    if rank() == 0:
        cold_start(config, sft_examples, passages, searcher, out_dir / "sft", sink)
    barrier()
    sft_dir = cold_start(config, sft_examples, passages, searcher, out_dir / "sft", sink)
    sft_seconds = _sft_seconds(sft_dir, time.perf_counter() - t0)
    dev = read_qa(dev_path)[: config.train.eval_questions] if dev_path else []
    result = train_grpo(config, train, searcher, sft_dir, out_dir, sink=sink, eval_examples=dev,
                        progress=progress)
    result.sft_seconds = sft_seconds
    return result


def _sft_seconds(sft_dir: Path, measured: float) -> float:
    """Cold-start wall time: as recorded when it was built (it may have been built earlier by
    the curriculum stage and only reused now)."""
    stats = sft_dir / SFT_STATS_FILE
    if stats.is_file():
        return float(json.loads(stats.read_text()).get("seconds", measured))
    return measured
