"""The GRPO trainer, top down: setup -> (rollout -> reward -> advantage -> update)* -> save.

One optimizer step per rollout batch: `questions_per_step` questions x `group_size` samples
are rolled out with the live policy, scored, turned into group-relative advantages, and used
for `ppo_epochs` passes of micro-batches through the DeepSpeed engine, which accumulates
gradients and steps once.

Weight sync: the `hf` generator holds the engine's module, so it always samples with the
weights just updated (in-process, nothing to copy); the `vllm` generator owns a copy, which
gets the engine's parameters after every optimizer step and after a resume
(`generator.update_weights`, gathered first under ZeRO-3).

Several ranks (`deepspeed --num_gpus N`, or N gloo processes on CPU): rank r samples its own
shard of the curriculum (every N-th question from r, order kept), rolls out
`questions_per_step / N` questions with its own seeds, and the loss is normalised by the
token count of all ranks, so the averaged gradient is the single-process one. Ranks run the
same number of micro-batches (a rank short of informative groups runs zero-weight ones:
ZeRO-2 reduces gradients inside every backward), agree on skipping a non-finite step, and
rank 0 alone writes metrics, evaluates, and saves the policy.

The GRPO choices made here, against DeepSeekMath (Shao et al. 2024) eq. 3:
- advantage: group mean baseline, divided by the group std (`train.std_normalize`; off ->
  Dr. GRPO's unnormalised advantage); see `rl/advantages.py`.
- KL: k3 estimator to a frozen copy of the starting policy, *in the loss* (as eq. 3, not as
  a reward penalty), weight `train.kl_coef` (0 skips the reference forward).
- aggregation: `train.loss_agg`, default `token_mean` over every policy token of the batch
  (DAPO) instead of eq. 3's mean of per-sequence means; see `rl/loss.py`.
- masking: only tokens the policy sampled carry loss; inserted `<information>` text and
  template glue are masked out (Search-R1's retrieved-token masking).
- temperature: log-probs (ratio, KL, entropy) are of softmax(logits / rollout.temperature),
  the distribution the rollout sampled from, not of the raw logits.
- old log-probs: recomputed by the training forward pass (`logp.detach()` on the first
  epoch, so the ratio starts at exactly 1), not taken from the sampler; the mean absolute
  difference to the sampler's log-probs is logged as `logprob_mismatch`.
- dynamic sampling (`curriculum.dynamic_filtering`): groups without reward variance are
  dropped and the batch is refilled from the curriculum sampler (DAPO), a bounded number of
  rounds.

Run as a script (`python -m searchrl.train.grpo --config ...`; on GPUs
`deepspeed --num_gpus N -m searchrl.train.grpo --config ...`) or call `train_policy_run`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from searchrl.config import PipelineConfig, load_config
from searchrl.curriculum.difficulty import (
    RefillingSampler,
    estimate_difficulty,
    fill_informative_groups,
)
from searchrl.data.io import atomic_write_text, read_passages, read_qa
from searchrl.generation.base import Generator
from searchrl.generation.factory import make_generator
from searchrl.models.tiny import init_policy, load_policy
from searchrl.retrieval.base import Searcher
from searchrl.rl.advantages import advantage_stats, group_advantages
from searchrl.rl.loss import aggregate_denominator, grpo_loss
from searchrl.rl.prompts import ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, build_prompt, format_passages
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch, run_rollouts
from searchrl.tracking import MetricsSink, NullSink
from searchrl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
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
# Per-step metrics averaged over ranks (each rank rolls out its own questions).
_RANK_MEAN_KEYS = ("correct_rate", "searches_per_rollout", "format_rate", "response_tokens",
                   "mask_coverage", "search_errors", "reward_mean", "reward_std",
                   "zero_variance_fraction", "groups_used")
SFT_KEY_FILE = "searchrl_sft.json"
SFT_STATS_FILE = "searchrl_sft_stats.json"
RUN_KEY_FILE = "run_key.json"
# Bumped when the demonstration text format changes, so an old cold start is not reused.
DEMO_FORMAT_VERSION = 2


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
    seconds: float
    sft_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(config: PipelineConfig) -> str:
    if config.run.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.run.device


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
    config sections and data (a key file is written last, so a half-built dir is never reused).
    """
    sink = sink or NullSink()
    cfg = config.train.sft
    key = {"model": config.to_dict()["model"], "sft": cfg.model_dump(mode="json"),
           "rollout_format": [config.rollout.top_k, config.rollout.info_token_budget],
           "seed": config.run.seed, "train_ids": [e.id for e in train_examples],
           "n_passages": len(passages), "demo_format": DEMO_FORMAT_VERSION}
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
    return [base + 7919 * (i + 1) for i in range(config.train.sft.extra_worlds)]


