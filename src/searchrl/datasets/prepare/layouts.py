"""QA layouts: a raw benchmark row -> a QAExample-compatible dict (+ its own paragraphs), the
layout detected from a source's first row, and whole QA sources read with every skipped row
recorded (file, line, field, reason)."""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from pydantic import ValidationError

from searchrl.datasets.io import AnswerTypeError, DataError, _iter_raw_rows, answer_strings
from searchrl.datasets.prepare.spec import PREPARED, QASourceSpec
from searchrl.types import QAExample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedRow:
    part: str
    file: str
    line: int
    field: str
    reason: str


# --- QA layouts: raw row -> QAExample-compatible dict (+ its own paragraphs)


class _Skip(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass
class Converted:
    row: dict[str, Any]
    # (title, text) of the row's own paragraphs, and the supporting ones as indices into
    # them in chain order (None: not derivable), used only when the corpus is built from them.
    paragraphs: list[tuple[str, str]] = field(default_factory=list)
    support: list[int] | None = None


# Hop counts the benchmark fixes, for layouts whose rows do not say.
_HOPS_BY_SOURCE = {"nq": 1, "triviaqa": 1, "popqa": 1, "hotpotqa": 2, "2wiki": 2,
                   "2wikimultihopqa": 2, "bamboogle": 2}
_HOP_PREFIX = re.compile(r"^(\d+)hop")  # MuSiQue ids: "2hop__...", "3hop1__..."


def _answers(*fields: tuple[str, Any]) -> list[str]:
    """Distinct non-blank answer strings of (field name, value)s, order kept (value first,
    then aliases), read by validation's rule (`io.answer_strings`: numbers as text, SQuAD
    dicts as their texts); a value of any other type skips the row naming its field."""
    out: list[str] = []
    for name, value in fields:
        try:
            texts = answer_strings(value)
        except AnswerTypeError as exc:
            raise _Skip(name, str(exc)) from exc
        out += [t for t in dict.fromkeys(texts) if t.strip() and t not in out]
    return out


def _question(row: dict[str, Any]) -> str:
    q = row.get("question")
    if not isinstance(q, str) or not q.strip():
        raise _Skip("question", "missing or blank")
    return q


def _row_answers(row: dict[str, Any], *names: str) -> list[str]:
    return _answers(*((name, row.get(name)) for name in names))


def _need_answers(answers: list[str], field_name: str) -> list[str]:
    if not answers:
        raise _Skip(field_name, "no gold answer")
    return answers


def _row_id(row: dict[str, Any], keys: tuple[str, ...], fallback: str) -> str:
    for key in keys:
        value = row.get(key)
        if value is not None and str(value).strip():
            return str(value)
    return fallback


def _hops_for(data_source: str, row_id: str) -> int | None:
    m = _HOP_PREFIX.match(row_id)
    return int(m.group(1)) if m else _HOPS_BY_SOURCE.get(data_source.lower())


def _flat(row: dict[str, Any], name: str, fallback_id: str) -> Converted:
    """Search-R1 / FlashRAG: `question`, `golden_answers` (Search-R1's processed parquet keeps
    them in reward_model.ground_truth.target), optional `metadata`, `data_source`."""
    q = _question(row)
    gold = row.get("golden_answers")
    if gold is None:
        truth = (row.get("reward_model") or {}).get("ground_truth") or {}
        gold = truth.get("target") if isinstance(truth, dict) else None
    answers = _need_answers(_answers(("golden_answers", gold)), "golden_answers")
    raw_meta = row.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    data_source = str(row.get("data_source") or name)
    rid = _row_id(row, ("id", "_id"), fallback_id)
    hops = row.get("hops", meta.get("hops"))
    return Converted({
        "id": rid, "question": q, "golden_answers": answers, "data_source": data_source,
        "hops": hops if hops is not None else _hops_for(data_source, rid),
        "type": row.get("type", meta.get("type")),
        # Passed through here; kept only if every id resolves in the prepared corpus.
        "supporting_doc_ids": row.get("supporting_doc_ids") or [],
    })


def _nq_open(row: dict[str, Any], name: str, fallback_id: str) -> Converted:
    q = _question(row)
    answers = _need_answers(_row_answers(row, "answer", "answers"), "answer")
    return Converted({"id": _row_id(row, ("id",), fallback_id), "question": q,
                       "golden_answers": answers, "hops": 1, "data_source": name})


def _triviaqa(row: dict[str, Any], name: str, fallback_id: str) -> Converted:
    """`answer: {value, aliases}` (HF), or flattened `answer.value` / `answer_value` columns."""
    q = _question(row)
    ans = row.get("answer")
    if isinstance(ans, dict):
        answers = _answers(("answer.value", ans.get("value", ans.get("Value"))),
                           ("answer.aliases", ans.get("aliases", ans.get("Aliases"))))
    else:
        answers = _answers(("answer.value", row.get("answer.value", row.get("answer_value"))),
                           ("answer", ans),
                           ("answer.aliases", row.get("answer.aliases", row.get("answer_aliases"))))
    return Converted({"id": _row_id(row, ("question_id", "id"), fallback_id), "question": q,
                       "golden_answers": _need_answers(answers, "answer"), "hops": 1,
                       "data_source": name})


def _popqa(row: dict[str, Any], name: str, fallback_id: str) -> Converted:
    q = _question(row)
    raw = row.get("possible_answers")
    if isinstance(raw, str):  # PopQA stores the list as a JSON string
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _Skip("possible_answers", f"not a JSON list: {exc.msg}") from exc
    answers = _need_answers(_answers(("possible_answers", raw)), "possible_answers")
    return Converted({"id": _row_id(row, ("id",), fallback_id), "question": q,
                       "golden_answers": answers, "hops": 1, "data_source": name})


def _context(value: Any) -> list[tuple[str, str]]:
    """HotpotQA/2Wiki context as (title, text): raw `[[title, [sentences]]]` or the HF
    datasets form `{title: [...], sentences: [[...]]}`. Empty paragraphs are left out."""
    if isinstance(value, dict):
        pairs = list(zip(value.get("title") or [], value.get("sentences") or [], strict=False))
    else:
        pairs = [(p[0], p[1]) for p in value or [] if isinstance(p, list | tuple) and len(p) == 2]
    out = []
    for title, sentences in pairs:
        sents = [sentences] if isinstance(sentences, str) else list(sentences or [])
        text = " ".join(s.strip() for s in sents if isinstance(s, str) and s.strip())
        if text:
            out.append((str(title), text))
    return out


def _support_titles(value: Any) -> list[str]:
    if isinstance(value, dict):
        titles = list(value.get("title") or [])
    else:
        titles = [p[0] for p in value or [] if isinstance(p, list | tuple) and p]
    return list(dict.fromkeys(str(t) for t in titles))


def _wiki_multihop(row: dict[str, Any], name: str, fallback_id: str) -> Converted:
    """HotpotQA / 2WikiMultihopQA. Hops = distinct supporting titles, at least 2 (2Wiki's
    bridge_comparison needs 4 pages; every other type of both benchmarks 2)."""
    q = _question(row)
    answers = _need_answers(_row_answers(row, "answer", "answers"), "answer")
    paragraphs = _context(row.get("context"))
    titles = _support_titles(row.get("supporting_facts"))
    first_of: dict[str, int] = {}
    for i, (title, _) in enumerate(paragraphs):
        first_of.setdefault(title, i)
    # A chain with a missing link would mislead demos and recall: all or nothing.
    support = [first_of[t] for t in titles] if titles and all(t in first_of for t in titles) \
        else None
    return Converted({"id": _row_id(row, ("_id", "id"), fallback_id), "question": q,
                       "golden_answers": answers, "hops": max(2, len(titles)),
                       "type": row.get("type"), "data_source": name}, paragraphs, support)


def _musique(row: dict[str, Any], name: str, fallback_id: str) -> Converted:
    """MuSiQue: hops = len(question_decomposition); support follows the decomposition's
    paragraph_support_idx (chain order), else the `is_supporting` paragraphs."""
    q = _question(row)
    if row.get("answerable") is False:
        raise _Skip("answerable", "MuSiQue marks the question unanswerable")
    answers = _need_answers(_row_answers(row, "answer", "answer_aliases"), "answer")
    rid = _row_id(row, ("id",), fallback_id)
    decomposition = [d for d in row.get("question_decomposition") or [] if isinstance(d, dict)]
    m = _HOP_PREFIX.match(rid)
    hops = len(decomposition) or (int(m.group(1)) if m else None)
    paragraphs: list[tuple[str, str]] = []
    pos_of_idx: dict[Any, int] = {}
    supporting: list[int] = []
    for i, p in enumerate(row.get("paragraphs") or []):
        text = str(p.get("paragraph_text") or "").strip()
        if not text:
            continue
        pos_of_idx[p.get("idx", i)] = len(paragraphs)
        if p.get("is_supporting"):
            supporting.append(len(paragraphs))
        paragraphs.append((str(p.get("title") or ""), text))
    chain_idx = [d.get("paragraph_support_idx") for d in decomposition]
    if chain_idx and all(i in pos_of_idx for i in chain_idx):
        support: list[int] | None = list(dict.fromkeys(pos_of_idx[i] for i in chain_idx))
    else:
        support = supporting or None
    return Converted({"id": rid, "question": q, "golden_answers": answers, "hops": hops,
                       "type": f"{hops}hop" if hops else None, "data_source": name},
                      paragraphs, support)


_CONVERTERS: dict[str, Callable[[dict[str, Any], str, str], Converted]] = {
    "search_r1": _flat, "flashrag": _flat, "nq_open": _nq_open, "triviaqa": _triviaqa,
    "popqa": _popqa, "hotpotqa": _wiki_multihop, "2wiki": _wiki_multihop, "musique": _musique,
}


def detect_layout(row: dict[str, Any], source: str) -> str:
    """The QA layout a row's keys identify; DataError (naming the file) when none fits."""
    keys = set(row)
    if keys & {"question_decomposition", "paragraphs"}:
        return "musique"
    if "supporting_facts" in keys or ("context" in keys and "golden_answers" not in keys):
        # HotpotQA rows carry `level`; 2Wiki rows do not (and add `evidences`).
        return "hotpotqa" if "level" in keys else "2wiki"
    if "possible_answers" in keys:
        return "popqa"
    if isinstance(row.get("answer"), dict) or keys & {"answer.value", "answer_value"}:
        return "triviaqa"
    if keys & {"golden_answers", "reward_model"}:
        return "search_r1" if keys & {"data_source", "reward_model"} else "flashrag"
    if "question" in keys and keys & {"answer", "answers"}:
        return "nq_open"
    raise DataError(f"{source}: cannot detect the QA layout from the first row's keys "
                    f"{sorted(keys)}; set `layout:` to one of {sorted(_CONVERTERS)}")


# --- reading QA sources


@dataclass
class Part:
    name: str
    source: str
    layout: str
    rows_read: int
    items: list[Converted]
    skipped: list[SkippedRow]
    kept: int = 0


def read_rows(source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """io's reader, with a reader's own failure (pyarrow, datasets) reported as DataError."""
    it = _iter_raw_rows(source)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except DataError:
            raise
        except Exception as exc:  # pyarrow / datasets raise many unrelated types
            raise DataError(f"{source}: unreadable: {type(exc).__name__}: {exc}") from exc
        yield item


def read_part(name: str, spec: QASourceSpec) -> Part:
    rows = read_rows(spec.source)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{spec.source}: no rows")
    layout = spec.layout if spec.layout != "auto" else detect_layout(first[1], spec.source)
    convert = _CONVERTERS[layout]
    data_source = spec.data_source or name
    items: list[Converted] = []
    skipped: list[SkippedRow] = []
    read = 0
    for rowno, raw in chain([first], rows):
        read += 1
        try:
            item = convert(raw, data_source, f"{data_source}-{rowno}")
            QAExample.model_validate(item.row)
        except _Skip as skip:
            skipped.append(SkippedRow(name, spec.source, rowno, skip.field, skip.reason))
            continue
        except ValidationError as exc:
            first_err = exc.errors()[0]
            skipped.append(SkippedRow(name, spec.source, rowno,
                                      ".".join(map(str, first_err["loc"])) or "<row>",
                                      first_err["msg"]))
            continue
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # malformed nesting
            skipped.append(SkippedRow(name, spec.source, rowno, "<row>",
                                      f"malformed {layout} row: {exc}"))
            continue
        items.append(item)
    if not items:
        s = skipped[0]
        raise DataError(f"{spec.source}: no usable rows as layout {layout!r} ({read} read, all "
                        f"skipped; first: line {s.line} field {s.field!r}: {s.reason})")
    if skipped:
        log.warning("%s: %d of %d rows skipped (see %s)", spec.source, len(skipped), read,
                    PREPARED)
    return Part(name, spec.source, layout, read, items, skipped)


def sample_items(items: list[Converted], max_rows: int | None, seed: str) -> list[Converted]:
    """A seeded sample in source order; each part has its own seed, so adding one part does
    not change another's sample."""
    if max_rows is None or len(items) <= max_rows:
        return items
    picked = random.Random(seed).sample(range(len(items)), max_rows)
    return [items[i] for i in sorted(picked)]
