"""pack_records aligns each record's mask and sampling logprobs to its tokens."""

from __future__ import annotations

import pytest
import torch

from searchrl.rl.records import RolloutRecord
from searchrl.train.tensors import pack_records


def _record(prompt: list[int], response: list[int], mask: list[int]) -> RolloutRecord:
    return RolloutRecord(example_id="q", sample_index=0, prompt_ids=prompt,
                         response_ids=response, loss_mask=mask,
                         old_logprobs=[-1.0 * m for m in mask], text="", turns=1)


def test_pack_records_aligns_mask_to_token_positions() -> None:
    batch = pack_records([_record([1, 2], [3, 4, 5], [1, 0, 1]), _record([1], [6], [1])],
                         torch.tensor([0.5, -0.5]), pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [1, 6, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    # Target coordinates: position j scores input_ids[:, j + 1], so the masks shift left by one.
    assert batch.loss_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert torch.equal(batch.old_logprobs, -batch.loss_mask)
    assert batch.advantages.tolist() == [0.5, -0.5]
    short = batch.slice(1, 2)
    assert short.input_ids.tolist() == [[1, 6]] and short.loss_mask.tolist() == [[1]]


def test_pack_records_rejects_misaligned_records() -> None:
    with pytest.raises(ValueError, match="equal length"):
        pack_records([_record([1], [2, 3], [1])], torch.zeros(1), pad_id=0)
    with pytest.raises(ValueError, match="advantages"):
        pack_records([_record([1], [2], [1])], torch.zeros(2), pad_id=0)
