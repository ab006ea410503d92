"""Stage 1's corpus work in one streamed pass per corpus file, memory flat in its size.

Each chunk of `CHUNK_ROWS` passages, read in file order from the configured source:
1. parsed as passages (the first unreadable line or invalid row stops the stage, naming file
   and row, as before any other check);
2. appended to the materialised copy (`<validate>/source/`, written as `write_jsonl` writes
   it, hashed as it goes; complete with its manifest only at the end);
3. through the `corpus` GX suite (`SuiteRunner.chunked`: uniqueness of ids over the whole
   file from 8 bytes a passage) and, rows the suite passed, the row schema;
4. through the answer scan and the supporting-passage lookup (`CorpusFacts`) that the
   answerability checks read afterwards.

A broken passage is collected, not raised at once: the stage stops with one ContractError
naming the file, the first rows and their fields after every corpus was read, as when each
corpus was checked as one frame. What it finds is the same (tests check it row for row).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from searchrl.contracts.checks import CorpusFacts
from searchrl.contracts.drift import GoldDigest
from searchrl.contracts.suites import ContractError, SuiteResult, SuiteRunner
from searchrl.data.io import (
    atomic_writer,
    iter_passage_chunks,
    manifest_path,
    passage_id_at,
    passage_line,
    write_manifest,
)
from searchrl.data.sources import SourcePaths
from searchrl.types import Passage

# Passages held at once: the GX suite's fixed cost per run (~0.15 s) against the chunk's
# memory (~3 KB a passage with its frame and the suite's working copies).
CHUNK_ROWS = 50_000
SHOWN_PROBLEMS = 10


@dataclass(frozen=True)
class CorpusFile:
    """One corpus file and the dataset names it serves (`corpus`, `extra_corpus:<n>`)."""

    path: Path  # the materialised copy later stages read
    source: str | None  # where it is copied from; None: `path` is the source (synthetic)
    names: tuple[str, ...]


def corpus_files(sources: SourcePaths) -> list[CorpusFile]:
    """Distinct corpus files in the order their first name is checked."""
    names: dict[Path, list[str]] = {}
    for name, path in sources.corpus_sets().items():
        names.setdefault(path, []).append(name)
    return [CorpusFile(path, sources.pending_copies.get(path), tuple(n))
            for path, n in names.items()]


class _Copy:
    """The copy being written: one line per passage, content sha256 as it goes."""

    def __init__(self, fh: IO[bytes] | None) -> None:
        self.fh, self.rows, self.sha = fh, 0, hashlib.sha256()

    def write(self, passages: list[Passage]) -> None:
        if self.fh is None:
            return
        data = "".join(passage_line(p) for p in passages).encode("utf-8")
        self.fh.write(data)
        self.sha.update(data)
        self.rows += len(passages)


@contextmanager
def _copy_to(path: Path, copying: bool) -> Iterator[_Copy]:
    if not copying:
        yield _Copy(None)
        return
    manifest_path(path).unlink(missing_ok=True)
    with atomic_writer(path) as fh:
        copy = _Copy(fh)
        yield copy
    write_manifest(path, copy.rows, copy.sha.hexdigest())


def _schema_problem(schema: Any, raw: dict[str, Any]) -> str | None:
    try:
        schema.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return None


def _stream(runner: SuiteRunner, file: CorpusFile, facts: CorpusFacts,
            digest: GoldDigest | None = None) -> tuple[SuiteResult, list[str]]:
    """One pass over `file`: its suite result and its problems (file, row, field)."""
    run = runner.chunked("corpus", file.names[0])
    schema = runner.row_schema("corpus")
    schema_problems: dict[int, str] = {}  # the suite passed the row, the schema did not
    with _copy_to(file.path, file.source is not None) as copy:
        for passages in iter_passage_chunks(file.source or file.path, CHUNK_ROWS):
            start = run.rows
            rows = [{"id": p.id, "title": p.title, "contents": p.contents} for p in passages]
            failed = run.add(rows)
            for k, raw in enumerate(rows):
                if start + k not in failed:
                    problem = _schema_problem(schema, raw)
                    if problem is not None:
                        schema_problems[start + k] = problem
            copy.write(passages)
            if digest is not None:  # drift against the reference gold set's passages
                digest.corpus(file.names[0]).add(passages)
            facts.add(file.names[0], passages)
            for other in file.names[1:]:  # one file, several names: counted for each
                facts.add(other, passages, scan=False)
    result = run.finish(lambda _column, wanted: dict(passage_id_at(file.path, wanted)))
    problems = [f"{file.path}: row {i + 1}: {reason}"
                for i, fails in sorted(result.row_failures.items()) for _, reason in fails]
    problems += [f"{file.path}: row {i + 1}: {problem}"
                 for i, problem in sorted(schema_problems.items())
                 if i not in result.row_failures]
    return result, problems


def check_corpora(runner: SuiteRunner, sources: SourcePaths, facts: CorpusFacts,
                  digest: GoldDigest | None = None) -> list[SuiteResult]:
    """Every corpus streamed once (copied where still to be copied, checked, scanned into
    `facts`); one SuiteResult per corpus name. Raises DataError (a line or row unreadable as
    a passage) or ContractError (the first corpus, in order, with broken passages)."""
    results: list[SuiteResult] = []
    broken: list[tuple[str, list[str]]] = []
    for file in corpus_files(sources):
        result, problems = _stream(runner, file, facts, digest)
        results += [replace(result, dataset=name) for name in file.names]
        if problems:
            broken.append((file.names[0], problems))
    if broken:
        name, problems = broken[0]
        shown = "\n  ".join(problems[:SHOWN_PROBLEMS])
        more = (f"\n  ... and {len(problems) - SHOWN_PROBLEMS} more"
                if len(problems) > SHOWN_PROBLEMS else "")
        raise ContractError(f"corpus {name!r} breaks its data contract (data_contracts/"
                            f"corpus.py); fix the passages at the source:\n  {shown}{more}")
    return results
