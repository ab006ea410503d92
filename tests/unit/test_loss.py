"""GRPO loss pieces against hand-computed values, and the mask's gradient guarantee."""

from __future__ import annotations

import math

import pytest
import torch

from searchrl.rl.loss import (
    aggregate_denominator,
    clipped_surrogate,
    grpo_loss,
    k3_kl,
    masked_aggregate,
)


def test_k3_kl_hand_values() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]])
    kl = k3_kl(logp, ref)
    # r = ref/p = 0.5 -> 0.5 - ln 0.5 - 1 = ln 2 - 0.5; equal probs -> 0.
    assert kl[0, 0].item() == pytest.approx(math.log(2) - 0.5, rel=1e-6)
    assert kl[0, 1].item() == pytest.approx(0.0, abs=1e-7)
    assert (k3_kl(torch.randn(3, 5), torch.randn(3, 5)) >= -1e-6).all()


def test_clipped_surrogate_hand_values() -> None:
    old = torch.zeros(2, 3)
    # ratios: 1.5, 1.0, 0.5 for both rows; row 0 A=+1, row 1 A=-1, eps=0.2.
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5], [1.5, 1.0, 0.5]]))
    loss, active = clipped_surrogate(logp, old, torch.tensor([1.0, -1.0]), clip_eps=0.2)
    # A>0: -min(1.5, 1.2) = -1.2 (clipped), -1.0, -min(0.5, 0.8) = -0.5 (not clipped)
    # A<0: -min(-1.5, -1.2) = 1.5 (not clipped), 1.0, -min(-0.5, -0.8) = 0.8 (clipped)
    assert loss[0].tolist() == pytest.approx([-1.2, -1.0, -0.5], rel=1e-6)
    assert loss[1].tolist() == pytest.approx([1.5, 1.0, 0.8], rel=1e-6)
    assert active.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]


def test_masked_aggregate_token_vs_sequence_mean() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # token mean: (1+2+3+10)/4 = 4; seq mean: (2 + 10)/2 = 6 (empty row excluded)
    assert masked_aggregate(values, mask, "token_mean").item() == pytest.approx(4.0)
    assert masked_aggregate(values, mask, "seq_mean_token_mean").item() == pytest.approx(6.0)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_sum_to_full_batch(agg: str) -> None:
    torch.manual_seed(0)
    values = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.4).long()
    mask[:, 0] = 1
    full = masked_aggregate(values, mask, agg)  # type: ignore[arg-type]
    denom = aggregate_denominator(mask, agg)  # type: ignore[arg-type]
    parts = sum(masked_aggregate(values[i:i + 2], mask[i:i + 2], agg, denom)  # type: ignore[arg-type]
                for i in range(0, 6, 2))
    assert float(parts) == pytest.approx(float(full), rel=1e-6)


