"""Rollout records -> padded tensors, and per-token log-probabilities / entropies.

Token tensors live in *target* coordinates: position j holds the log-probability of
`input_ids[:, j + 1]` under the logits at position j, so a sequence of length `L` gives
`L - 1` targets. Masks are carried over from the records (built in lockstep with the tokens
by the rollout loop), never re-derived from pad ids or decoded text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from searchrl.rl.records import RolloutRecord


@dataclass(frozen=True)
class PackedBatch:
    input_ids: Tensor  # [N, L] prompt + response, right-padded
    attention_mask: Tensor  # [N, L] 1 on real tokens
    loss_mask: Tensor  # [N, L-1] 1 where the target token was sampled by the policy
    old_logprobs: Tensor  # [N, L-1] sampling-time logprobs (0 off the mask)
    advantages: Tensor  # [N]

    def slice(self, start: int, stop: int) -> PackedBatch:
        """Rows [start, stop), trimmed to their longest real sequence (less padding compute)."""
        length = int(self.attention_mask[start:stop].sum(dim=1).max())
        return PackedBatch(
            input_ids=self.input_ids[start:stop, :length],
            attention_mask=self.attention_mask[start:stop, :length],
            loss_mask=self.loss_mask[start:stop, : length - 1],
            old_logprobs=self.old_logprobs[start:stop, : length - 1],
            advantages=self.advantages[start:stop],
        )


def pack_records(records: Sequence[RolloutRecord], advantages: Tensor, pad_id: int) -> PackedBatch:
    """Pad records (any mix of prompt lengths) into one batch; raises ValueError on a record
    whose mask or logprobs do not line up with its response tokens."""
    if len(records) != advantages.numel():
        raise ValueError(f"{len(records)} records but {advantages.numel()} advantages")
    for r in records:
        if not (len(r.response_ids) == len(r.loss_mask) == len(r.old_logprobs)):
            raise ValueError(
                f"rollout {r.example_id}#{r.sample_index}: response_ids ({len(r.response_ids)}), "
                f"loss_mask ({len(r.loss_mask)}) and old_logprobs ({len(r.old_logprobs)}) "
                "must have equal length")
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in records)
    n = len(records)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length - 1), dtype=torch.float32)
    old = torch.zeros((n, length - 1), dtype=torch.float32)
    for i, r in enumerate(records):
        p, t = len(r.prompt_ids), len(r.response_ids)
        ids[i, : p + t] = torch.tensor(r.prompt_ids + r.response_ids, dtype=torch.long)
        attn[i, : p + t] = 1
        # Response token k sits at input position p + k, i.e. target position p + k - 1.
        mask[i, p - 1 : p - 1 + t] = torch.tensor(r.loss_mask, dtype=torch.float32)
        old[i, p - 1 : p - 1 + t] = torch.tensor(r.old_logprobs, dtype=torch.float32)
    return PackedBatch(ids, attn, mask, old * mask, advantages.float())


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """log p(input_ids[:, j+1] | logits[:, j]) as `[N, L-1]` (float32 for a stable softmax)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [N, L-1, V]
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at each target position `[N, L-1]`."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def model_logits(model: torch.nn.Module, batch: PackedBatch) -> Tensor:
    """Forward a causal LM over the padded batch; logits `[N, L, V]`."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits: Tensor = out.logits
    return logits
