"""The prepared corpus, streamed to disk (wiki-18's 21M lines never sit in memory) with its
manifest and a duplicate-id count, or built from the QA rows' own paragraphs."""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError
from tqdm import tqdm

from searchrl.datasets.io import (
    DataError,
    _normalise_passage,
    atomic_write_text,
    atomic_writer,
    manifest_path,
)
from searchrl.datasets.prepare.layouts import read_rows
from searchrl.datasets.prepare.spec import PREPARED
from searchrl.types import Passage

log = logging.getLogger(__name__)


@dataclass
class CorpusStats:
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


def stream_source_rows(source: str) -> Iterator[tuple[int, dict[str, Any]]]:
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
    yield from read_rows(source)


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


def write_corpus(rows: Iterable[tuple[int, dict[str, Any]]], source: str, layout: str,
                  out_path: Path, referenced: set[str], progress: bool) -> CorpusStats:
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
    return CorpusStats(count, sha, dup_count, dup_examples, found)


class ParagraphCorpus:
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