def test_grpo_loss_hand_value_with_kl() -> None:
    # One sequence, two policy tokens + one inserted token, ratio 1 (on-policy).
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))
    mask = torch.tensor([[1, 1, 0]])
    out = grpo_loss(logp, logp.detach(), ref, torch.tensor([2.0]), mask, clip_eps=0.2,
                    kl_coef=0.1)
    kl0 = math.log(2) - 0.5
    # pg per token = -A = -2; kl mean over policy tokens = kl0 / 2
    assert out.loss.item() == pytest.approx(-2.0 + 0.1 * kl0 / 2, rel=1e-6)
    assert out.kl == pytest.approx(kl0 / 2, rel=1e-6)
    assert out.pg_loss == pytest.approx(-2.0)
    assert out.clip_fraction == 0.0


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_grpo_loss_off_policy_clipping_hand_values(agg: str) -> None:
    """Ratios away from 1 (a mini-batch after an optimizer step): the clip fires where the
    ratio left [1 - eps, 1 + eps] in the direction the advantage rewards, and only there."""
    # Row 0, A = +1: ratios 1.5 (above 1 + eps: clipped to 1.2), 0.7 (below 1 - eps, but a
    # positive advantage keeps the smaller unclipped 0.7), then an inserted token (mask 0).
    # Row 1, A = -2: ratios 0.5 (below 1 - eps: clipped to 0.8), 1.1 (inside), 1.3 (above
    # 1 + eps, but a negative advantage keeps the unclipped -2.6).
    ratios = torch.tensor([[1.5, 0.7, 3.0], [0.5, 1.1, 1.3]])
    old = torch.log(torch.tensor([[0.2, 0.4, 0.1], [0.6, 0.3, 0.5]]))
    logp = (old + torch.log(ratios)).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = grpo_loss(logp, old, None, torch.tensor([1.0, -2.0]), mask, clip_eps=0.2,
                    kl_coef=0.0, agg=agg)  # type: ignore[arg-type]
    # Per token pg = -min(r A, clip(r) A): row 0: -1.2, -0.7; row 1: 1.6, 2.2, 2.6.
    expected = {"token_mean": (-1.2 - 0.7 + 1.6 + 2.2 + 2.6) / 5,  # 0.9
                "seq_mean_token_mean": ((-1.2 - 0.7) / 2 + (1.6 + 2.2 + 2.6) / 3) / 2}[agg]
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert out.pg_loss == pytest.approx(expected, rel=1e-5)
    assert out.clip_fraction == pytest.approx(2 / 5)  # tokens (0, 0) and (1, 0)
    assert out.ratio_mean == pytest.approx((1.5 + 0.7 + 0.5 + 1.1 + 1.3) / 5, rel=1e-5)
    assert out.ratio_max_abs_dev == pytest.approx(0.5, rel=1e-5)
    out.loss.backward()
    assert logp.grad is not None
    # A clipped token is flat in logp: no gradient; every other policy token has one.
    assert logp.grad[0, 0] == 0 and logp.grad[1, 0] == 0 and logp.grad[0, 2] == 0
    assert (logp.grad[0, 1] != 0) and (logp.grad[1, 1:] != 0).all()


def test_grpo_loss_on_policy_ratio_is_exactly_one() -> None:
    logp = torch.log(torch.tensor([[0.3, 0.6, 0.1]]))
    out = grpo_loss(logp, logp.clone(), None, torch.tensor([1.5]), torch.tensor([[1, 1, 0]]),
                    clip_eps=0.2, kl_coef=0.0)
    assert out.ratio_mean == 1.0 and out.ratio_max_abs_dev == 0.0 and out.clip_fraction == 0.0


def test_inserted_tokens_get_zero_gradient() -> None:
    torch.manual_seed(0)
    logp = (torch.rand(3, 6) * -2).requires_grad_()
    old = logp.detach() + 0.05 * torch.randn(3, 6)
    ref = logp.detach() + 0.1 * torch.randn(3, 6)
    # Row layout: policy tokens (1), inserted <information> tokens and padding (0).
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]])
    out = grpo_loss(logp, old, ref, torch.tensor([1.0, -0.5, 2.0]), mask, clip_eps=0.2,
                    kl_coef=0.05)
    out.loss.backward()
    assert logp.grad is not None
    assert (logp.grad[mask == 0] == 0).all()
    assert (logp.grad[mask == 1] != 0).all()


def test_inserted_tokens_get_zero_gradient_through_a_model() -> None:
    """Through real logits: the positions that predict inserted tokens get exactly 0 gradient,
    the positions that predict policy tokens do not."""
    from searchrl.train.tensors import token_logprobs

    torch.manual_seed(0)
    vocab, dim = 11, 8
    emb = torch.nn.Embedding(vocab, dim)
    head = torch.nn.Linear(dim, vocab)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])  # prompt 1 2 | response 3 4 5 6
    # Targets are ids[:, 1:]: 2 (prompt), 3 (policy), 4 5 (inserted), 6 (policy).
    mask = torch.tensor([[0, 1, 0, 0, 1]])
    logits = head(emb(ids)).detach().requires_grad_()
    logp = token_logprobs(logits, ids)
    assert logp.shape == (1, 5)
    grpo_loss(logp, logp.detach(), logp.detach() - 0.3, torch.tensor([1.0]), mask,
              clip_eps=0.2, kl_coef=0.1).loss.backward()
    assert logits.grad is not None
    # logits at position p predict ids[p + 1]: inserted targets 4, 5 come from positions 2, 3.
    assert (logits.grad[0, [0, 2, 3, 5]] == 0).all()
    assert (logits.grad[0, 1] != 0).any() and (logits.grad[0, 4] != 0).any()
