"""PPO-ptx (Ouyang et al. 2022, eq. 2): every GRPO optimizer step also descends
`train.ptx_coef` x the SFT loss on `train.ptx_rows` gold demonstrations of synthetic worlds
that neither the cold start nor this run's world contain.

Why: GRPO's outcome reward reaches a name only where a group's samples differ in it and the
difference decides the answer. Names BM25 forgives (a near-copy in a search query still
retrieves) and two-word founder names (rarely copied exactly) drift, and GRPO made the cold
start's copying of two-word names worse on fresh worlds (docs/results/question_types.md).
Replaying the cold start's own demonstrations pulled on nothing (it had memorised them); these
worlds are new to the policy, so their loss carries the copying skill itself. Gold chains
only: the cold start's deliberately imperfect and baseline-format demonstrations would teach
wrong answers here.

The rows of optimizer step `i` are a pure function of `i` (a fixed, seeded order, cycled), so
a resumed run replays the same rows; with several ranks each takes every n-th row of the step
and scales its loss so that DeepSpeed's gradient average is the single-process gradient.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from searchrl.config import PipelineConfig
from searchrl.train.cold_start.build import bm25_searcher, demo_kwargs, extra_world_seeds
from searchrl.train.cold_start.demos import world_demos
from searchrl.train.cold_start.sft import TokenizedDemo, collate_demos, masked_nll, tokenize_demo


@dataclass(frozen=True)
class PtxReplay:
    """The replayed demonstrations (tokenized, in their seeded order) and rows per step."""

    rows: list[TokenizedDemo]
    per_step: int
    coef: float


def build_replay(config: PipelineConfig, tokenizer: Any, exclude_names: Collection[str]
                 ) -> PtxReplay | None:
    """`train.ptx_demos` gold demonstrations from `train.ptx_worlds` worlds after the cold
    start's extra worlds (None when `train.ptx_coef` is 0). Questions touching a name in
    `exclude_names` (this run's corpus titles) are left out, as for the cold start."""
    tcfg = config.train
    if tcfg.ptx_coef == 0.0:
        return None
    seeds = extra_world_seeds(config, first=config.train.sft.extra_worlds,
                              count=tcfg.ptx_worlds)
    demos, _ = world_demos(config.data.synthetic, seeds, bm25_searcher(config),
                           exclude_names=exclude_names, n_demos=tcfg.ptx_demos,
                           **demo_kwargs(config, gold_only=True))
    if not demos:
        raise ValueError(f"train.ptx_coef={tcfg.ptx_coef}: the {tcfg.ptx_worlds} replay "
                         "worlds gave no demonstration (raise train.ptx_demos)")
    rows = [tokenize_demo(d, tokenizer, config.train.sft.max_len) for d in demos]
    random.Random(config.run.seed).shuffle(rows)
    return PtxReplay(rows, tcfg.ptx_rows, tcfg.ptx_coef)


def step_rows(replay: PtxReplay, index: int, rank: int, n_ranks: int
              ) -> tuple[list[TokenizedDemo], float]:
    """The rows of optimizer step `index` this rank trains on (every `n_ranks`-th of the
    step's), and the target-token count of the whole step's rows (all ranks)."""
    n = len(replay.rows)
    rows = [replay.rows[(index * replay.per_step + i) % n] for i in range(replay.per_step)]
    total = float(sum(sum(r.loss_mask[1:]) for r in rows))
    return rows[rank::n_ranks], total


def ptx_loss(model: Any, replay: PtxReplay, index: int, rank: int, n_ranks: int,
             pad_id: int) -> torch.Tensor:
    """`coef` x this rank's share of the step's token-mean NLL, scaled by `n_ranks` (the
    engine averages the ranks' gradients); summed over ranks / n_ranks it is the step's
    token-mean NLL x coef. A rank without rows of this step returns 0."""
    mine, total = step_rows(replay, index, rank, n_ranks)
    if not mine:
        return torch.zeros(())
    ids, attn, target = collate_demos(mine, pad_id)
    device = next(model.parameters()).device
    nll = masked_nll(model, ids.to(device), attn.to(device), target.to(device),
                     totals=(total / n_ranks, 0.0))
    return replay.coef * nll