def _bm25_searcher(config: PipelineConfig) -> SearcherFactory:
    """An in-memory BM25 searcher per extra world (the index stage's BM25 settings)."""
    from searchrl.retrieval.bm25 import BM25Index
    from searchrl.retrieval.index_store import LocalSearcher

    icfg = config.index.model_copy(update={"retriever": "bm25"})

    def make(passages: Sequence[Passage]) -> Searcher:
        bm25 = BM25Index.build([p.contents for p in passages], k1=icfg.bm25_k1, b=icfg.bm25_b,
                               stopwords=icfg.bm25_stopwords)
        return LocalSearcher(passages, icfg, bm25=bm25)

    return make


# --- the trainer


def _rollout_metrics(batch: RolloutBatch, records: Sequence[RolloutRecord]) -> dict[str, float]:
    n = max(len(records), 1)
    response = sum(len(r.response_ids) for r in records)
    sampled = sum(sum(r.loss_mask) for r in records)
    s = batch.stats
    return {
        "correct_rate": sum(r.correct for r in records) / n,
        "searches_per_rollout": sum(len(r.queries) for r in records) / n,
        "format_rate": sum(r.reward_parts.get("format", 0.0) for r in records) / n,
        "response_tokens": response / n,
        "mask_coverage": sampled / max(response, 1),
        "search_errors": float(sum(r.search_errors for r in records)),
        "time_generation_s": s.get("time_generation_s", 0.0),
        "time_retrieval_s": s.get("time_retrieval_s", 0.0),
        "rollout_tokens": float(sampled),
    }


def _micro_slices(n: int, micro: int) -> list[tuple[int, int]]:
    return [(i, min(i + micro, n)) for i in range(0, n, micro)]


def _ref_logprobs(ref: PreTrainedModel | None, batch: PackedBatch, temperature: float
                  ) -> torch.Tensor | None:
    if ref is None:
        return None
    with torch.no_grad():
        out = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  use_cache=False)
        return token_logprobs(out.logits.float() / temperature, batch.input_ids)


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


