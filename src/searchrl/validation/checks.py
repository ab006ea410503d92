"""Gold-label checks beyond the schema; each returns `Flag`s carrying the evidence for the row.

Every function is pure: rows in, flags out. Whether a flag quarantines its row or only asks a
steward to review it is decided by the caller (`validate.quarantine_checks`), not here.

Checks (the `check` names used in flags, counts, the report and the config):
- answer_variant: gold answers that are the same after normalisation, or one a whole-token
  span of the other ("1919" vs "the year 1919"), within a row or across rows asking the
  same question. EM scoring treats them inconsistently, so a steward should pick one form.
- duplicate_question: the same normalised question again in the same split (first kept).
- conflicting_gold: the same normalised question with incompatible gold answers (no shared
  answer, none a span of another): at least one label is wrong and we cannot tell which.
- leakage_exact / leakage_near: a train question equal (after normalisation) or near-equal
  (token-set Jaccard >= threshold) to a dev/test/extra-eval question; the train row is flagged
  so the evaluation sets stay fixed. Reported whatever else is wrong with the row (conflicting
  gold, a broken contract): a steward fixing that must still learn the question leaks.
- unanswerable: no gold answer (normalised) occurs in any corpus passage.
- not_in_supporting: the answer occurs in the corpus but in none of the named supporting
  passages.
- unknown_supporting_doc: a supporting passage id that no corpus contains.
- time_sensitive: the question asks about a moving target ("current", "latest", ...).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from searchrl.text import is_subspan, normalize_answer
from searchrl.types import Passage, QAExample
from searchrl.validation.answerability import AnswerScan, passage_text, snippet

TRAIN_SPLIT = "train"

CHECK_DESCRIPTIONS: dict[str, str] = {
    "parse": "line is not a JSON object (truncated, not UTF-8, not JSON): nothing to check",
    "contract": "fails the data contract (Great Expectations suite)",
    "duplicate_id": "id is not unique within its file",
    "schema": "fails the pydantic row schema",
    "answer_variant": "gold answers that differ only in form (case, articles, punctuation, "
                      "extra words)",
    "duplicate_question": "same question (normalised) again in the same split",
    "conflicting_gold": "same question (normalised) with conflicting gold answers",
    "leakage_exact": "train question equals an evaluation question (normalised)",
    "leakage_near": "train question nearly equals an evaluation question",
    "unanswerable": "gold answer occurs in no corpus passage",
    "not_in_supporting": "gold answer not in the named supporting passages",
    "unknown_supporting_doc": "a supporting passage id is not in any corpus",
    "time_sensitive": "time-sensitive question: the answer may change",
}


@dataclass(frozen=True)
class Flag:
    """One finding about one row: `reason` says what is wrong, `detail` shows the evidence
    in words, `evidence` holds it as data (for the quarantine file)."""

    split: str
    row: int
    id: str | None
    check: str
    reason: str
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckedRow:
    """A row that passed the schema, with where it came from (split, 1-based row number)."""

    split: str
    row: int
    example: QAExample

    def ref(self) -> dict[str, Any]:
        """How evidence points at this row."""
        return {"split": self.split, "row": self.row, "id": self.example.id,
                "question": self.example.question,
                "golden_answers": list(self.example.golden_answers)}

    def label(self) -> str:
        return f"{self.split} row {self.row} (id {self.example.id})"


def _flag(row: CheckedRow, check: str, reason: str, detail: str = "",
          **evidence: Any) -> Flag:
    return Flag(row.split, row.row, row.example.id, check, reason, detail, evidence)


def _norm_answers(row: CheckedRow) -> set[str]:
    return {normalize_answer(a) for a in row.example.golden_answers} - {""}


# --- answers within one row


def answer_variant_flags(rows: Iterable[CheckedRow]) -> list[Flag]:
    """Rows listing the same answer twice in different (or identical) surface forms."""
    flags: list[Flag] = []
    for row in rows:
        for a, b in combinations(row.example.golden_answers, 2):
            if normalize_answer(a) == normalize_answer(b):
                flags.append(_flag(row, "answer_variant",
                                   f"gold answers {a!r} and {b!r} are the same after "
                                   "normalisation",
                                   f"normalised: {normalize_answer(a)!r}", answers=[a, b]))
    return flags


# --- rows asking the same question


def _compatible(a: set[str], b: set[str]) -> bool:
    return bool(a & b) or any(is_subspan(x, y) or is_subspan(y, x) for x in a for y in b)


def question_group_flags(rows: Sequence[CheckedRow]) -> list[Flag]:
    """duplicate_question, conflicting_gold, answer_variant (across rows) and leakage_exact
    over rows grouped by normalised question."""
    groups: dict[str, list[CheckedRow]] = defaultdict(list)
    for row in rows:
        key = normalize_answer(row.example.question)
        if key:
            groups[key].append(row)
    flags: list[Flag] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        answers = [_norm_answers(r) for r in members]
        for (i, a), (j, b) in combinations(enumerate(members), 2):
            sa, sb = answers[i], answers[j]
            compatible = _compatible(sa, sb)
            if not compatible:
                for row, other in ((a, b), (b, a)):
                    flags.append(_flag(
                        row, "conflicting_gold",
                        f"same question as {other.label()} but gold "
                        f"{list(row.example.golden_answers)} vs "
                        f"{list(other.example.golden_answers)}",
                        f"other row: {other.example.question!r} -> "
                        f"{list(other.example.golden_answers)}",
                        other=other.ref()))
            elif a.example.golden_answers != b.example.golden_answers:
                for row, other in ((a, b), (b, a)):
                    flags.append(_flag(
                        row, "answer_variant",
                        f"same question as {other.label()}; gold answers differ only in form: "
                        f"{list(row.example.golden_answers)} vs "
                        f"{list(other.example.golden_answers)}",
                        f"other row: {other.example.question!r} -> "
                        f"{list(other.example.golden_answers)}",
                        other=other.ref()))
            if a.split == b.split:
                # Incompatible: conflicting_gold says more, and neither row is "kept".
                if compatible:
                    flags.append(_flag(b, "duplicate_question",
                                       f"duplicate of {a.label()} (first occurrence kept)",
                                       f"first: {a.example.question!r}", first=a.ref()))
            elif TRAIN_SPLIT in (a.split, b.split):
                train, other = (a, b) if a.split == TRAIN_SPLIT else (b, a)
                flags.append(_flag(train, "leakage_exact",
                                   f"train question also in {other.label()}",
                                   f"train: {train.example.question!r} | {other.split}: "
                                   f"{other.example.question!r}",
                                   eval_row=other.ref()))
    return _dedupe(flags)


def leakage_flags(rows: Sequence[CheckedRow], threshold: float) -> list[Flag]:
    """leakage_exact + leakage_near alone, for train rows the other checks cannot read (no
    usable gold answer, say): a train question that is an evaluation question is reported
    whatever else is wrong with the row."""
    exact = [f for f in question_group_flags(rows) if f.check == "leakage_exact"]
    return exact + near_duplicate_leakage_flags(rows, threshold)


def _dedupe(flags: list[Flag]) -> list[Flag]:
    """One duplicate_question flag per row (a third copy matches both earlier ones)."""
    seen: set[tuple[str, int, str]] = set()
    out: list[Flag] = []
    for f in flags:
        key = (f.split, f.row, f.check)
        if f.check == "duplicate_question" and key in seen:
            continue
        seen.add(key)
        out.append(f)
    return out


# --- near-duplicate leakage (AllPairs prefix filtering over token sets)


def _prefix_len(n: int, threshold: float) -> int:
    return n - math.ceil(threshold * n - 1e-9) + 1


def near_duplicate_leakage_flags(rows: Sequence[CheckedRow], threshold: float) -> list[Flag]:
    """Train rows whose token-set Jaccard with an evaluation row is >= threshold (and the
    normalised questions differ: equal ones are leakage_exact).

    Prefix filtering (Bayardo et al., AllPairs): with tokens in a global rarest-first order,
    two sets with Jaccard >= t share a token among their first n - ceil(t*n) + 1 tokens, so only
    pairs sharing a prefix token are compared: no all-pairs loop over train x eval.
    """
    if threshold <= 0:
        raise ValueError("near_duplicate_threshold must be > 0")
    train = [r for r in rows if r.split == TRAIN_SPLIT]
    evals = [r for r in rows if r.split != TRAIN_SPLIT]
    if not train or not evals:
        return []
    norm = {id(r): normalize_answer(r.example.question) for r in rows}
    sets = {id(r): set(norm[id(r)].split()) for r in rows}
    df: Counter[str] = Counter(t for r in rows for t in sets[id(r)])

    def ordered(r: CheckedRow) -> list[str]:
        return sorted(sets[id(r)], key=lambda t: (df[t], t))

    index: dict[str, list[CheckedRow]] = defaultdict(list)
    for r in evals:
        toks = ordered(r)
        for t in toks[: _prefix_len(len(toks), threshold)]:
            index[t].append(r)
    flags: list[Flag] = []
    for r in train:
        toks = ordered(r)
        if not toks:
            continue
        a = sets[id(r)]
        candidates: dict[int, CheckedRow] = {}
        for t in toks[: _prefix_len(len(toks), threshold)]:
            for e in index.get(t, ()):
                candidates[id(e)] = e
        for e in candidates.values():
            if norm[id(e)] == norm[id(r)]:
                continue
            b = sets[id(e)]
            jaccard = len(a & b) / len(a | b)
            if jaccard >= threshold:
                flags.append(_flag(r, "leakage_near",
                                   f"train question is a near-duplicate (Jaccard {jaccard:.2f}) "
                                   f"of {e.label()}",
                                   f"train: {r.example.question!r} | {e.split}: "
                                   f"{e.example.question!r}",
                                   eval_row=e.ref(), jaccard=round(jaccard, 4)))
    return flags


# --- time-sensitive questions


def time_sensitive_flags(rows: Iterable[CheckedRow], terms: Sequence[str]) -> list[Flag]:
    """Questions containing a time-sensitive term (whole words, case-insensitive)."""
    if not terms:
        return []
    pattern = re.compile(r"\b(" + "|".join(re.escape(t) for t in terms) + r")\b", re.IGNORECASE)
    flags: list[Flag] = []
    for row in rows:
        match = pattern.search(row.example.question)
        if match:
            flags.append(_flag(row, "time_sensitive",
                               f"question contains {match.group(0)!r}: the answer may change "
                               "over time",
                               f"question: {row.example.question!r}", term=match.group(0)))
    return flags


# --- answerability against the corpus


def answers_to_find(rows: Iterable[CheckedRow], non_extractive: Sequence[str]) -> set[str]:
    """The normalised gold answers the answerability checks look up in the corpus."""
    skip = {normalize_answer(a) for a in non_extractive}
    return set().union(*(_norm_answers(r) - skip for r in rows))


def supporting_ids(rows: Iterable[CheckedRow]) -> set[str]:
    return {d for r in rows for d in r.example.supporting_doc_ids}


@dataclass
class CorpusFacts:
    """What the answerability checks need from the corpora, gathered in one pass over them
    (`searchrl.validation.corpus` streams a wiki-scale corpus through `add`): each answer's
    first hit, the passages of the hits and the supporting passages (first by id), and how
    many passages were searched."""

    scan: AnswerScan
    support_ids: set[str]
    support: dict[str, Passage] = field(default_factory=dict)
    passages: int = 0

    @classmethod
    def of(cls, rows: Sequence[CheckedRow], corpora: Iterable[tuple[str, Sequence[Passage]]],
           non_extractive: Sequence[str]) -> CorpusFacts:
        facts = cls(AnswerScan(answers_to_find(rows, non_extractive)), supporting_ids(rows))
        for name, passages in corpora:
            facts.add(name, passages)
        return facts

    def add(self, corpus: str, passages: Sequence[Passage], *, scan: bool = True) -> None:
        """The next passages of `corpus`, in order (`scan=False`: counted only, for a corpus
        file already scanned under another name)."""
        self.passages += len(passages)
        if not scan:
            return
        self.scan.feed(corpus, passages)
        if self.support_ids:
            for p in passages:
                if p.id in self.support_ids and p.id not in self.support:
                    self.support[p.id] = p


def answerability_flags(rows: Sequence[CheckedRow], corpora: Mapping[str, Sequence[Passage]],
                        non_extractive: Sequence[str]) -> list[Flag]:
    """unanswerable / not_in_supporting / unknown_supporting_doc for every row.

    Answers whose normalised form is in `non_extractive` (yes/no) are not looked up: they are
    judgements, not spans. The corpus is scanned once (Aho-Corasick); only the few named
    supporting passages of each row are searched directly.
    """
    return answerability_flags_from(rows, CorpusFacts.of(rows, corpora.items(), non_extractive),
                                    non_extractive)


def answerability_flags_from(rows: Sequence[CheckedRow], facts: CorpusFacts,
                             non_extractive: Sequence[str]) -> list[Flag]:
    """`answerability_flags` from facts gathered over the corpora beforehand."""
    skip = {normalize_answer(a) for a in non_extractive}
    per_row = {(r.split, r.row): _norm_answers(r) - skip for r in rows}
    hits, support, by_id = facts.scan.hits, facts.support, facts.scan.passages
    support_norm = {pid: normalize_answer(passage_text(p)) for pid, p in support.items()}
    n_passages = facts.passages
    flags: list[Flag] = []
    for row in rows:
        answers = per_row[(row.split, row.row)]
        if not answers:
            continue
        found = {a: hits[a] for a in answers if a in hits}
        gold = list(row.example.golden_answers)
        if not found:
            flags.append(_flag(row, "unanswerable",
                               f"no gold answer {gold} occurs in any of {n_passages} corpus "
                               "passages (after normalisation)",
                               f"normalised answers searched: {sorted(answers)}",
                               normalised_answers=sorted(answers), passages_searched=n_passages))
            continue
        doc_ids = row.example.supporting_doc_ids
        missing = [d for d in doc_ids if d not in support]
        if missing:
            flags.append(_flag(row, "unknown_supporting_doc",
                               f"supporting passage ids {missing} are in no corpus",
                               f"supporting_doc_ids: {list(doc_ids)}", missing=missing))
        present = [d for d in doc_ids if d in support]
        if present and not any(is_subspan(a, support_norm[d]) for a in answers for d in present):
            answer, hit = next(iter(sorted(found.items())))
            where = by_id[hit.passage_id]
            shown = "; ".join(f"[{d}] {snippet(support[d].contents, '', 160)}" for d in present)
            flags.append(_flag(
                row, "not_in_supporting",
                f"gold answer {gold} is in none of the supporting passages {present}; "
                f"it occurs in passage {hit.passage_id} ({hit.corpus})",
                f"supporting: {shown} | found in [{hit.passage_id}] "
                f"{snippet(where.contents, answer)}",
                supporting=present, found_in=hit.passage_id))
    return flags
