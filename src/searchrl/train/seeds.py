"""Seeds of the trainer: every random draw of the loop is a pure function of where it happens,
not of global RNG state, so a resumed run replays it exactly. Changing a value changes every
result."""

from __future__ import annotations

import random
from typing import Literal

import numpy as np
import torch

SeedPurpose = Literal["rollout", "reestimate", "minibatch_order"]
_RUN_STRIDE = 1_000_003  # run seed -> a block of training-rollout seeds
_STEP_STRIDE = 31  # step -> room for 31 rollout calls (refills) per step
_RANK_STRIDE = 7_777_777  # rank -> its own seeds
_REESTIMATE_RUN_STRIDE = 7_919
_ORDER_SALT = 0x5EED


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