def train_grpo(config: PipelineConfig, train_examples: Sequence[QAExample], searcher: Searcher,
               init_dir: Path, out_dir: Path, *, sink: MetricsSink | None = None,
               eval_examples: Sequence[QAExample] = (), rollout_fn: RolloutFn = run_rollouts,
               stop_after: int | None = None, progress: bool = True,
               generator_factory: GeneratorFactory = make_generator) -> TrainResult:
    """GRPO from the policy in `init_dir`; writes under `out_dir`:

        policy/          final policy (save_pretrained + tokenizer)
        checkpoints/     step_NNNNNN every `train.checkpoint_every` steps (+ at the end)
        metrics.jsonl    one JSON line per step (rewritten atomically each step)
        curve.png        the training curve

    Resumes from the newest verified checkpoint when `train.resume`. `stop_after` ends the
    loop after that many steps of this call (for tests and preemption drills); the policy is
    then not saved as final. Raises TrainingError after `train.max_nonfinite_steps` skipped
    steps. `generator_factory(rollout_cfg, model, tokenizer, device=, model_path=)` builds the
    rollout backend (default: `rollout.backend`).
    """
    sink = sink or NullSink()
    tcfg, rcfg = config.train, config.rollout
    group = rcfg.group_size
    device = resolve_device(config)
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root, metrics_path = out_dir / "checkpoints", out_dir / "metrics.jsonl"

    # --- setup
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
    engine = build_engine(model, tcfg, tcfg.questions_per_step * group, device)
    n_ranks, me = world_size(), rank()
    lead = me == 0
    if tcfg.questions_per_step % n_ranks or len(train_examples) < n_ranks:
        raise TrainingError(f"train.questions_per_step={tcfg.questions_per_step} and the "
                            f"{len(train_examples)} training questions must split over "
                            f"{n_ranks} ranks")
    questions_per_rank = tcfg.questions_per_step // n_ranks
    generator = generator_factory(rcfg, engine.module, tokenizer, device=device,
                                  model_path=init_dir)
    sampler = RefillingSampler(pool=list(train_examples)[me::n_ranks],
                               seed=config.run.seed + me)
    pad_id = int(tokenizer.pad_token_id)

    start_step, skipped, history = 0, 0, []
    # Checkpoints of another run (other config, start policy or questions) are never resumed:
    # they are moved aside (kept as evidence) and this run starts at step 0.
    run_key = _run_key(config, train_examples, init_dir, n_ranks)
    key_path = ckpt_root / RUN_KEY_FILE
    if (lead and tcfg.resume and any(ckpt_root.glob("step_*"))
            and (not key_path.is_file() or key_path.read_text() != run_key)):
        aside = ckpt_root.with_name(f"checkpoints.superseded-{time.strftime('%Y%m%dT%H%M%S')}")
        ckpt_root.rename(aside)
        log.warning("%s holds checkpoints of a different run (config, start policy or "
                    "questions changed); moved to %s, starting at step 0", ckpt_root, aside)
    barrier()
    if tcfg.resume and (ckpt := latest_checkpoint(ckpt_root)) is not None:
        state = load_checkpoint(ckpt, engine)
        start_step, skipped = int(state["step"]), int(state["skipped"])
        sampler.load_state_dict(state["sampler"])
        history = json.loads(state["history"])
        _sync_weights(generator, engine)
        log.info("resumed from %s (step %d)", ckpt, start_step)
    elif tcfg.resume and (bad := sorted(ckpt_root.glob("step_*"))):
        # Every finished checkpoint failed verification: keep the evidence, never silently
        # restart from step 0 over it.
        raise TrainingError(
            f"{ckpt_root}: no checkpoint passes verification ({', '.join(p.name for p in bad)});"
            " inspect or remove them, or set train.resume=false to start over")
    elif ckpt_root.exists() and lead:
        # A fresh run must never resume into (or be pruned together with) an old run.
        shutil.rmtree(ckpt_root)
    if lead and not key_path.is_file():
        ckpt_root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(key_path, run_key)
    barrier()
    if not lead:
        sink = NullSink()
    sink.log_params({"train": tcfg.model_dump(mode="json"), "device": device,
                     "zero_stage": int(engine.zero_optimization_stage()),
                     "world_size": n_ranks, "resumed_from_step": start_step})

    end_step = tcfg.steps if stop_after is None else min(tcfg.steps, start_step + stop_after)
    bar = tqdm(range(start_step, end_step), desc="grpo", disable=not (progress and lead),
               initial=start_step, total=tcfg.steps)
    losses: list[float] = [h["loss"] for h in history if "loss" in h]
    for step in bar:
        # --- rollout (G samples per question, with the live weights)
        t0 = time.perf_counter()
        calls = [0]
        batches: list[RolloutBatch] = []

        def roll(examples: Sequence[QAExample], _calls: list[int] = calls,
                 _batches: list[RolloutBatch] = batches, _step: int = step
                 ) -> list[RolloutRecord]:
            # Seeded by step and call, not by global RNG state: resume replays it exactly.
            b = rollout_fn(examples, generator, searcher, rcfg, config.reward,
                           group_size=group, seed=(config.run.seed * 1_000_003 + _step) * 31
                           + _calls[0] + 7_777_777 * me)
            _calls[0] += 1
            _batches.append(b)
            return b.records

        if config.curriculum.dynamic_filtering:
            groups, fill = fill_informative_groups(
                sampler, questions_per_rank, group, roll, config.curriculum.max_refill_rounds)
            records = [r for g in groups for r in g]
        else:
            records = roll(sampler.draw(questions_per_rank))
            fill = {}
        all_records = [r for b in batches for r in b.records]
        metrics = _rollout_metrics(batches[0], all_records)
        metrics["time_generation_s"] = sum(b.stats.get("time_generation_s", 0.0)
                                           for b in batches)
        metrics["time_retrieval_s"] = sum(b.stats.get("time_retrieval_s", 0.0) for b in batches)
        metrics["time_rollout_s"] = time.perf_counter() - t0
        all_rewards = torch.tensor([r.reward for r in all_records])
        stats = advantage_stats(all_rewards, group)
        metrics |= {"reward_mean": stats.reward_mean, "reward_std": stats.reward_std,
                    "zero_variance_fraction": stats.zero_variance_fraction,
                    "groups_used": len(records) / group}
        metrics |= {f"fill_{k}": v for k, v in fill.items() if k != "zero_variance_fraction"}

        if n_ranks > 1:
            means = all_reduce([metrics.get(k, 0.0) for k in _RANK_MEAN_KEYS])
            metrics |= {k: v / n_ranks for k, v in zip(_RANK_MEAN_KEYS, means, strict=True)}

        # --- advantages
        rewards = torch.tensor([r.reward for r in records], dtype=torch.float32)
        advantages = (group_advantages(rewards, group, std_normalize=tcfg.std_normalize)
                      if records else rewards)
        # Every rank takes the same branch: any rank with data -> all update (a rank without
        # runs zero-weight micro-batches on its first group); any non-finite -> all skip.
        anyone_has, all_finite = all_reduce([float(bool(records))], "max")[0], all_reduce(
            [float(bool(torch.isfinite(advantages).all()))], "min")[0]
        update = None
        if anyone_has and all_finite:
            if records:
                update = _update(engine, ref, records, advantages, pad_id, config)
            else:
                filler = all_records[:group]
                update = _update(engine, ref, filler, torch.zeros(len(filler)), pad_id, config,
                                 weight=0.0)
        if update is not None:
            _sync_weights(generator, engine)
        if update is None and not anyone_has:
            log.warning("step %d: no group with reward variance; nothing to learn", step)
            metrics["skipped"] = 1.0
        elif update is None:
            skipped += 1
            log.warning("step %d skipped: non-finite advantages or loss (%d so far)", step,
                        skipped)
            metrics["skipped"] = 1.0
            if skipped > tcfg.max_nonfinite_steps:
                raise TrainingError(
                    f"{skipped} steps skipped for non-finite values (limit "
                    f"train.max_nonfinite_steps={tcfg.max_nonfinite_steps}); lower train.lr "
                    "or check rewards")
        else:
            metrics |= update
            losses.append(update["loss"])

        # --- periodic difficulty re-estimate: retire questions the policy now always solves
        every = config.curriculum.reestimate_every
        if every and (step + 1) % every == 0 and step + 1 < end_step:
            pool = list(sampler.pool)
            estimate = rollout_fn(pool, generator, searcher, rcfg, config.reward,
                                  group_size=group,
                                  seed=config.run.seed * 7_919 + step + 7_777_777 * me)
            difficulties = estimate_difficulty(pool, estimate.records)
            solved = {d.example_id for d in difficulties if d.pass_rate == 1.0}
            retired = sampler.retire(solved)
            metrics |= {"reestimate_solved_share": len(solved) / len(difficulties),
                        "reestimate_retired": float(retired),
                        "pool_size": float(len(sampler.pool))}

        # --- eval (greedy, for the learning curve) and logging
        if lead and tcfg.eval_every and eval_examples and ((step + 1) % tcfg.eval_every == 0
                                                           or step + 1 == tcfg.steps):
            ev = greedy_eval(eval_examples, generator, searcher, config, rollout_fn)
            metrics |= {f"dev_{k}": v for k, v in ev.items()}
            metrics["dev_em"] = ev["em_all"]
        metrics["step_seconds"] = time.perf_counter() - t0
        metrics["lr"] = float(engine.get_lr()[0])
        sink.log_metrics(metrics, step=step + 1)
        history.append({"step": step + 1, **metrics})
        if lead:
            atomic_write_text(metrics_path, "".join(json.dumps(h) + "\n" for h in history))
        bar.set_postfix(reward=f"{metrics['reward_mean']:.2f}",
                        acc=f"{metrics['correct_rate']:.2f}",
                        srch=f"{metrics['searches_per_rollout']:.1f}")
        done = step + 1
        if (tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0) or done == end_step:
            save_checkpoint(ckpt_root, done, engine,
                            {"skipped": skipped, "sampler": sampler.state_dict(),
                             "history": json.dumps(history)},
                            keep=tcfg.keep_checkpoints)
    bar.close()

    # --- save
    steps_done = max([h["step"] for h in history], default=0)
    policy_dir = out_dir / "policy"
    curve: Path | None = None
    if steps_done >= tcfg.steps:
        with full_parameters(engine):
            if lead:
                save_policy(engine.module, tokenizer, policy_dir)
        if lead:
            curve = plot_curve(history, out_dir / "curve.png")
        barrier()
    return TrainResult(policy_dir=policy_dir, sft_dir=init_dir, metrics_path=metrics_path,
                       curve_path=curve, steps_done=steps_done, resumed_from=start_step,
                       skipped_steps=skipped, seconds=time.perf_counter() - started,
                       losses=losses, final_metrics=history[-1] if history else {})


