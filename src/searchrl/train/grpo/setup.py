"""How the GRPO trainer is built and resumed (`setup_trainer`): seeds, policy, KL reference,
DeepSpeed engine, generator, sampler, the PPO-ptx replay, and this run's newest verified
checkpoint with the best dev evaluation it recorded. The loop (`trainer.py`) starts from the
`TrainerState` (`state.py`) this returns.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Collection, Sequence
from pathlib import Path

from transformers import PreTrainedModel

from searchrl.config import PipelineConfig
from searchrl.curriculum.difficulty import RefillingSampler
from searchrl.generation.factory import load_policy_on_device, resolve_device
from searchrl.retrieval.base import Searcher
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train.cold_start.build import SFT_KEY_FILE
from searchrl.train.distributed import deepspeed_setup as ds
from searchrl.train.grpo import selection
from searchrl.train.grpo.checkpoint import load_checkpoint, prepare_checkpoint_dir, run_identity
from searchrl.train.grpo.errors import TrainingError
from searchrl.train.grpo.ptx import build_replay
from searchrl.train.grpo.state import Best, GeneratorFactory, RolloutFn, TrainerState
from searchrl.train.grpo.update import sync_weights
from searchrl.train.seeds import seed_everything
from searchrl.types import QAExample

log = logging.getLogger(__name__)


def setup_trainer(config: PipelineConfig, train_examples: Sequence[QAExample],
                  searcher: Searcher, init_dir: Path, out_dir: Path, *,
                  sink: MetricsSink | None, rollout_fn: RolloutFn,
                  generator_factory: GeneratorFactory, trainer_code: str,
                  exclude_names: Collection[str] = ()) -> TrainerState:
    """Seeds, policy, reference, engine, generator, sampler and the PPO-ptx replay (with
    `train.ptx_coef`); resumed from this run's newest verified checkpoint when `train.resume`
    (another run's are moved aside). `trainer_code`: the trainer's `code_fingerprint`, part
    of the run identity a checkpoint must match."""
    tcfg, rcfg = config.train, config.rollout
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.run.seed)
    device = resolve_device(config.run.device)
    model, tokenizer = load_policy_on_device(config, init_dir)
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
                           init_key_file=init_dir / SFT_KEY_FILE, code=trainer_code)
    ckpt = prepare_checkpoint_dir(state.checkpoints, run_key, resume=tcfg.resume)
    if ckpt is not None:
        saved = load_checkpoint(ckpt, engine)
        state.start_step, state.skipped = int(saved["step"]), int(saved["skipped"])
        state.earlier_seconds = float(saved.get("seconds", 0.0))  # absent: older checkpoints
        sampler.load_state_dict(saved["sampler"])
        state.history = json.loads(saved["history"])
        state.losses = [h["loss"] for h in state.history if "loss" in h]
        state.best = selection.resumed_best(state, Best.from_json(saved.get("best")))
        sync_weights(generator, engine)
        log.info("resumed from %s (step %d)", ckpt, state.start_step)
    if state.lead:
        selection.clear_bests(out_dir, resumed=ckpt is not None)
    state.sink.log_params({"train": tcfg.model_dump(mode="json"), "device": device,
                           "zero_stage": int(engine.zero_optimization_stage()),
                           "world_size": n_ranks, "resumed_from_step": state.start_step})
    return state


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A frozen copy of the start policy: the reference of the KL term."""
    ref = copy.deepcopy(model)
    ref.train(False)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
