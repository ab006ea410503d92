"""The label-noise audit: trajectories that did everything right yet scored zero.

A trajectory is a *suspect gold label* when all of these hold:

- well-formed (the reward's format check passed, the answer was the policy's own),
- it retrieved a supporting passage of the question (any `supporting_doc_ids` among the
  retrieved ids; questions without supporting ids cannot be audited and are skipped),
- it answered confidently (non-empty answer; geometric-mean probability of its final
  generated turn >= `min_confidence`),
- and it scored zero exact match.

These go to the data steward, not to the metrics: the audit never changes a score. Each
suspect says whether the policy's answer literally appears in a retrieved supporting passage
(the strongest sign the gold label, not the policy, is wrong) and is ranked by that, then by
confidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from searchrl.rl.records import RolloutRecord
from searchrl.text import is_subspan, normalize_answer
from searchrl.types import QAExample


def final_turn_confidence(record: RolloutRecord) -> float | None:
    """exp(mean log-prob) of the last contiguous run of policy-sampled tokens (the turn that
    wrote the answer); None when the record has no sampled tokens."""
    mask, logps = record.loss_mask, record.old_logprobs
    end = len(mask)
    while end > 0 and mask[end - 1] == 0:
        end -= 1
    start = end
    while start > 0 and mask[start - 1] == 1:
        start -= 1
    if end == start or len(logps) < end:
        return None
    span = logps[start:end]
    return math.exp(sum(span) / len(span))


def retrieved_ids(record: RolloutRecord) -> list[str]:
    return [doc for turn in record.retrieved_doc_ids for doc in turn]


def record_passages(record: RolloutRecord) -> dict[str, str]:
    """Doc id -> passage text as the rollout returned it (the record's own evidence)."""
    out: dict[str, str] = {}
    for ids, texts in zip(record.retrieved_doc_ids, record.passages, strict=False):
        out.update(zip(ids, texts, strict=False))
    return out


def answer_in_passages(answer: str, passages: Sequence[str]) -> bool:
    """Whether the normalised answer occurs as a whole-word span of a normalised passage."""
    needle = normalize_answer(answer)
    return any(is_subspan(needle, normalize_answer(p)) for p in passages)


def find_suspects(records: Sequence[RolloutRecord], examples: Mapping[str, QAExample], *,
                  min_confidence: float, passages: Mapping[str, str] | None = None,
                  system: str = "") -> list[dict[str, Any]]:
    """Suspect gold labels among `records` (rules in the module docstring), best first.

    `examples` maps example id -> its QA row; a record whose id is missing raises KeyError
    naming it, because auditing against the wrong eval set would be silently meaningless.
    `passages` (doc id -> text) backs the `answer_in_support` flag; without it the passage
    texts the rollout recorded (`record.passages`) are used.
    """
    suspects: list[dict[str, Any]] = []
    for rec in records:
        if rec.example_id not in examples:
            raise KeyError(f"audit: record for example {rec.example_id!r} has no QA row")
        ex = examples[rec.example_id]
        parts = rec.reward_parts
        if not ex.supporting_doc_ids or parts.get("format", 0.0) < 1.0:
            continue
        if parts.get("em", 0.0) > 0.0 or rec.correct or not (rec.answer or "").strip():
            continue
        got = retrieved_ids(rec)
        support_hit = [d for d in ex.supporting_doc_ids if d in got]
        if not support_hit:
            continue
        confidence = final_turn_confidence(rec)
        if confidence is None or confidence < min_confidence:
            continue
        texts = dict(passages) if passages is not None else record_passages(rec)
        support_text = [texts[d] for d in support_hit if d in texts]
        suspects.append({
            "example_id": rec.example_id, "system": system, "question": ex.question,
            "golden_answers": list(ex.golden_answers), "answer": rec.answer,
            "confidence": round(confidence, 4), "hops": ex.hops, "type": ex.type,
            "supporting_doc_ids": list(ex.supporting_doc_ids),
            "retrieved_support": support_hit, "queries": list(rec.queries),
            "answer_in_support": answer_in_passages(rec.answer or "", support_text),
            "f1": parts.get("f1", 0.0),
        })
    suspects.sort(key=lambda s: (not s["answer_in_support"], -s["confidence"],
                                 s["example_id"]))
    return suspects
