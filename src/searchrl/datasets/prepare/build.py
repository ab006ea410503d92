"""prepare-data's orchestration: read every QA source, sample and mix, write the corpus, the
splits, data.yaml and prepared.json (last)."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from searchrl.config import DataConfig
from searchrl.datasets.io import DataError, atomic_write_text, write_jsonl
from searchrl.datasets.prepare.corpus import (
    CorpusStats,
    ParagraphCorpus,
    stream_source_rows,
    write_corpus,
)
from searchrl.datasets.prepare.layouts import Converted, Part, SkippedRow, read_part, sample_items
from searchrl.datasets.prepare.spec import CORPUS, DATA_YAML, PREPARED, PrepareSpec
from searchrl.paths import safe_filename
from searchrl.types import QAExample

log = logging.getLogger(__name__)


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


def _namespace_ids(items: list[Converted]) -> None:
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


def _qa_out(item: Converted) -> dict[str, Any]:
    row = QAExample.model_validate(item.row).model_dump(mode="json")
    row["data_source"] = item.row["data_source"]
    if "source_id" in item.row:
        row["source_id"] = item.row["source_id"]
    return row


def _part_report(part: Part) -> dict[str, Any]:
    return {"source": part.source, "layout": part.layout, "rows_read": part.rows_read,
            "skipped": len(part.skipped), "clean": len(part.items), "kept": part.kept}


@dataclass
class _Parts:
    """Every QA source as read, before sampling."""

    train: list[Part]
    dev: Part | None
    evals: dict[str, Part]

    def all(self) -> list[Part]:
        return [*self.train, *([self.dev] if self.dev else []), *self.evals.values()]


@dataclass
class _Selection:
    """The rows each output file gets: sampled, mixed, ids namespaced where they collide."""

    train: list[Converted]
    dev: list[Converted]
    evals: dict[str, list[Converted]]

    def all(self) -> list[Converted]:
        return [*self.train, *self.dev, *(i for items in self.evals.values() for i in items)]


@dataclass
class _Corpus:
    path: Path
    source: str
    stats: CorpusStats
    supporting_dropped: int  # questions whose supporting_doc_ids were not all in the corpus


@dataclass
class _QAFiles:
    train: Path
    dev: Path | None
    evals: dict[str, Path]


def _read_parts(spec: PrepareSpec) -> _Parts:
    """Every QA source read (and its layout checked) before the long corpus stream starts."""
    return _Parts(train=[read_part(p.name, p) for p in spec.train],
                  dev=read_part("dev", spec.dev) if spec.dev is not None else None,
                  evals={name: read_part(name, s) for name, s in spec.eval.items()})


def _select(spec: PrepareSpec, parts: _Parts) -> _Selection:
    """Each part's seeded sample (recorded as the part's `kept`), the train parts mixed."""
    train: list[Converted] = []
    for part, pspec in zip(parts.train, spec.train, strict=True):
        kept = sample_items(part.items, pspec.max_rows, f"{spec.seed}:train:{part.name}")
        part.kept = len(kept)
        train.extend(kept)
    if spec.shuffle:
        random.Random(spec.seed).shuffle(train)
    dev: list[Converted] = []
    if parts.dev is not None and spec.dev is not None:
        dev = sample_items(parts.dev.items, spec.dev.max_rows, f"{spec.seed}:dev")
        parts.dev.kept = len(dev)
    evals: dict[str, list[Converted]] = {}
    for name, part in parts.evals.items():
        evals[name] = sample_items(part.items, spec.eval[name].max_rows,
                                   f"{spec.seed}:eval:{name}")
        part.kept = len(evals[name])
    for split in (train, dev, *evals.values()):
        _namespace_ids(split)
    return _Selection(train, dev, evals)


def _build_corpus(spec: PrepareSpec, all_items: list[Converted], corpus_path: Path,
                  progress: bool) -> _Corpus:
    """The corpus from the QA rows' paragraphs or streamed from its source; supporting ids
    point into it (from paragraphs) or are dropped where they do not all resolve."""
    supporting_dropped = 0
    if spec.corpus.from_questions:
        paragraphs = ParagraphCorpus()
        for item in all_items:
            ids = [paragraphs.add(t, x) for t, x in item.paragraphs]
            # Rows without their own paragraphs point into some other corpus: not this one.
            item.row["supporting_doc_ids"] = [ids[i] for i in item.support or []]
        if not paragraphs.rows:
            raise DataError("corpus.from_questions: no QA row carries paragraphs "
                            "(only HotpotQA/2Wiki `context` and MuSiQue `paragraphs` do)")
        stats = write_corpus(enumerate(paragraphs.rows, start=1), "from_questions", "flashrag",
                             corpus_path, set(), progress)
        corpus_source = "from_questions"
    else:
        assert spec.corpus.source is not None
        corpus_source = spec.corpus.source
        referenced = {d for item in all_items for d in item.row.get("supporting_doc_ids") or []}
        stats = write_corpus(stream_source_rows(corpus_source), corpus_source,
                             spec.corpus.layout, corpus_path, referenced, progress)
        for item in all_items:
            ids = item.row.get("supporting_doc_ids") or []
            if ids and not all(d in stats.found for d in ids):
                item.row["supporting_doc_ids"] = []
                supporting_dropped += 1
    if supporting_dropped:
        log.warning("%d questions' supporting_doc_ids are not all in the corpus: dropped",
                    supporting_dropped)
    return _Corpus(corpus_path, corpus_source, stats, supporting_dropped)


def _write_qa(out_dir: Path, selection: _Selection, with_dev: bool) -> _QAFiles:
    train_path = out_dir / "train.jsonl"
    write_jsonl(train_path, [_qa_out(i) for i in selection.train])
    dev_path = out_dir / "dev.jsonl" if with_dev else None
    if dev_path is not None:
        write_jsonl(dev_path, [_qa_out(i) for i in selection.dev])
    eval_paths = {name: out_dir / f"eval_{safe_filename(name)}.jsonl"
                  for name in selection.evals}
    for name, items in selection.evals.items():
        write_jsonl(eval_paths[name], [_qa_out(i) for i in items])
    return _QAFiles(train_path, dev_path, eval_paths)


def _write_data_yaml(out_dir: Path, files: _QAFiles, corpus_path: Path,
                     primary: str) -> tuple[DataConfig, Path]:
    """The `data:` section that points the pipeline at the prepared files."""
    data_config = DataConfig(
        source="files", train_path=str(files.train),
        dev_path=str(files.dev) if files.dev is not None else None,
        test_path=str(files.evals[primary]), corpus_path=str(corpus_path),
        extra_eval={n: str(p) for n, p in files.evals.items() if n != primary},
        # Each extra eval set is measured on its own named corpus: here, the same one.
        extra_corpus={n: str(corpus_path) for n in files.evals if n != primary})
    data_yaml = out_dir / DATA_YAML
    atomic_write_text(data_yaml, "# Generated by searchrl prepare-data; see prepared.json.\n"
                      + yaml.safe_dump({"data": data_config.model_dump(
                          mode="json", exclude_defaults=True)}, sort_keys=False))
    return data_config, data_yaml


def _report(spec: PrepareSpec, parts: _Parts, selection: _Selection, files: _QAFiles,
            corpus: _Corpus, counts: dict[str, int], layouts: dict[str, str],
            skipped: tuple[SkippedRow, ...], data_yaml: Path) -> dict[str, Any]:
    """prepared.json's content: counts, layouts, skipped rows, the corpus's figures."""
    dev_part, stats = parts.dev, corpus.stats
    return {
        "spec": spec.model_dump(mode="json"),
        "counts": counts,
        "train": {"path": str(files.train), "rows": len(selection.train),
                  "parts": {p.name: _part_report(p) for p in parts.train}},
        "dev": ({"path": str(files.dev), "rows": len(selection.dev), **_part_report(dev_part)}
                if dev_part is not None else None),
        "eval": {n: {"path": str(files.evals[n]), "rows": len(selection.evals[n]),
                     **_part_report(p)} for n, p in parts.evals.items()},
        "primary_eval": spec.primary,
        "corpus": {"path": str(corpus.path), "source": corpus.source,
                   "layout": spec.corpus.layout, "rows": stats.rows, "sha256": stats.sha256,
                   "duplicate_ids": stats.duplicates,
                   "duplicate_examples": stats.duplicate_examples},
        "supporting_doc_ids": {
            "questions_with": sum(bool(i.row.get("supporting_doc_ids"))
                                  for i in selection.all()),
            "dropped_not_in_corpus": corpus.supporting_dropped},
        "layouts": layouts,
        "skipped": [asdict(s) for s in skipped],
        "data_yaml": str(data_yaml),
    }


def prepare_data(spec: PrepareSpec, out_dir: Path, *, progress: bool = True) -> PreparedData:
    """Prepare train/dev/eval/corpus files + data.yaml + prepared.json (last) under out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / PREPARED
    # Drop the completion mark first: a failure below must not leave an old one standing.
    report_path.unlink(missing_ok=True)
    (out_dir / DATA_YAML).unlink(missing_ok=True)
    parts = _read_parts(spec)
    selection = _select(spec, parts)
    corpus = _build_corpus(spec, selection.all(), out_dir / CORPUS, progress)
    files = _write_qa(out_dir, selection, with_dev=parts.dev is not None)
    data_config, data_yaml = _write_data_yaml(out_dir, files, corpus.path, spec.primary)
    counts = {"train": len(selection.train), "corpus": corpus.stats.rows,
              **({"dev": len(selection.dev)} if files.dev is not None else {}),
              **{f"eval:{n}": len(items) for n, items in selection.evals.items()}}
    skipped = tuple(s for p in parts.all() for s in p.skipped)
    layouts = {**{p.name: p.layout for p in parts.train},
               **({"dev": parts.dev.layout} if parts.dev else {}),
               **{f"eval:{n}": p.layout for n, p in parts.evals.items()}}
    report = _report(spec, parts, selection, files, corpus, counts, layouts, skipped, data_yaml)
    # Written last: its presence marks every file above complete.
    atomic_write_text(report_path, json.dumps(report, indent=2, ensure_ascii=False))
    return PreparedData(
        out_dir=out_dir, train_path=files.train, dev_path=files.dev, eval_paths=files.evals,
        corpus_path=corpus.path, data_yaml=data_yaml, report_path=report_path,
        data_config=data_config, counts=counts, layouts=layouts, skipped=skipped,
        duplicate_corpus_ids=corpus.stats.duplicates)
