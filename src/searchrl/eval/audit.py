"""The label-noise audit: trajectories that did everything right yet scored zero.

A trajectory is a *suspect* when all of these hold:

- well-formed (the reward's format check passed, the answer was the policy's own),
- it retrieved a supporting passage of the question (any `supporting_doc_ids` among the
  retrieved ids; questions without supporting ids cannot be audited and are skipped),
- it answered confidently (non-empty answer; geometric-mean probability of its final
  generated turn >= `min_confidence`),
- and it scored zero exact match.

Most suspects are the policy's fault (a misspelt name it had read), so each is put in one tier
a steward can work through, first rule that holds (answers and passages compared after the one
normaliser, `searchrl.text.normalize_answer`):

    gold_likely_wrong    the answer is a whole-token span of a retrieved supporting passage, and
                         no gold answer is in any supporting passage (all of them were read)
    policy_error         the answer is a near-miss of a gold answer (difflib similarity >=
                         `near_miss_ratio`, or one a whole-token span of the other), or a gold
                         answer is in the retrieved support and the answer is not
    gold_possibly_wrong  the rest: both or neither in the support, a supporting passage unread,
                         or a judgement answer (yes/no) no passage spells out

Within a tier, suspects are ranked by `score` = confidence x agreement (the share of the
question's audited trajectories, over systems or samples, that were flagged), with the evidence
shown: the passage snippet holding the answer (and the gold, when a passage holds it).

These go to the data steward, not to the metrics: the audit never changes a score. Each row has
a stable `key` (split/id) and an empty `decision`; `python -m searchrl apply-audit` turns the
decisions a steward fills in into steward overrides (`searchrl.validation.overrides`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from searchrl.datasets.io import atomic_write_text
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


GOLD_LIKELY_WRONG = "gold_likely_wrong"
GOLD_POSSIBLY_WRONG = "gold_possibly_wrong"
POLICY_ERROR = "policy_error"
TIERS = (GOLD_LIKELY_WRONG, GOLD_POSSIBLY_WRONG, POLICY_ERROR)  # the order a steward works in
TIER_RULES = {
    GOLD_LIKELY_WRONG: "answer in a retrieved supporting passage, no gold in any (all read)",
    GOLD_POSSIBLY_WRONG: "neither rule decides (both or neither in the support, support unread)",
    POLICY_ERROR: "answer a near-miss of the gold, or the gold in the retrieved support and "
                  "the answer not",
}
# Judgement answers no passage spells out: their absence from the support proves nothing.
NON_EXTRACTIVE = frozenset({"yes", "no"})
NEAR_MISS_RATIO = 0.7
SNIPPET_CHARS = 80  # either side of the matched text


def similarity(a: str, b: str) -> float:
    """difflib ratio of the normalised strings (rapidfuzz is not a dependency)."""
    return SequenceMatcher(None, normalize_answer(a), normalize_answer(b)).ratio()


def snippet(text: str, needle: str, width: int = SNIPPET_CHARS) -> str:
    """`text` around the first case-insensitive occurrence of `needle` (else its start)."""
    at = text.lower().find(needle.strip().lower()) if needle.strip() else -1
    if at < 0:
        return text[:2 * width] + ("..." if len(text) > 2 * width else "")
    lo, hi = max(0, at - width), min(len(text), at + len(needle.strip()) + width)
    return ("..." if lo else "") + text[lo:hi] + ("..." if hi < len(text) else "")


def _first_holding(values: Sequence[str], texts: Mapping[str, str]) -> tuple[str, str] | None:
    """(doc id, value) of the first passage holding any of `values` as a whole-token span."""
    for doc, text in texts.items():
        for value in values:
            if answer_in_passages(value, [text]):
                return doc, value
    return None


def classify(answer: str, golds: Sequence[str], retrieved_support: Mapping[str, str],
             support: Mapping[str, str], all_support_read: bool, *,
             near_miss_ratio: float = NEAR_MISS_RATIO) -> tuple[str, dict[str, Any]]:
    """(tier, evidence) for one suspect answer; rules in the module docstring.

    `retrieved_support` is the supporting passages the policy read (doc id -> text),
    `support` every supporting passage whose text is known; `all_support_read` whether every
    supporting passage's text is known (else the gold's absence proves nothing).
    """
    norm_answer, norm_golds = normalize_answer(answer), [normalize_answer(g) for g in golds]
    judgement = norm_answer in NON_EXTRACTIVE or any(g in NON_EXTRACTIVE for g in norm_golds)
    answer_at = _first_holding([answer], retrieved_support)
    gold_at = _first_holding(list(golds), support)
    gold_read = _first_holding(list(golds), retrieved_support)
    sim = max((similarity(answer, g) for g in golds), default=0.0)
    contains = any(is_subspan(norm_answer, g) or is_subspan(g, norm_answer) for g in norm_golds)
    if answer_at and gold_at is None and all_support_read and not judgement:
        tier = GOLD_LIKELY_WRONG
    elif sim >= near_miss_ratio or contains or (gold_read and not answer_at):
        tier = POLICY_ERROR
    else:
        tier = GOLD_POSSIBLY_WRONG
    evidence: dict[str, Any] = {
        "answer_in_support": answer_at is not None,
        "gold_in_support": None if judgement or (gold_at is None and not all_support_read)
        else gold_at is not None,
        "similarity": round(sim, 4),
        "answer_doc": answer_at[0] if answer_at else None,
        "answer_snippet": snippet(retrieved_support[answer_at[0]], answer) if answer_at else "",
        "gold_doc": gold_at[0] if gold_at else None,
        "gold_snippet": snippet(support[gold_at[0]], gold_at[1]) if gold_at else "",
    }
    return tier, evidence


def find_suspects(records: Sequence[RolloutRecord], examples: Mapping[str, QAExample], *,
                  min_confidence: float, passages: Mapping[str, str] | None = None,
                  system: str = "", near_miss_ratio: float = NEAR_MISS_RATIO
                  ) -> list[dict[str, Any]]:
    """Suspect trajectories among `records` (rules and tiers in the module docstring), one row
    each, ranked by tier then confidence.

    `examples` maps example id -> its QA row; a record whose id is missing raises KeyError
    naming it, because auditing against the wrong eval set would be silently meaningless.
    `passages` (doc id -> text) adds passage texts to those the rollout recorded
    (`record.passages`), e.g. supporting passages it did not retrieve.
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
        texts = record_passages(rec) | dict(passages or {})
        support = {d: texts[d] for d in ex.supporting_doc_ids if d in texts}
        tier, evidence = classify(
            rec.answer or "", ex.golden_answers, {d: support[d] for d in support_hit
                                                  if d in support},
            support, len(support) == len(ex.supporting_doc_ids),
            near_miss_ratio=near_miss_ratio)
        suspects.append({
            "example_id": rec.example_id, "system": system, "sample_index": rec.sample_index,
            "question": ex.question,
            "golden_answers": list(ex.golden_answers), "answer": rec.answer,
            "confidence": round(confidence, 4), "hops": ex.hops, "type": ex.type,
            "supporting_doc_ids": list(ex.supporting_doc_ids),
            "retrieved_support": support_hit, "queries": list(rec.queries),
            "f1": parts.get("f1", 0.0), "tier": tier, **evidence,
        })
    suspects.sort(key=lambda s: (TIERS.index(s["tier"]), -s["confidence"], s["example_id"]))
    return suspects


