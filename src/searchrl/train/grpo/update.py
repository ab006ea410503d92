"""The policy update of one GRPO step: old log-probs of the sampling policy, then
`ppo_epochs` x `ppo_mini_batches` optimizer steps through the DeepSpeed engine. What is
computed and why (old log-probs, ratio, clip, KL, aggregation) is listed in `trainer.py`.

Several ranks: each mini-batch's loss is normalised by that mini-batch's token count over all
ranks, so the averaged gradient is the single-process one. Every rank runs the same number of
mini-batches and, in each, of micro-batches (a rank short of informative groups runs
zero-weight ones: ZeRO-2 reduces gradients inside every backward), and the ranks agree on
stopping at a non-finite loss.

    ppo_update
      _plan                 the rank's rows -> mini-batches of micro-batches, loss denominators
      _minibatch_order      each epoch's mini-batch order (seeded shuffle, the same on all ranks)
      _sampling_logprobs    no-grad old and reference log-probs, the sampling policy's metrics
      _ppo_steps            per mini-batch: a gradient pass per micro-batch (the last one adds
                            the PPO-ptx loss, `train/grpo/ptx.py`), one optimizer step

Also used by the loop: `sync_weights` (the new weights into a generator that keeps its own
copy), `timed` (the step's time breakdown).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from searchrl.config import TrainConfig
from searchrl.generation.base import Generator
from searchrl.rl.loss import LossOutput, aggregate_denominator, grpo_loss
from searchrl.rl.records import RolloutRecord
from searchrl.train.distributed.deepspeed_setup import all_reduce, full_parameters
from searchrl.train.grpo.ptx import ptx_loss
from searchrl.train.grpo.state import TrainerState
from searchrl.train.seeds import rollout_seed
from searchrl.train.tensors import PackedBatch, pack_records, token_entropy, token_logprobs

Rows = tuple[int, int]  # [start, stop) rows of the packed batch
_TOTALS = ("loss", "pg_loss", "kl", "clip_fraction", "ratio_mean", "ratio_max_abs_dev",
           "optimizer_steps", "ptx_nll")


@contextmanager
def timed(times: dict[str, float], key: str) -> Iterator[None]:
    """Add the block's wall seconds to `times[key]` (the step's time breakdown)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[key] = times.get(key, 0.0) + time.perf_counter() - t0


@dataclass(frozen=True)
class _Plan:
    """Per mini-batch: its micro-batches `(rows, real)` and its loss denominator. Every rank
    runs as many micro-batches in each mini-batch (padding: its last one again at weight 0)."""

    minis: list[list[tuple[Rows, bool]]]
    denominators: list[float]


@dataclass
class _Pass:
    """One update's batch and plan, and what its passes fill in: old and reference log-probs
    per micro-batch, the sampling policy's metrics, the time breakdown."""

    state: TrainerState
    step: int
    packed: PackedBatch
    plan: _Plan
    olds: dict[Rows, torch.Tensor] = field(default_factory=dict)
    refs: dict[Rows, torch.Tensor] = field(default_factory=dict)
    sampling: dict[str, float] = field(
        default_factory=lambda: {"entropy": 0.0, "logprob_mismatch": 0.0})
    times: dict[str, float] = field(default_factory=dict)

    @property
    def tokens(self) -> float:
        """The rank's policy tokens (at least 1): the denominator of its token means."""
        return max(float(self.packed.loss_mask.sum()), 1.0)

    @property
    def temperature(self) -> float:
        return self.state.config.rollout.temperature