# Train settings that may change between a run and its resume (how long, how often to save
# or evaluate); every other setting is part of the run's identity.
_OPERATIONAL_TRAIN_KEYS = {"steps", "checkpoint_every", "keep_checkpoints", "resume",
                           "eval_every", "eval_questions", "max_nonfinite_steps", "sft"}


def _run_key(config: PipelineConfig, train_examples: Sequence[QAExample], init_dir: Path,
             n_ranks: int) -> str:
    """What a checkpoint must match to be resumed: the settings that shape training, the
    start policy (its cold-start key, else its files' names and sizes) and the questions."""
    cfg = config.to_dict()
    key_file = init_dir / SFT_KEY_FILE
    init = (key_file.read_text() if key_file.is_file() else
            sorted((f.name, f.stat().st_size) for f in init_dir.iterdir() if f.is_file()))
    payload = {"model": cfg["model"], "rollout": cfg["rollout"], "reward": cfg["reward"],
               "curriculum": cfg["curriculum"], "seed": config.run.seed, "ranks": n_ranks,
               "train": {k: v for k, v in cfg["train"].items()
                         if k not in _OPERATIONAL_TRAIN_KEYS},
               "init": init, "questions": [e.id for e in train_examples]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _sync_weights(generator: Generator, engine: Any) -> None:
    """Push the engine's parameters into a generator that keeps its own copy (vLLM); the hf
    generator shares the engine's module and has no `update_weights`."""
    update_weights = getattr(generator, "update_weights", None)
    if update_weights is not None:
        with full_parameters(engine):
            update_weights(engine.module)


def _update(engine: Any, ref: PreTrainedModel | None, records: Sequence[RolloutRecord],
            advantages: torch.Tensor, pad_id: int, config: PipelineConfig, *,
            weight: float = 1.0) -> dict[str, float] | None:
    """`ppo_epochs` passes of micro-batches, one optimizer step; None if a loss was
    non-finite on any rank (gradients discarded, no optimizer step).

    The loss denominator is the mean over ranks of their denominators, so after DeepSpeed
    averages the ranks' gradients the result is the all-rank token mean. Every rank runs the
    largest micro-batch count of any rank (repeating its last micro-batch at weight 0).
    `weight=0` makes every micro-batch a zero-weight one (a rank with nothing to learn).
    """
    tcfg = config.train
    packed = pack_records(records, advantages, pad_id)
    n_ranks = world_size()
    denom = all_reduce([aggregate_denominator(packed.loss_mask, tcfg.loss_agg)])[0] / n_ranks
    slices = _micro_slices(len(records), tcfg.micro_batch_size)
    n_real = len(slices)
    n_micro = int(all_reduce([float(n_real)], "max")[0])
    slices += [slices[-1]] * (n_micro - n_real)
    t0 = time.perf_counter()
    # The policy that sampled is softmax(logits / T): ratios, KL and entropy use the same
    # distribution as the sampler's old log-probs (`generation.base.sample_next`).
    temperature = config.rollout.temperature
    refs = [_ref_logprobs(ref, packed.slice(a, b), temperature) for a, b in slices[:n_real]]
    t_logprobs = time.perf_counter() - t0
    olds: list[torch.Tensor] = []
    totals = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0,
              "logprob_mismatch": 0.0}
    tokens = float(packed.loss_mask.sum())
    t1 = time.perf_counter()
    engine.train()
    for epoch in range(tcfg.ppo_epochs):
        for k, (a, b) in enumerate(slices):
            mb = packed.slice(a, b)
            logits = engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                            use_cache=False).logits.float() / temperature
            logp = token_logprobs(logits, mb.input_ids)
            if epoch == 0:
                olds.append(logp.detach())
            out = grpo_loss(logp, olds[k], refs[min(k, n_real - 1)], mb.advantages, mb.loss_mask,
                            clip_eps=tcfg.clip_eps, kl_coef=tcfg.kl_coef, agg=tcfg.loss_agg,
                            denominator=max(denom, 1e-9))
            if not all_reduce([float(bool(torch.isfinite(out.loss)))], "min")[0]:
                engine.zero_grad()
                return None
            real = weight > 0.0 and k < n_real
            last = epoch == tcfg.ppo_epochs - 1 and k == len(slices) - 1
            engine.set_gradient_accumulation_boundary(last)
            engine.backward(out.loss if real else out.loss * 0.0, scale_wrt_gas=False)
            engine.step()
            if epoch == tcfg.ppo_epochs - 1 and real:
                share = float(mb.loss_mask.sum()) / max(tokens, 1.0)
                with torch.no_grad():
                    ent = token_entropy(logits.detach())
                    m = mb.loss_mask
                    totals["entropy"] += float((ent * m).sum()) / max(tokens, 1.0)
                    totals["logprob_mismatch"] += float(
                        ((logp.detach() - mb.old_logprobs).abs() * m).sum()) / max(tokens, 1.0)
                totals["loss"] += float(out.loss.detach())
                totals["pg_loss"] += out.pg_loss
                totals["kl"] += out.kl * share
                totals["clip_fraction"] += out.clip_fraction * share
    engine.set_gradient_accumulation_boundary(None)
    totals["time_logprobs_s"] = t_logprobs
    totals["time_update_s"] = time.perf_counter() - t1
    totals["update_tokens"] = float(packed.attention_mask.sum()) * tcfg.ppo_epochs
    return totals


# --- the curve


def plot_curve(history: Sequence[dict[str, Any]], path: Path) -> Path:
    """Reward / correctness / searches per step, and greedy dev EM by hop where measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


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
    init_distributed(resolve_device(config))
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


def main(argv: list[str] | None = None) -> int:
    """`python -m searchrl.train.grpo --config C --train T --corpus P --index I --out O`."""
    from searchrl.retrieval.index_store import load_searcher

    parser = argparse.ArgumentParser(prog="searchrl.train.grpo")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--dev", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # set by the deepspeed launcher
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    config = load_config(args.config, args.overrides)
    searcher = load_searcher(args.index, config.index)
    result = train_policy_run(config, args.train, args.corpus, searcher, args.out,
                              dev_path=args.dev)
    print(json.dumps({"policy_dir": str(result.policy_dir), "steps": result.steps_done,
                      "seconds": round(result.seconds, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
