"""MaskedSequence keeps ids, mask and logprobs in lockstep."""

from __future__ import annotations

import pytest

from searchrl.rl.masking import MaskedSequence


def test_segments_build_ids_mask_and_logprobs_together() -> None:
    seq = MaskedSequence()
    seq.append_sampled([5, 6], [-0.1, -0.2])
    seq.append_context([7, 8, 9], "info")
    seq.append_context([], "glue")  # empty segments leave no trace
    seq.append_context([10], "forced")
    seq.append_sampled([11], [-0.3])
    assert seq.ids == [5, 6, 7, 8, 9, 10, 11]
    assert seq.loss_mask == [1, 1, 0, 0, 0, 0, 1]
    assert seq.logprobs == pytest.approx([-0.1, -0.2, 0, 0, 0, 0, -0.3])
    assert [(s.kind, s.start, s.end) for s in seq.segments] == [
        ("sampled", 0, 2), ("info", 2, 5), ("forced", 5, 6), ("sampled", 6, 7)]
    assert seq.ids_of(("sampled", "forced")) == [5, 6, 10, 11]


def test_misuse_is_rejected() -> None:
    seq = MaskedSequence()
    with pytest.raises(ValueError, match="logprobs"):
        seq.append_sampled([1, 2], [-0.1])
    with pytest.raises(ValueError, match="append_sampled"):
        seq.append_context([1], "sampled")