def pool_suspects(suspects: Sequence[dict[str, Any]], audited: Mapping[str, int], *,
                  split: str, flagger: str = "system") -> list[dict[str, Any]]:
    """One row per question from per-trajectory suspects (several systems, or several samples
    of one policy), ranked within each tier by `score`, with the steward's fields.

    The row keeps the evidence of its most gold-incriminating trajectory (lowest tier index,
    then highest confidence). `audited[example_id]` is how many trajectories of the question
    were audited: agreement = flagged / audited. `flagger` names what told the trajectories
    apart in `flagged_by` (the row's "system" or "sample_index" field).
    """
    rows: dict[str, dict[str, Any]] = {}
    for s in sorted(suspects, key=lambda s: (TIERS.index(s["tier"]), -s["confidence"])):
        row = rows.get(s["example_id"])
        if row is None:
            row = rows[s["example_id"]] = {**s, "flagged_by": [], "confidence": 0.0}
        row["flagged_by"].append(str(s.get(flagger, "")))
        row["confidence"] = max(row["confidence"], s["confidence"])
    out = []
    for eid, row in rows.items():
        agreement = min(1.0, len(row["flagged_by"]) / max(audited.get(eid, 1), 1))
        out.append({"key": row_key(split, eid), "split": split, **row,
                    "agreement": round(agreement, 4),
                    "score": round(row["confidence"] * agreement, 4),
                    "decision": "", "corrected_answers": [], "reason": "", "steward": ""})
    out.sort(key=lambda r: (TIERS.index(r["tier"]), -r["score"], r["example_id"]))
    for rank, row in enumerate(out, start=1):
        row["rank"] = rank
    return out


def row_key(split: str, example_id: str) -> str:
    """The steward's handle on a suspect row: stable across runs for the same data row."""
    return f"{split}/{example_id}"


def tier_counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {t: sum(1 for r in rows if r.get("tier") == t) for t in TIERS}


def audit_rollouts(records: Sequence[RolloutRecord], examples: Mapping[str, QAExample], *,
                   min_confidence: float, split: str, near_miss_ratio: float = NEAR_MISS_RATIO,
                   passages: Mapping[str, str] | None = None, system: str = ""
                   ) -> list[dict[str, Any]]:
    """The audit over any rollouts (training samples, G per question, or greedy ones): one
    pooled, tiered row per question of `split`, agreement over that question's samples.

    Training itself only writes metrics; this is how zero-reward trajectories that reasoned
    well reach the steward (the evaluate stage runs it on the SFT policy's train rollouts).
    """
    audited: dict[str, int] = {}
    for rec in records:
        audited[rec.example_id] = audited.get(rec.example_id, 0) + 1
    found = find_suspects(records, examples, min_confidence=min_confidence, passages=passages,
                          system=system, near_miss_ratio=near_miss_ratio)
    return pool_suspects(found, audited, split=split, flagger="sample_index")


def new_gold_suspects(suspect_files: Sequence[Path], seen_path: Path) -> list[dict[str, Any]]:
    """`gold_likely_wrong` rows of `suspect_files` whose key no earlier call has returned;
    their keys are added to `seen_path` (a JSON list kept across runs), so a steward is told
    about each suspect once however many weekly runs flag it again."""
    seen: set[str] = set(json.loads(seen_path.read_text())) if seen_path.is_file() else set()
    new: dict[str, dict[str, Any]] = {}
    for path in suspect_files:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else {}
            key = str(row.get("key", ""))
            if row.get("tier") == GOLD_LIKELY_WRONG and key and key not in seen:
                new.setdefault(key, row)
    if new:
        seen_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(seen_path, json.dumps(sorted(seen | new.keys()), indent=0))
    return list(new.values())