def ppo_update(state: TrainerState, step: int, records: Sequence[RolloutRecord],
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
    batch = _Pass(state, step, packed, plan)
    _sampling_logprobs(batch, own_pass=first)
    steps = _ppo_steps(batch, orders)
    if steps is None:
        return None
    return batch.sampling | steps | batch.times | {
        "update_tokens": float(packed.attention_mask.sum()) * tcfg.ppo_epochs}


def sync_weights(generator: Generator, engine: Any) -> None:
    """Push the engine's parameters into a generator that keeps its own copy (vLLM); the hf
    generator shares the engine's module and has no `update_weights`."""
    update_weights = getattr(generator, "update_weights", None)
    if update_weights is not None:
        with full_parameters(engine):
            update_weights(engine.module)


# --- the plan: mini-batches of micro-batches, the same count on every rank


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


def _minibatch_order(seed: int, step: int, epoch: int, plan: _Plan) -> list[int]:
    """The mini-batches of `epoch` with micro-batches, in their (seeded, shuffled) order."""
    order = list(range(len(plan.minis)))
    random.Random(rollout_seed(seed, step, epoch, 0, "minibatch_order")).shuffle(order)
    return [j for j in order if plan.minis[j]]


# --- log-probs of the policy that sampled, and of the reference


def _logits(model: Any, mb: PackedBatch, temperature: float) -> torch.Tensor:
    """Logits / temperature `[N, L, V]` (float32): softmax of them is the distribution the
    rollout sampled from (`generation.base.sample_next`); ratios, KL and entropy all use it."""
    logits: torch.Tensor = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                 use_cache=False).logits
    return logits.float() / temperature


