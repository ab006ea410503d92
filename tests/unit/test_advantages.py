"""Group-relative advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from searchrl.rl.advantages import advantage_stats, group_advantages


def test_centred_and_std_normalised_by_group() -> None:
    # Group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3).
    # Group 1: rewards 0, 0, 0, 1 -> mean 0.25, unbiased std 0.5.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    adv = group_advantages(rewards, group_size=4, eps=0.0)
    s0 = math.sqrt(1 / 3)
    expected = [0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0, -0.5, -0.5, -0.5, 1.5]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_without_std_normalisation_only_centres() -> None:
    rewards = torch.tensor([2.0, 0.0, 1.0, 1.0, 1.0, 4.0])
    adv = group_advantages(rewards, group_size=3, std_normalize=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, -1.0, -1.0, 2.0])


def test_zero_variance_group_gets_zero_advantage() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    adv = group_advantages(rewards, group_size=3)
    assert adv[:3].abs().max().item() == 0.0
    assert adv[3:].abs().min().item() > 0.5
    stats = advantage_stats(rewards, group_size=3)
    assert stats.zero_variance_fraction == pytest.approx(0.5)
    assert stats.reward_mean == pytest.approx(4 / 6)


def test_groups_do_not_mix() -> None:
    # Changing group 1's rewards must not change group 0's advantages.
    a = group_advantages(torch.tensor([1.0, 0.0, 5.0, 5.0]), group_size=2)
    b = group_advantages(torch.tensor([1.0, 0.0, -3.0, 9.0]), group_size=2)
    assert a[:2].tolist() == b[:2].tolist()


def test_split_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), group_size=4)


def test_nonfinite_reward_propagates_for_the_trainer_to_catch() -> None:
    adv = group_advantages(torch.tensor([1.0, float("nan"), 0.0, 1.0]), group_size=2)
    assert not torch.isfinite(adv[:2]).all()
    assert torch.isfinite(adv[2:]).all()
