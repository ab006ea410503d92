"""The GRPO objective as pure functions over padded token tensors.

Shapes: `N` sequences in a (micro-)batch (= some of the `B*G` rollouts), `T` response
tokens (right-padded). `mask[n, t]` is 1 iff token t of rollout n was sampled by the policy;
prompt, inserted `<information>` text and padding are 0, so they get no gradient and do not
count in any mean.

Objective (Shao et al. 2024, eq. 3, with the choices we made):
    ratio  = exp(logp - old_logp)
    pg     = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)       per token
    kl     = exp(ref - logp) - (ref - logp) - 1                        (k3, Schulman 2020)
    loss   = agg(pg + kl_coef * kl, mask)
`agg` is `token_mean` (every policy token in the whole batch weighs the same, as DAPO;
the paper's eq. 3 is `seq_mean_token_mean`: mean over tokens within a sequence, then over
sequences). Both accept an explicit denominator so micro-batches sum to the full-batch mean.

`old_logp` is the policy that sampled the rollouts, as the trainer's engine computes it
before its first optimizer step on them (`train/grpo/update.py`: the first mini-batch's from its
own gradient pass, detached; the others' from a no-grad pass): the ratio is 1 on the first
mini-batch and departs from it as later mini-batches and epochs update the policy; the clip
then bounds how far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

LossAgg = Literal["token_mean", "seq_mean_token_mean"]


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || ref) `[N, T]`; >= 0, unbiased under policy samples."""
    log_ratio = ref_logp - logp  # [N, T]
    return torch.exp(log_ratio) - log_ratio - 1.0


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor,
                      clip_eps: float) -> tuple[Tensor, Tensor]:
    """Per-token PPO-clip loss `[N, T]` (to minimise) and a 0/1 `[N, T]` "clip was active" map.

    `advantages` is per sequence `[N]` (GRPO's outcome advantage is shared by all its tokens).
    """
    adv = advantages.unsqueeze(1)  # [N, 1]
    ratio = torch.exp(logp - old_logp)  # [N, T]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    loss = -torch.minimum(unclipped, clipped)  # [N, T]
    active = (clipped < unclipped).float()  # the clipped branch is the one taken
    return loss, active


def masked_aggregate(values: Tensor, mask: Tensor, agg: LossAgg,
                     denominator: float | None = None) -> Tensor:
    """Reduce `[N, T]` values over the masked tokens to a scalar.

    token_mean: sum(values * mask) / denominator (default: mask.sum(), the token count).
    seq_mean_token_mean: sum_n mean_t(values[n] | mask[n]) / denominator (default: the number
    of sequences with at least one masked token). A sequence with no policy token adds 0.
    """
    mask = mask.to(values.dtype)
    if agg == "token_mean":
        denom = mask.sum() if denominator is None else torch.tensor(denominator)
        return (values * mask).sum() / torch.clamp(denom, min=1.0)
    if agg == "seq_mean_token_mean":
        per_seq_tokens = mask.sum(dim=1)  # [N]
        per_seq = (values * mask).sum(dim=1) / torch.clamp(per_seq_tokens, min=1.0)  # [N]
        denom = (per_seq_tokens > 0).sum() if denominator is None else torch.tensor(denominator)
        return per_seq.sum() / torch.clamp(denom.to(values.dtype), min=1.0)
    raise ValueError(f"unknown loss_agg {agg!r}; valid: token_mean, seq_mean_token_mean")


def aggregate_denominator(mask: Tensor, agg: LossAgg) -> float:
    """The full-batch denominator `masked_aggregate` uses, for splitting into micro-batches."""
    if agg == "token_mean":
        return float(mask.sum())
    return float((mask.sum(dim=1) > 0).sum())


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor  # scalar, differentiable
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float  # token mean of exp(logp - old_logp) over the mask
    ratio_max_abs_dev: float  # max |ratio - 1| over the mask


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor,
              mask: Tensor, *, clip_eps: float, kl_coef: float, agg: LossAgg = "token_mean",
              denominator: float | None = None) -> LossOutput:
    """Clipped surrogate + kl_coef * k3 KL, aggregated over policy tokens.

    All token tensors are `[N, T]`, `advantages` is `[N]`. With `kl_coef == 0` `ref_logp` may be
    None (no reference forward). Reported `kl`, `clip_fraction` and `ratio_mean` are plain
    token means over the mask (diagnostics, independent of `agg`).
    """
    pg, active = clipped_surrogate(logp, old_logp, advantages, clip_eps)  # [N, T]
    with torch.no_grad():
        ratio = torch.exp(logp.detach() - old_logp)  # [N, T]
        on = mask.bool()
        any_on = bool(on.any())
    per_token = pg
    kl_value = 0.0
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)  # [N, T]
        if kl_coef != 0.0:
            per_token = pg + kl_coef * kl
        kl_value = float(masked_aggregate(kl.detach(), mask, "token_mean"))
    loss = masked_aggregate(per_token, mask, agg, denominator)
    return LossOutput(
        loss=loss,
        pg_loss=float(masked_aggregate(pg.detach(), mask, agg, denominator)),
        kl=kl_value,
        clip_fraction=float(masked_aggregate(active, mask, "token_mean")),
        ratio_mean=float(masked_aggregate(ratio, mask, "token_mean")) if any_on else 1.0,
        ratio_max_abs_dev=float((ratio[on] - 1.0).abs().max()) if any_on else 0.0,
    )
