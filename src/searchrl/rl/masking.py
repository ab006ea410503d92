"""The response sequence and its loss mask, built in lockstep, segment by segment.

A response is appended to in segments; each segment's ids go into `ids` and the same number
of mask entries go into `loss_mask` in the same call, so the two can never drift:

    sampled  -> mask 1, logprobs as sampled           (the policy generated these)
    info     -> mask 0                                (inserted <information> block)
    glue     -> mask 0                                (template text between turns)
    forced   -> mask 0, but part of the scored text   (the `<answer>` opener the template adds)

Nothing is ever re-tokenised: the ids are exactly what the generator was conditioned on, and
the mask is never inferred from pad ids or decoded text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from transformers import PreTrainedTokenizerBase

SegmentKind = Literal["sampled", "info", "glue", "forced"]
SCORED_KINDS: tuple[SegmentKind, ...] = ("sampled", "forced")


@dataclass(frozen=True)
class Segment:
    kind: SegmentKind
    start: int
    end: int  # exclusive, in response positions


@dataclass
class MaskedSequence:
    """A response under construction: ids, loss mask, sampling logprobs and segment spans."""

    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def append_sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Tokens the policy sampled (mask 1) with their sampling-time logprobs."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} logprobs")
        self._append("sampled", ids, 1, logprobs)

    def append_context(self, ids: Sequence[int], kind: SegmentKind) -> None:
        """Tokens the policy conditions on but did not sample (mask 0)."""
        if kind == "sampled":
            raise ValueError("use append_sampled for policy tokens (they need logprobs)")
        self._append(kind, ids, 0, [0.0] * len(ids))

    def _append(self, kind: SegmentKind, ids: Sequence[int], mask_value: int,
                logprobs: Sequence[float]) -> None:
        if not ids:
            return
        start = len(self.ids)
        self.ids.extend(int(i) for i in ids)
        self.loss_mask.extend([mask_value] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.segments.append(Segment(kind, start, len(self.ids)))

    def ids_of(self, kinds: Sequence[SegmentKind]) -> list[int]:
        """Concatenated ids of the segments of the given kinds, in order."""
        out: list[int] = []
        for seg in self.segments:
            if seg.kind in kinds:
                out.extend(self.ids[seg.start:seg.end])
        return out

    def scored_text(self, tokenizer: PreTrainedTokenizerBase) -> str:
        """The completion rewards see: sampled + forced segments, decoded; EOS/pad dropped."""
        return decode_policy_ids(tokenizer, self.ids_of(SCORED_KINDS))


def decode_policy_ids(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Decode keeping the protocol tags (they may be special tokens) but dropping EOS/pad."""
    drop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    kept = [i for i in ids if i not in drop]
    return str(tokenizer.decode(kept, skip_special_tokens=False))

