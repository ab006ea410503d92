"""Turn real Search-R1 / FlashRAG / raw-benchmark data into the pipeline's `source: files` inputs.

`prepare_data(spec, out_dir)` reads each QA source (layout given or detected from the first
row), maps it to QAExample rows (`hops`, `type`, `data_source`; `supporting_doc_ids` only
where they resolve in the corpus written next to them), mixes the train parts, streams the
corpus (wiki-18's 21M lines never sit in memory) and writes:

    train.jsonl, dev.jsonl (optional), eval_<name>.jsonl, corpus.jsonl  (each + manifest)
    data.yaml       the `data:` section that points the pipeline at these files
    prepared.json   counts, layouts, skipped rows (file/line/field); written LAST

A row without a question or answer is skipped and recorded, never dropped silently; an
unreadable source, or a corpus row without contents, raises DataError naming file and line.
prepared.json is removed first and written last, so a failed run never looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path
from typing import IO, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tqdm import tqdm

from searchrl.config import DataConfig, check_set_names
from searchrl.data.io import (
    AnswerTypeError,
    DataError,
    _iter_raw_rows,
    _normalise_passage,
    answer_strings,
    atomic_write_text,
    atomic_writer,
    manifest_path,
    write_jsonl,
)
from searchrl.paths import safe_filename
from searchrl.types import Passage, QAExample

log = logging.getLogger(__name__)

QALayout = Literal["auto", "search_r1", "flashrag", "nq_open", "triviaqa", "popqa", "hotpotqa",
                   "2wiki", "musique"]
# flashrag == search_r1: `{id, contents}` with an optional `"Title"\n` first line (wiki-18);
# title_text: DPR-style `{id, title, text}`, stored in the wiki-18 form.
CorpusLayout = Literal["auto", "flashrag", "search_r1", "title_text"]

PREPARED = "prepared.json"
DATA_YAML = "data.yaml"
CORPUS = "corpus.jsonl"


# --- the spec


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QASourceSpec(_Spec):
    """One QA source: a file/dir/`hf://` spec as `searchrl.data.io` reads, its layout and an
    optional row cap (a seeded sample, not the head, so the cap does not bias the mix)."""

    source: str = Field(min_length=1)
    layout: QALayout = "auto"
    max_rows: int | None = Field(None, ge=1)
    # Recorded per row; None -> the part / eval set name ("dev" for the dev set).
    data_source: str | None = None


class TrainPartSpec(QASourceSpec):
    name: str = Field(min_length=1)


class CorpusSpec(_Spec):
    source: str | None = None
    layout: CorpusLayout = "auto"
    # Build the corpus from the QA rows' own paragraphs (HotpotQA/2Wiki `context`, MuSiQue
    # `paragraphs`): the distractor setting, and the only way to get supporting_doc_ids.
    from_questions: bool = False

    @model_validator(mode="after")
    def _one_origin(self) -> CorpusSpec:
        if (self.source is None) == (not self.from_questions):
            raise ValueError("corpus needs exactly one of `source` or `from_questions: true`")
        return self


class PrepareSpec(_Spec):
    train: tuple[TrainPartSpec, ...] = Field(min_length=1)
    eval: dict[str, QASourceSpec] = Field(min_length=1)
    corpus: CorpusSpec
    dev: QASourceSpec | None = None
    # The eval set that becomes data.test_path; None -> the first. The rest become extra_eval.
    primary_eval: str | None = None
    seed: int = 0
    shuffle: bool = True

    @model_validator(mode="after")
    def _names(self) -> PrepareSpec:
        names = [p.name for p in self.train]
        if len(set(names)) != len(names):
            raise ValueError(f"train part names must be unique (got {names})")
        files = [safe_filename(n) for n in self.eval]
        if len(set(files)) != len(files):
            raise ValueError(f"eval set names must differ as file names (got {list(self.eval)})")
        if self.primary_eval is not None and self.primary_eval not in self.eval:
            raise ValueError(f"primary_eval {self.primary_eval!r} is not an eval set "
                             f"({list(self.eval)})")
        # The others become data.extra_eval names: checked here, before hours of work.
        check_set_names("eval (data.extra_eval)", [n for n in self.eval if n != self.primary])
        return self

    @property
    def primary(self) -> str:
        return self.primary_eval or next(iter(self.eval))


def load_spec(path: str | Path) -> PrepareSpec:
    """Read a spec YAML; DataError names the file and the offending key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataError(f"{path}: cannot read spec: {exc}") from exc
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return PrepareSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                             for e in exc.errors())
        raise DataError(f"{path}: invalid prepare spec: {problems}") from exc


