"""Materialise the configured data sources into `<work_dir>/source/` as normalised JSONL with
manifests: the synthetic world is generated (deterministic), files are read and rewritten.

Reading goes through `searchrl.data.io`, so a bad row fails here naming file, row and field
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
from searchrl.data.io import (
    BadRow,
    fingerprint,
    read_passages,
    read_raw_qa_rows,
    read_raw_qa_rows_lenient,
    write_jsonl,
)
from searchrl.data.synthetic import generate_world, write_world
from searchrl.paths import safe_filename


def source_fingerprint(cfg: DataConfig) -> str:
    """Fingerprint of the inputs: the data config plus the content hash of every input file."""
    parts = [json.dumps(cfg.model_dump(mode="json"), sort_keys=True)]
    paths = [cfg.train_path, cfg.dev_path, cfg.test_path, cfg.corpus_path,
             *cfg.extra_eval.values(), *cfg.extra_corpus.values()]
    for path in paths:
        if path and not path.startswith("hf://"):
            parts.append(f"{path}={fingerprint(path)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@dataclass
class SourceRows:
    """Where materialised QA rows came from, per split name (`train`, `extra_eval:<name>`):
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


def materialise_sources(cfg: DataConfig, out_dir: Path, *,
                        provenance: SourceRows | None = None) -> dict[str, Path]:
    """Write corpus + splits (+ extra eval sets/corpora) to out_dir; return name -> path.

    QA rows are copied raw-but-normalised (validation decides what is clean); passages are
    parsed strictly since a corpus row without contents is a hard error. Without
    `provenance` a QA line that is not a JSON object raises DataError; with it, such lines
    are recorded there (and skipped), as are the source file and row numbers of the copies.
    A file unreadable as a whole raises a one-line DataError naming it either way.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.source == "synthetic":
        paths = write_world(generate_world(cfg.synthetic), out_dir)
    else:
        paths = {}
        for split, src in (("train", cfg.train_path), ("dev", cfg.dev_path),
                           ("test", cfg.test_path)):
            if src is not None:
                paths[split] = out_dir / f"{split}.jsonl"
                write_jsonl(paths[split], _qa_rows(split, src, provenance))
        assert cfg.corpus_path is not None
        paths["corpus"] = out_dir / "corpus.jsonl"
        write_jsonl(paths["corpus"], read_passages(cfg.corpus_path))
    for name, src in cfg.extra_eval.items():
        paths[f"extra_eval:{name}"] = out_dir / f"extra_eval_{safe_filename(name)}.jsonl"
        write_jsonl(paths[f"extra_eval:{name}"], _qa_rows(f"extra_eval:{name}", src, provenance))
    # A corpus file is copied once: prepare-data points every extra eval set at the corpus it
    # wrote, which is often the main one too (a wiki-scale corpus per set is hours and disk).
    copies: dict[Path, Path] = {}
    if cfg.source != "synthetic" and cfg.corpus_path is not None:
        copies[Path(cfg.corpus_path).resolve()] = paths["corpus"]
    for name, src in cfg.extra_corpus.items():
        source = Path(src).resolve()
        if source not in copies:
            copies[source] = out_dir / f"extra_corpus_{safe_filename(name)}.jsonl"
            write_jsonl(copies[source], read_passages(src))
        paths[f"extra_corpus:{name}"] = copies[source]
    return paths
