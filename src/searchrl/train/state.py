"""The GRPO trainer's state: what the loop in `grpo.py` works on (`TrainerState`), how it is
built and resumed (`setup_trainer`: seeds, policy, KL reference, DeepSpeed engine, generator,
sampler, this run's newest verified checkpoint), and what a run returns (`TrainResult`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from searchrl.config import PipelineConfig
from searchrl.curriculum.difficulty import RefillingSampler
from searchrl.generation.base import Generator
from searchrl.generation.factory import resolve_device
from searchrl.models.tiny import load_policy
from searchrl.retrieval.base import Searcher
from searchrl.rl.rollout import RolloutBatch
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train import ds, selection
from searchrl.train.checkpoint import load_checkpoint, prepare_checkpoint_dir, run_identity
from searchrl.train.cold_start import SFT_KEY_FILE
from searchrl.train.errors import TrainingError
from searchrl.train.ptx import PtxReplay, build_replay
from searchrl.train.seeds import seed_everything
from searchrl.train.update import frozen_copy, sync_weights
from searchrl.types import QAExample

log = logging.getLogger(__name__)

RolloutFn = Callable[..., RolloutBatch]
GeneratorFactory = Callable[..., Generator]


# --- the trainer's state and result


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
    best: selection.Best | None = None
    best_policy_dir: Path | None = None
    last_value: float | None = None
    stopped_early: bool = False  # train.early_stop_patience ended the run before train.steps


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
    ptx: PtxReplay | None = None  # train.ptx_coef: the demonstrations each step replays
    best: selection.Best | None = None  # train.keep_best: the best dev evaluation so far (rank 0)
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


# --- setup


def setup_trainer(config: PipelineConfig, train_examples: Sequence[QAExample],
                  searcher: Searcher, init_dir: Path, out_dir: Path, *,
                  sink: MetricsSink | None, rollout_fn: RolloutFn,
                  generator_factory: GeneratorFactory,
                  exclude_names: Collection[str] = ()) -> TrainerState:
    """Seeds, policy, reference, engine, generator, sampler and the PPO-ptx replay (with
    `train.ptx_coef`); resumed from this run's newest verified checkpoint when `train.resume`
    (another run's are moved aside)."""
    tcfg, rcfg = config.train, config.rollout
    device = resolve_device(config.run.device)
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.run.seed)
    model, tokenizer = load_policy(init_dir, config.model.dtype)
    model.to(torch.device(device))  # type: ignore[arg-type]
    ref = frozen_copy(model) if tcfg.kl_coef != 0.0 else None
    if tcfg.zero_stage == 3 and rcfg.backend == "hf":
        raise TrainingError("train.zero_stage=3 partitions the weights the hf rollout backend "
                            "generates with (an all-gather per token); use rollout.backend=vllm "
                            "or train.zero_stage<=2")
    engine = ds.build_engine(model, tcfg, tcfg.questions_per_step * rcfg.group_size, device)
    n_ranks, me = ds.world_size(), ds.rank()
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
                         sink=sink if sink is not None and me == 0 else NullSink(),
                         ptx=build_replay(config, tokenizer, exclude_names))
    run_key = run_identity(config, train_examples, init_dir, n_ranks,
                           init_key_file=init_dir / SFT_KEY_FILE)
    ckpt = prepare_checkpoint_dir(state.checkpoints, run_key, resume=tcfg.resume)
    if ckpt is not None:
        saved = load_checkpoint(ckpt, engine)
        state.start_step, state.skipped = int(saved["step"]), int(saved["skipped"])
        state.earlier_seconds = float(saved.get("seconds", 0.0))  # absent: older checkpoints
        sampler.load_state_dict(saved["sampler"])
        state.history = json.loads(saved["history"])
        state.losses = [h["loss"] for h in state.history if "loss" in h]
        state.best = selection.resumed_best(state, selection.Best.from_json(saved.get("best")))
        sync_weights(generator, engine)
        log.info("resumed from %s (step %d)", ckpt, state.start_step)
    if state.lead:
        selection.clear_bests(out_dir, resumed=ckpt is not None)
    state.sink.log_params({"train": tcfg.model_dump(mode="json"), "device": device,
                           "zero_stage": int(engine.zero_optimization_stage()),
                           "world_size": n_ranks, "resumed_from_step": state.start_step})
    return state