# --- results


@dataclass(frozen=True)
class SkippedRow:
    part: str
    file: str
    line: int
    field: str
    reason: str


@dataclass(frozen=True)
class PreparedData:
    out_dir: Path
    train_path: Path
    dev_path: Path | None
    eval_paths: dict[str, Path]
    corpus_path: Path
    data_yaml: Path
    report_path: Path
    data_config: DataConfig
    # rows written: "train", "dev", "eval:<name>", "corpus"
    counts: dict[str, int]
    layouts: dict[str, str]
    skipped: tuple[SkippedRow, ...]
    duplicate_corpus_ids: int


# --- QA layouts: raw row -> QAExample-compatible dict (+ its own paragraphs)


class _Skip(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass
class _Converted:
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


def _flat(row: dict[str, Any], name: str, fallback_id: str) -> _Converted:
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
    return _Converted({
        "id": rid, "question": q, "golden_answers": answers, "data_source": data_source,
        "hops": hops if hops is not None else _hops_for(data_source, rid),
        "type": row.get("type", meta.get("type")),
        # Passed through here; kept only if every id resolves in the prepared corpus.
        "supporting_doc_ids": row.get("supporting_doc_ids") or [],
    })


def _nq_open(row: dict[str, Any], name: str, fallback_id: str) -> _Converted:
    q = _question(row)
    answers = _need_answers(_row_answers(row, "answer", "answers"), "answer")
    return _Converted({"id": _row_id(row, ("id",), fallback_id), "question": q,
                       "golden_answers": answers, "hops": 1, "data_source": name})


def _triviaqa(row: dict[str, Any], name: str, fallback_id: str) -> _Converted:
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
    return _Converted({"id": _row_id(row, ("question_id", "id"), fallback_id), "question": q,
                       "golden_answers": _need_answers(answers, "answer"), "hops": 1,
                       "data_source": name})


def _popqa(row: dict[str, Any], name: str, fallback_id: str) -> _Converted:
    q = _question(row)
    raw = row.get("possible_answers")
    if isinstance(raw, str):  # PopQA stores the list as a JSON string
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _Skip("possible_answers", f"not a JSON list: {exc.msg}") from exc
    answers = _need_answers(_answers(("possible_answers", raw)), "possible_answers")
    return _Converted({"id": _row_id(row, ("id",), fallback_id), "question": q,
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


def _wiki_multihop(row: dict[str, Any], name: str, fallback_id: str) -> _Converted:
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
    return _Converted({"id": _row_id(row, ("_id", "id"), fallback_id), "question": q,
                       "golden_answers": answers, "hops": max(2, len(titles)),
                       "type": row.get("type"), "data_source": name}, paragraphs, support)


def _musique(row: dict[str, Any], name: str, fallback_id: str) -> _Converted:
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
    return _Converted({"id": rid, "question": q, "golden_answers": answers, "hops": hops,
                       "type": f"{hops}hop" if hops else None, "data_source": name},
                      paragraphs, support)


_CONVERTERS: dict[str, Callable[[dict[str, Any], str, str], _Converted]] = {
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
class _Part:
    name: str
    source: str
    layout: str
    rows_read: int
    items: list[_Converted]
    skipped: list[SkippedRow]
    kept: int = 0


def _rows(source: str) -> Iterator[tuple[int, dict[str, Any]]]:
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


def _read_part(name: str, spec: QASourceSpec) -> _Part:
    rows = _rows(spec.source)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{spec.source}: no rows")
    layout = spec.layout if spec.layout != "auto" else detect_layout(first[1], spec.source)
    convert = _CONVERTERS[layout]
    data_source = spec.data_source or name
    items: list[_Converted] = []
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
    return _Part(name, spec.source, layout, read, items, skipped)


def _sample(items: list[_Converted], max_rows: int | None, seed: str) -> list[_Converted]:
    """A seeded sample in source order; each part has its own seed, so adding one part does
    not change another's sample."""
    if max_rows is None or len(items) <= max_rows:
        return items
    picked = random.Random(seed).sample(range(len(items)), max_rows)
    return [items[i] for i in sorted(picked)]


# --- the corpus, streamed


@dataclass
class _CorpusStats:
    rows: int
    sha256: str
    duplicates: int
    duplicate_examples: list[dict[str, Any]]
    found: set[str]  # the referenced ids that exist in the corpus


def _passage(raw: dict[str, Any], layout: str, where: str) -> Passage:
    if layout == "title_text" or (layout == "auto" and "contents" not in raw
                                  and raw.get("title") and "text" in raw):
        raw = {**raw, "contents": f'"{raw.get("title")}"\n{raw.get("text")}'}
    elif layout in ("flashrag", "search_r1") and "contents" not in raw:
        raise DataError(f"{where}: field 'contents': missing")
    try:
        return Passage.model_validate(_normalise_passage(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        field_name = ".".join(map(str, first["loc"])) or "<row>"
        raise DataError(f"{where}: field {field_name!r}: {first['msg']}") from exc


def _stream_source_rows(source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Corpus rows one at a time: io's JSONL/datasets readers already stream; parquet is read
    batch by batch here since io's reader loads the whole table."""
    if source.lower().endswith(".parquet") and Path(source).is_file():
        import pyarrow.parquet as pq

        try:
            rowno = 0
            for batch in pq.ParquetFile(source).iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    rowno += 1
                    yield rowno, row
        except Exception as exc:  # pyarrow's errors have no common base worth naming
            raise DataError(f"{source}: unreadable: {type(exc).__name__}: {exc}") from exc
        return
    yield from _rows(source)


_BUCKETS = 128


def _duplicates(bucket_dir: Path) -> tuple[int, list[dict[str, Any]]]:
    """Duplicate ids from the per-bucket (id, line) files: memory is one bucket's ids, about
    1/_BUCKETS of the corpus's, never the whole id set."""
    count = 0
    examples: list[dict[str, Any]] = []
    for bucket in sorted(bucket_dir.iterdir()):
        lines_of: dict[str, list[int]] = {}
        with bucket.open(encoding="utf-8") as fh:
            for entry in fh:
                doc_id, line = json.loads(entry)
                lines_of.setdefault(doc_id, []).append(line)
        for doc_id, lines in lines_of.items():
            if len(lines) > 1:
                count += 1
                if len(examples) < 100:
                    examples.append({"id": doc_id, "lines": lines[:10]})
    return count, examples


def _write_corpus(rows: Iterable[tuple[int, dict[str, Any]]], source: str, layout: str,
                  out_path: Path, referenced: set[str], progress: bool) -> _CorpusStats:
    """Stream rows to out_path (`atomic_writer`) and its manifest, hashing as it writes.

    The old manifest goes first, so an interrupted rewrite leaves nothing marked complete.
    """
    manifest_path(out_path).unlink(missing_ok=True)
    digest = hashlib.sha256()
    found: set[str] = set()
    count = 0
    # The id buckets are closed (stack) before their directory goes.
    with atomic_writer(out_path) as out, tempfile.TemporaryDirectory(
            dir=out_path.parent, prefix=".corpus-ids.") as bdir, ExitStack() as stack:
        buckets: list[IO[str]] = [
            stack.enter_context((Path(bdir) / f"{i:03d}").open("w", encoding="utf-8"))
            for i in range(_BUCKETS)]
        bar = stack.enter_context(tqdm(rows, desc=f"corpus {Path(source).name}",
                                       unit=" rows", disable=not progress, mininterval=1.0))
        for rowno, raw in bar:
            passage = _passage(raw, layout, f"{source}:{rowno}")
            data = (json.dumps(passage.model_dump(mode="json"), ensure_ascii=False,
                               sort_keys=True) + "\n").encode("utf-8")
            out.write(data)
            digest.update(data)
            count += 1
            key = passage.id.encode("utf-8")
            buckets[zlib.crc32(key) % _BUCKETS].write(json.dumps([passage.id, rowno]) + "\n")
            if passage.id in referenced:
                found.add(passage.id)
        if count == 0:
            raise DataError(f"{source}: corpus has no rows")
        for b in buckets:
            b.flush()
        dup_count, dup_examples = _duplicates(Path(bdir))
    sha = digest.hexdigest()
    atomic_write_text(manifest_path(out_path),
                      json.dumps({"file": out_path.name, "rows": count, "sha256": sha}, indent=2))
    if dup_count:
        log.warning("%s: %d duplicate passage ids (see %s)", source, dup_count, PREPARED)
    return _CorpusStats(count, sha, dup_count, dup_examples, found)


class _ParagraphCorpus:
    """QA rows' own paragraphs as a corpus; identical (title, text) pairs share one id."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str], str] = {}
        self.rows: list[dict[str, Any]] = []

    def add(self, title: str, text: str) -> str:
        key = (title, text)
        if key not in self.ids:
            self.ids[key] = f"p{len(self.rows)}"
            self.rows.append({"id": self.ids[key], "title": title or None,
                              "contents": f'"{title}"\n{text}' if title else text})
        return self.ids[key]


# --- the whole preparation


def _namespace_ids(items: list[_Converted]) -> None:
    """Sources reuse ids (FlashRAG's NQ and HotpotQA both have "train_0"): when ids collide
    across data sources in one split, every id becomes `<data_source>:<id>` (`source_id`
    keeps the original). Duplicates within one source are left for validation to flag."""
    sources_of: dict[str, set[str]] = {}
    for item in items:
        sources_of.setdefault(item.row["id"], set()).add(item.row["data_source"])
    if all(len(s) == 1 for s in sources_of.values()):
        return
    for item in items:
        item.row["source_id"] = item.row["id"]
        item.row["id"] = f"{item.row['data_source']}:{item.row['id']}"


def _qa_out(item: _Converted) -> dict[str, Any]:
    row = QAExample.model_validate(item.row).model_dump(mode="json")
    row["data_source"] = item.row["data_source"]
    if "source_id" in item.row:
        row["source_id"] = item.row["source_id"]
    return row


def _part_report(part: _Part) -> dict[str, Any]:
    return {"source": part.source, "layout": part.layout, "rows_read": part.rows_read,
            "skipped": len(part.skipped), "clean": len(part.items), "kept": part.kept}


def prepare_data(spec: PrepareSpec, out_dir: Path, *, progress: bool = True) -> PreparedData:
    """Prepare train/dev/eval/corpus files + data.yaml + prepared.json (last) under out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / PREPARED
    # Drop the completion mark first: a failure below must not leave an old one standing.
    report_path.unlink(missing_ok=True)
    (out_dir / DATA_YAML).unlink(missing_ok=True)

    # Every QA source is read (and its layout checked) before the long corpus stream starts.
    train_parts = [_read_part(p.name, p) for p in spec.train]
    dev_part = _read_part("dev", spec.dev) if spec.dev is not None else None
    eval_parts = {name: _read_part(name, s) for name, s in spec.eval.items()}

    train: list[_Converted] = []
    for part, pspec in zip(train_parts, spec.train, strict=True):
        kept = _sample(part.items, pspec.max_rows, f"{spec.seed}:train:{part.name}")
        part.kept = len(kept)
        train.extend(kept)
    if spec.shuffle:
        random.Random(spec.seed).shuffle(train)
    dev: list[_Converted] = []
    if dev_part is not None and spec.dev is not None:
        dev = _sample(dev_part.items, spec.dev.max_rows, f"{spec.seed}:dev")
        dev_part.kept = len(dev)
    evals: dict[str, list[_Converted]] = {}
    for name, part in eval_parts.items():
        evals[name] = _sample(part.items, spec.eval[name].max_rows, f"{spec.seed}:eval:{name}")
        part.kept = len(evals[name])
    for split in (train, dev, *evals.values()):
        _namespace_ids(split)
    all_items = [*train, *dev, *(i for items in evals.values() for i in items)]

    corpus_path = out_dir / CORPUS
    supporting_dropped = 0
    if spec.corpus.from_questions:
        paragraphs = _ParagraphCorpus()
        for item in all_items:
            ids = [paragraphs.add(t, x) for t, x in item.paragraphs]
            # Rows without their own paragraphs point into some other corpus: not this one.
            item.row["supporting_doc_ids"] = [ids[i] for i in item.support or []]
        if not paragraphs.rows:
            raise DataError("corpus.from_questions: no QA row carries paragraphs "
                            "(only HotpotQA/2Wiki `context` and MuSiQue `paragraphs` do)")
        stats = _write_corpus(enumerate(paragraphs.rows, start=1), "from_questions", "flashrag",
                              corpus_path, set(), progress)
        corpus_source = "from_questions"
    else:
        assert spec.corpus.source is not None
        corpus_source = spec.corpus.source
        referenced = {d for item in all_items for d in item.row.get("supporting_doc_ids") or []}
        stats = _write_corpus(_stream_source_rows(corpus_source), corpus_source,
                              spec.corpus.layout, corpus_path, referenced, progress)
        for item in all_items:
            ids = item.row.get("supporting_doc_ids") or []
            if ids and not all(d in stats.found for d in ids):
                item.row["supporting_doc_ids"] = []
                supporting_dropped += 1
    if supporting_dropped:
        log.warning("%d questions' supporting_doc_ids are not all in the corpus: dropped",
                    supporting_dropped)

    train_path = out_dir / "train.jsonl"
    write_jsonl(train_path, [_qa_out(i) for i in train])
    dev_path = out_dir / "dev.jsonl" if dev_part is not None else None
    if dev_path is not None:
        write_jsonl(dev_path, [_qa_out(i) for i in dev])
    eval_paths = {name: out_dir / f"eval_{safe_filename(name)}.jsonl" for name in evals}
    for name, items in evals.items():
        write_jsonl(eval_paths[name], [_qa_out(i) for i in items])

    primary = spec.primary
    data_config = DataConfig(
        source="files", train_path=str(train_path),
        dev_path=str(dev_path) if dev_path is not None else None,
        test_path=str(eval_paths[primary]), corpus_path=str(corpus_path),
        extra_eval={n: str(p) for n, p in eval_paths.items() if n != primary},
        # Each extra eval set is measured on its own named corpus: here, the same one.
        extra_corpus={n: str(corpus_path) for n in eval_paths if n != primary})
    data_yaml = out_dir / DATA_YAML
    atomic_write_text(data_yaml, "# Generated by searchrl prepare-data; see prepared.json.\n"
                      + yaml.safe_dump({"data": data_config.model_dump(
                          mode="json", exclude_defaults=True)}, sort_keys=False))

    counts = {"train": len(train), "corpus": stats.rows,
              **({"dev": len(dev)} if dev_path is not None else {}),
              **{f"eval:{n}": len(items) for n, items in evals.items()}}
    every_part = [*train_parts, *([dev_part] if dev_part else []), *eval_parts.values()]
    skipped = tuple(s for p in every_part for s in p.skipped)
    layouts = {**{p.name: p.layout for p in train_parts},
               **({"dev": dev_part.layout} if dev_part else {}),
               **{f"eval:{n}": p.layout for n, p in eval_parts.items()}}
    report = {
        "spec": spec.model_dump(mode="json"),
        "counts": counts,
        "train": {"path": str(train_path), "rows": len(train),
                  "parts": {p.name: _part_report(p) for p in train_parts}},
        "dev": ({"path": str(dev_path), "rows": len(dev), **_part_report(dev_part)}
                if dev_part is not None else None),
        "eval": {n: {"path": str(eval_paths[n]), "rows": len(evals[n]), **_part_report(p)}
                 for n, p in eval_parts.items()},
        "primary_eval": primary,
        "corpus": {"path": str(corpus_path), "source": corpus_source,
                   "layout": spec.corpus.layout, "rows": stats.rows, "sha256": stats.sha256,
                   "duplicate_ids": stats.duplicates,
                   "duplicate_examples": stats.duplicate_examples},
        "supporting_doc_ids": {
            "questions_with": sum(bool(i.row.get("supporting_doc_ids")) for i in all_items),
            "dropped_not_in_corpus": supporting_dropped},
        "layouts": layouts,
        "skipped": [asdict(s) for s in skipped],
        "data_yaml": str(data_yaml),
    }
    # Written last: its presence marks every file above complete.
    atomic_write_text(report_path, json.dumps(report, indent=2, ensure_ascii=False))
    return PreparedData(
        out_dir=out_dir, train_path=train_path, dev_path=dev_path, eval_paths=eval_paths,
        corpus_path=corpus_path, data_yaml=data_yaml, report_path=report_path,
        data_config=data_config, counts=counts, layouts=layouts, skipped=skipped,
        duplicate_corpus_ids=stats.duplicates)