def no_grad_logprobs(model: Any, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """Token log-probs of softmax(logits / temperature) `[N, L-1]`, without gradient."""
    with torch.no_grad():
        return token_logprobs(_logits(model, batch, temperature), batch.input_ids)


def _sampling_metrics(metrics: dict[str, float], logits: torch.Tensor, logps: torch.Tensor,
                      mb: PackedBatch, tokens: float) -> None:
    """Add the sampling policy's entropy and `logprob_mismatch` over `mb`'s policy tokens."""
    with torch.no_grad():
        m = mb.loss_mask
        metrics["entropy"] += float((token_entropy(logits) * m).sum()) / tokens
        metrics["logprob_mismatch"] += float(
            ((logps - mb.old_logprobs).abs() * m).sum()) / tokens


def _sampling_logprobs(batch: _Pass, *, own_pass: set[Rows]) -> None:
    """Old log-probs (the engine's policy before any optimizer step on this batch: the one
    that sampled it) of every micro-batch but those in `own_pass` (they take theirs from
    their gradient pass), reference log-probs of every micro-batch, and the sampling
    policy's entropy and `logprob_mismatch` to the sampler's own log-probs (token means over
    policy tokens; `_ppo_steps` adds the `own_pass` micro-batches' share)."""
    state, plan = batch.state, batch.plan
    state.engine.eval()
    for micro, real in (m for mini in plan.minis for m in mini):  # as many forwards per rank
        mb = batch.packed.slice(*micro)
        if micro not in own_pass and micro not in batch.olds:
            with timed(batch.times, "time_old_logprobs_s"), torch.no_grad():
                logits = _logits(state.engine, mb, batch.temperature)
                batch.olds[micro] = token_logprobs(logits, mb.input_ids)
            if real:
                _sampling_metrics(batch.sampling, logits, batch.olds[micro], mb, batch.tokens)
        if state.ref is not None and micro not in batch.refs:
            with timed(batch.times, "time_ref_logprobs_s"):
                batch.refs[micro] = no_grad_logprobs(state.ref, mb, batch.temperature)


# --- the optimizer steps


def _ppo_steps(batch: _Pass, orders: list[list[int]]) -> dict[str, float] | None:
    """`ppo_epochs` x the mini-batches (in `orders`, the same on every rank), one optimizer
    step each. Loss metrics: means over the optimizer steps (by denominator share, so one step
    reports the batch loss); ratio and clip: token means over every pass (max for the
    deviation). None if a loss was non-finite on any rank."""
    engine, tcfg = batch.state.engine, batch.state.config.train
    totals = dict.fromkeys(_TOTALS, 0.0)
    # PPO-ptx rows are indexed by optimizer step: the same on every rank and after a resume.
    first_index = batch.step * tcfg.ppo_epochs * tcfg.ppo_mini_batches
    engine.train()
    try:
        for k, j in enumerate(j for order in orders for j in order):
            if not _mini_batch_step(batch, j, totals, first_index + k):
                engine.zero_grad()
                return None
            totals["optimizer_steps"] += 1
    finally:
        engine.set_gradient_accumulation_boundary(None)
    if batch.state.ptx is None:
        del totals["ptx_nll"]
    else:  # the replayed rows' token-mean NLL, averaged over the optimizer steps
        totals["ptx_nll"] /= max(totals["optimizer_steps"], 1.0)
    return totals


def _mini_batch_step(batch: _Pass, j: int, totals: dict[str, float], index: int) -> bool:
    """Mini-batch `j` (optimizer step `index` of the run): gradients accumulated over its
    micro-batches, plus the PPO-ptx loss in its last one, the optimizer step at its last;
    False as soon as a loss is non-finite on any rank (checked before its backward)."""
    state, micros = batch.state, batch.plan.minis[j]
    engine = state.engine
    for k, (micro, real) in enumerate(micros):
        mb = batch.packed.slice(*micro)
        with timed(batch.times, "time_forward_s"):
            out = _forward_loss(batch, j, micro, real, mb)
        loss = out.loss if real else out.loss * 0.0
        if k == len(micros) - 1 and state.ptx is not None:
            with timed(batch.times, "time_ptx_s"):
                ptx = ptx_loss(engine, state.ptx, index, state.rank, state.n_ranks,
                               state.pad_id)
            loss = loss + ptx
            totals["ptx_nll"] += all_reduce(
                [float(ptx.detach()) / state.n_ranks / state.ptx.coef])[0]
        if not all_reduce([float(bool(torch.isfinite(loss)))], "min")[0]:
            return False
        engine.set_gradient_accumulation_boundary(k == len(micros) - 1)
        with timed(batch.times, "time_backward_s"):
            engine.backward(loss, scale_wrt_gas=False)
        with timed(batch.times, "time_optimizer_s"):
            engine.step()
        if real:
            _add_loss_metrics(batch, j, mb, out, totals)
    return True


def _forward_loss(batch: _Pass, j: int, micro: Rows, real: bool, mb: PackedBatch
                  ) -> LossOutput:
    """The gradient pass of one micro-batch of mini-batch `j` and its loss; a micro-batch
    without old log-probs (the first mini-batch's) takes them from this pass (detached)."""
    tcfg = batch.state.config.train
    logits = _logits(batch.state.engine, mb, batch.temperature)
    logps = token_logprobs(logits, mb.input_ids)
    if micro not in batch.olds:
        batch.olds[micro] = logps.detach()
        if real:
            _sampling_metrics(batch.sampling, logits.detach(), batch.olds[micro], mb,
                              batch.tokens)
    return grpo_loss(logps, batch.olds[micro], batch.refs.get(micro), mb.advantages,
                     mb.loss_mask, clip_eps=tcfg.clip_eps, kl_coef=tcfg.kl_coef,
                     agg=tcfg.loss_agg, denominator=max(batch.plan.denominators[j], 1e-9))


def _add_loss_metrics(batch: _Pass, j: int, mb: PackedBatch, out: LossOutput,
                      totals: dict[str, float]) -> None:
    """Add a real micro-batch's loss terms to the update's totals: the loss by its
    mini-batch's share of the denominators, the token means by its share of the tokens."""
    epochs = batch.state.config.train.ppo_epochs
    step_share = batch.plan.denominators[j] / max(sum(batch.plan.denominators), 1e-9) / epochs
    share = float(mb.loss_mask.sum()) / batch.tokens / epochs
    totals["loss"] += float(out.loss.detach()) * step_share
    totals["pg_loss"] += out.pg_loss * step_share
    totals["kl"] += out.kl * share
    totals["clip_fraction"] += out.clip_fraction * share
    totals["ratio_mean"] += out.ratio_mean * share
    totals["ratio_max_abs_dev"] = max(totals["ratio_max_abs_dev"], out.ratio_max_abs_dev)
