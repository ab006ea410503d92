"""Materialise the configured data sources into `<work_dir>/source/` as normalised JSONL with
manifests: the synthetic world is generated (deterministic), files are read and rewritten.

Reading goes through `searchrl.datasets.io`, so a bad row fails here naming file, row and field
before any stage runs, and nothing partial is left marked complete (manifests come last).
Validation passes a `SourceRows` instead: QA lines that are not JSON objects are then handed
back to be quarantined, and each copied row keeps the file and row number it came from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.config import DataConfig
from searchrl.datasets.io import (
    BadRow,
    DataError,
    fingerprint,
    read_passages,
    read_raw_qa_rows,
    read_raw_qa_rows_lenient,
    write_jsonl,
)
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.world import write_world
from searchrl.paths import safe_filename


def source_fingerprint(cfg: DataConfig) -> str:
    """Fingerprint of the inputs: the data config plus the content hash of every input file."""
    parts = [json.dumps(cfg.model_dump(mode="json"), sort_keys=True)]
    for path in _local_sources(cfg).values():
        parts.append(f"{path}={fingerprint(path)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _local_sources(cfg: DataConfig) -> dict[str, str]:
    """The config key (`data.train_path`, `data.extra_eval.<name>`, ...) -> each input file
    or directory on this machine (hub datasets left out)."""
    named = {"data.train_path": cfg.train_path, "data.dev_path": cfg.dev_path,
             "data.test_path": cfg.test_path, "data.corpus_path": cfg.corpus_path,
             **{f"data.extra_eval.{n}": p for n, p in cfg.extra_eval.items()},
             **{f"data.extra_corpus.{n}": p for n, p in cfg.extra_corpus.items()}}
    return {key: path for key, path in named.items() if path and not path.startswith("hf://")}


def check_sources_exist(cfg: DataConfig) -> None:
    """DataError naming the file and its config key when an input does not exist: found
    before anything is copied, not after the QA sets were."""
    for key, path in _local_sources(cfg).items():
        if not Path(path).exists():
            raise DataError(f"{path}: file not found ({key})")


@dataclass
class SourceRows:
    """Where materialised QA rows came from, per split name (`train`, `extra_eval_split(name)`):
    the source file, the source row number of each copied row (in the copy's order; the
    line for JSONL), and the source lines that were not JSON objects (not copied)."""

    files: dict[str, str] = field(default_factory=dict)
    rows: dict[str, list[int]] = field(default_factory=dict)
    unreadable: dict[str, list[BadRow]] = field(default_factory=dict)


def _qa_rows(name: str, src: str, provenance: SourceRows | None) -> list[dict[str, Any]]:
    if provenance is None:
        return [row for _, row in read_raw_qa_rows(src)]
    rows, bad = read_raw_qa_rows_lenient(src)
    provenance.files[name] = src
    provenance.rows[name] = [rowno for rowno, _ in rows]
    provenance.unreadable[name] = bad
    return [row for _, row in rows]


def extra_eval_split(name: str) -> str:
    """The split name validation, its audit and a steward's overrides give extra eval set
    `name` (the one place this label is built; nothing parses it back)."""
    return f"extra_eval:{name}"


def extra_corpus_label(name: str) -> str:
    """The dataset name the corpus suite and its errors give extra corpus `name`."""
    return f"extra_corpus:{name}"


@dataclass(frozen=True)
class SourcePaths:
    """The materialised sources: QA splits (`train`, `dev`, `test`), the main corpus, and the
    extra eval sets and the corpora they are searched in (both name -> file; names that
    share a corpus file share one copy)."""

    splits: dict[str, Path]
    corpus: Path
    extra_evals: dict[str, Path] = field(default_factory=dict)
    extra_corpora: dict[str, Path] = field(default_factory=dict)
    # With copy_corpora=False: copy -> the source it is still to be copied from.
    pending_copies: dict[Path, str] = field(default_factory=dict)

    def qa_sets(self) -> dict[str, Path]:
        """Split name -> QA file for every QA set, extra eval sets under `extra_eval_split`."""
        return self.splits | {extra_eval_split(n): p for n, p in self.extra_evals.items()}

    def corpus_sets(self) -> dict[str, Path]:
        """Dataset name -> passages file for every corpus (`corpus`, `extra_corpus_label`)."""
        return {"corpus": self.corpus} | {extra_corpus_label(n): p
                                          for n, p in self.extra_corpora.items()}


def materialise_sources(cfg: DataConfig, out_dir: Path, *,
                        provenance: SourceRows | None = None,
                        copy_corpora: bool = True) -> SourcePaths:
    """Write corpus + splits (+ extra eval sets/corpora) to out_dir; return their paths.

    QA rows are copied raw-but-normalised (validation decides what is clean); passages are
    parsed strictly since a corpus row without contents is a hard error. Without
    `provenance` a QA line that is not a JSON object raises DataError; with it, such lines
    are recorded there (and skipped), as are the source file and row numbers of the copies.
    A file unreadable as a whole raises a one-line DataError naming it either way.
    `copy_corpora=False` leaves the corpus copies to the caller (`pending_copies`): validation
    streams a wiki-scale corpus once, copying it while it checks it.
    """
    check_sources_exist(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    pending: dict[Path, str] = {}
    if cfg.source == "synthetic":
        splits = write_world(generate_world(cfg.synthetic), out_dir)
        corpus = splits.pop("corpus")
    else:
        splits = {}
        for split, src in (("train", cfg.train_path), ("dev", cfg.dev_path),
                           ("test", cfg.test_path)):
            if src is not None:
                splits[split] = out_dir / f"{split}.jsonl"
                write_jsonl(splits[split], _qa_rows(split, src, provenance))
        assert cfg.corpus_path is not None
        corpus = out_dir / "corpus.jsonl"
        pending[corpus] = cfg.corpus_path
    extra_evals: dict[str, Path] = {}
    for name, src in cfg.extra_eval.items():
        extra_evals[name] = out_dir / f"extra_eval_{safe_filename(name)}.jsonl"
        write_jsonl(extra_evals[name], _qa_rows(extra_eval_split(name), src, provenance))
    # A corpus file is copied once: prepare-data points every extra eval set at the corpus it
    # wrote, which is often the main one too (a wiki-scale corpus per set is hours and disk).
    copies: dict[Path, Path] = {}
    if cfg.source != "synthetic" and cfg.corpus_path is not None:
        copies[Path(cfg.corpus_path).resolve()] = corpus
    extra_corpora: dict[str, Path] = {}
    for name, src in cfg.extra_corpus.items():
        source = Path(src).resolve()
        if source not in copies:
            copies[source] = out_dir / f"extra_corpus_{safe_filename(name)}.jsonl"
            pending[copies[source]] = src
        extra_corpora[name] = copies[source]
    if copy_corpora:
        for copy, src in pending.items():
            write_jsonl(copy, read_passages(src))
        pending = {}
    return SourcePaths(splits, corpus, extra_evals, extra_corpora, pending)
