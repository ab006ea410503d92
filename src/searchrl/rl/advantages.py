"""Group-relative advantages (GRPO, Shao et al. 2024, eq. 3 "outcome supervision").

Shapes: `B` prompts, `G` samples per prompt (group size). Rewards arrive question-major, as
`run_rollouts` returns records: the `G` samples of prompt 0, then the `G` of prompt 1, ...

Choices (listed so a reader can compare with the paper):
- the group baseline is the mean of the other samples *and* the sample itself (as the paper);
- with `std_normalize` the centred reward is divided by the group's unbiased std (torch's
  default, as TRL/verl do) plus `eps`; without it (Dr. GRPO, Liu et al. 2025) only centred;
- a group whose rewards are all equal gets advantage 0 for every sample: it carries no
  learning signal, and `zero_variance_fraction` reports how often that happens.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class AdvantageStats:
    zero_variance_fraction: float
    reward_mean: float
    reward_std: float


def group_advantages(rewards: Tensor, group_size: int, *, std_normalize: bool = True,
                     eps: float = 1e-6) -> Tensor:
    """Advantages `[B*G]` for question-major rewards `[B*G]`.

    Raises ValueError when the reward count is not a multiple of `group_size` (a group was
    split, so the baseline would mix prompts). Non-finite rewards propagate as non-finite
    advantages; the trainer checks for them and skips the step.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B*G], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [B, G]
    if std_normalize and group_size > 1:
        std = grouped.std(dim=1, keepdim=True)  # [B, 1], unbiased
        centred = centred / (std + eps)
    return centred.reshape(-1)  # [B*G]


def advantage_stats(rewards: Tensor, group_size: int, tol: float = 1e-8) -> AdvantageStats:
    """Reward mean/std over all samples and the fraction of groups with no reward spread."""
    grouped = rewards.float().view(-1, group_size)  # [B, G]
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values  # [B]
    return AdvantageStats(
        zero_variance_fraction=float((spread <= tol).float().mean()),
        reward_mean=float(rewards.float().mean()),
        reward_std=float(rewards.float().std()) if rewards.numel() > 1 else 0.0,
    )
