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

A corpus file of `engine.local_workers_min_corpus_mb` or more has the work of a chunk that
needs no other chunk (the suite and row schema of step 3, the copy's lines of step 2, the
drift hashes) run on `engine.local_workers` spawned processes (`ChunkWorkers`), at most
`IN_FLIGHT_PER_WORKER` chunks each in flight so memory stays flat, while this process parses
and scans the next chunks. What spans chunks stays here, in chunk order: the verdicts and id
hashes recorded, the copy written and hashed, the answer scan; so the result, the errors and
the copy do not depend on the number of workers.
"""

from __future__ import annotations

import hashlib
import multiprocessing
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

from pydantic import ValidationError

from searchrl.config import EngineConfig, ValidateConfig
from searchrl.datasets.io import (
    DataError,
    atomic_writer,
    iter_passage_chunks,
    manifest_path,
    passage_id_at,
    passage_line,
    write_manifest,
)
from searchrl.datasets.sources import SourcePaths
from searchrl.types import Passage
from searchrl.validation.checks import CorpusFacts
from searchrl.validation.drift import CorpusDigest, GoldDigest
from searchrl.validation.suites import ChunkedRun, ContractError, SuiteResult, SuiteRunner, Verdict

# Passages held at once: the GX suite's fixed cost per run (~0.15 s) against the chunk's
# memory (~3 KB a passage with its frame and the suite's working copies).
CHUNK_ROWS = 50_000
SHOWN_PROBLEMS = 10
# Chunks queued per worker: one checked while the next travels, few enough to keep memory flat.
IN_FLIGHT_PER_WORKER = 2


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

    def write(self, data: bytes, rows: int) -> None:
        """The next `rows` passages' lines (`passage_line`, encoded)."""
        if self.fh is None:
            return
        self.fh.write(data)
        self.sha.update(data)
        self.rows += rows


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


class _PassageFields(NamedTuple):
    """A row's fields under Passage's names: what `passage_line` and the drift digest read,
    without a model per passage (a worker gets the rows as dicts)."""

    id: str
    title: str | None
    contents: str


@dataclass
class _Checked:
    """What a chunk's order-free work found and made."""

    verdicts: list[Verdict]  # the suite's per-chunk expectations, chunk positions
    schema_problems: dict[int, str]  # rows the suite passed and the row schema did not
    copy: bytes  # the chunk's lines of the copy (empty when nothing is copied)
    digest: CorpusDigest | None  # its passages' drift hashes (None: no digest kept)


def _check_chunk(run: ChunkedRun, schema: Any, rows: list[dict[str, Any]],
                 passages: list[Passage] | None, copying: bool, digesting: bool
                 ) -> _Checked:
    """A chunk's suite verdicts, row schema problems, copy lines and drift hashes: what a
    worker runs (`passages` None: read from `rows`), or this process without workers."""
    verdicts = run.check(rows)
    failed = {k for v in verdicts for k in v.indices}
    problems = {}
    for k, raw in enumerate(rows):
        if k not in failed:
            problem = _schema_problem(schema, raw)
            if problem is not None:
                problems[k] = problem
    if passages is None:
        passages = cast(list[Passage], [_PassageFields(r["id"], r["title"], r["contents"])
                                        for r in rows])
    copy = "".join(passage_line(p) for p in passages).encode("utf-8") if copying else b""
    digest = None
    if digesting:
        digest = CorpusDigest()
        digest.add(passages)
    return _Checked(verdicts, problems, copy, digest)


@dataclass(frozen=True)
class _ChunkJob:
    contracts_dir: Path
    cfg: ValidateConfig
    dataset: str
    rows: list[dict[str, Any]]
    copying: bool
    digesting: bool


# In a worker process: its suite run and row schema for (contracts dir, config, dataset).
_WORKER_RUN: dict[tuple[str, str, str], tuple[ChunkedRun, Any]] = {}


def _check_on_worker(job: _ChunkJob) -> _Checked:
    key = (str(job.contracts_dir), job.cfg.model_dump_json(), job.dataset)
    if key not in _WORKER_RUN:
        _WORKER_RUN.clear()
        runner = SuiteRunner(job.contracts_dir, job.cfg)
        _WORKER_RUN[key] = (runner.chunked("corpus", job.dataset), runner.row_schema("corpus"))
    run, schema = _WORKER_RUN[key]
    return _check_chunk(run, schema, job.rows, None, job.copying, job.digesting)


@dataclass(frozen=True)
class ChunkWorkers:
    """Worker processes for the per-chunk checks of the corpus files at least `min_bytes`."""

    pool: ProcessPoolExecutor
    count: int
    min_bytes: float

    def serve(self, file: CorpusFile) -> bool:
        return _source_bytes(file) >= self.min_bytes


def _source_bytes(file: CorpusFile) -> int:
    source = Path(file.source or file.path)
    return source.stat().st_size if source.is_file() else 0


@contextmanager
def chunk_workers(engine: EngineConfig, runner: SuiteRunner, sources: SourcePaths
                  ) -> Iterator[ChunkWorkers | None]:
    """`engine.local_workers` processes when a corpus file is large enough to pay for their
    start (else None), started now so their imports overlap the QA checks; stopped on exit."""
    min_bytes = engine.local_workers_min_corpus_mb * 2**20
    if not engine.local_workers:
        yield None
        return
    large = [f for f in corpus_files(sources) if _source_bytes(f) >= min_bytes]
    if not large:
        yield None
        return
    # spawn, as the encoder workers: the stage may run in a process with threads (Prefect).
    pool = ProcessPoolExecutor(engine.local_workers,
                               mp_context=multiprocessing.get_context("spawn"))
    try:
        warm = _ChunkJob(runner.contracts_dir, runner.cfg, large[0].names[0], [], False, False)
        for _ in range(engine.local_workers):
            pool.submit(_check_on_worker, warm)
        yield ChunkWorkers(pool, engine.local_workers, min_bytes)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stream(runner: SuiteRunner, file: CorpusFile, facts: CorpusFacts,
            digest: GoldDigest | None = None, workers: ChunkWorkers | None = None
            ) -> tuple[SuiteResult, list[str]]:
    """One pass over `file`: its suite result and its problems (file, row, field)."""
    dataset = file.names[0]
    run = runner.chunked("corpus", dataset)
    schema = runner.row_schema("corpus")
    schema_problems: dict[int, str] = {}  # the suite passed the row, the schema did not
    flying: deque[tuple[list[dict[str, Any]], Future[_Checked]]] = deque()
    copying = file.source is not None

    def record(rows: list[dict[str, Any]], checked: _Checked) -> None:
        start = run.rows
        run.add(rows, checked.verdicts)
        schema_problems.update((start + k, p) for k, p in checked.schema_problems.items())
        copy.write(checked.copy, len(rows))
        if digest is not None and checked.digest is not None:  # drift against the
            digest.corpus(dataset).extend(checked.digest)  # reference gold set's passages

    def record_first() -> None:
        rows, future = flying.popleft()
        try:
            checked = future.result()
        except BrokenProcessPool as exc:
            raise RuntimeError(f"{file.source or file.path}: a corpus check worker process "
                               f"died ({exc}); rerun, or set engine.local_workers=0") from exc
        record(rows, checked)

    with _copy_to(file.path, copying) as copy:
        try:
            for passages in iter_passage_chunks(file.source or file.path, CHUNK_ROWS):
                rows = [{"id": p.id, "title": p.title, "contents": p.contents}
                        for p in passages]
                if workers is None or not workers.serve(file):
                    record(rows, _check_chunk(run, schema, rows, passages, copying,
                                              digest is not None))
                else:
                    if len(flying) >= IN_FLIGHT_PER_WORKER * workers.count:
                        record_first()
                    flying.append((rows, workers.pool.submit(_check_on_worker, _ChunkJob(
                        runner.contracts_dir, runner.cfg, dataset, rows, copying,
                        digest is not None))))
                facts.add(dataset, passages)
                for other in file.names[1:]:  # one file, several names: counted for each
                    facts.add(other, passages, scan=False)
        except DataError:
            while flying:  # an earlier chunk's suite error first, as without workers
                record_first()
            raise
        while flying:
            record_first()
    result = run.finish(lambda _column, wanted: dict(passage_id_at(file.path, wanted)))
    problems = [f"{file.path}: row {i + 1}: {reason}"
                for i, fails in sorted(result.row_failures.items()) for _, reason in fails]
    problems += [f"{file.path}: row {i + 1}: {problem}"
                 for i, problem in sorted(schema_problems.items())
                 if i not in result.row_failures]
    return result, problems


def check_corpora(runner: SuiteRunner, sources: SourcePaths, facts: CorpusFacts,
                  digest: GoldDigest | None = None, workers: ChunkWorkers | None = None
                  ) -> list[SuiteResult]:
    """Every corpus streamed once (copied where still to be copied, checked, scanned into
    `facts`); one SuiteResult per corpus name. Raises DataError (a line or row unreadable as
    a passage) or ContractError (the first corpus, in order, with broken passages)."""
    results: list[SuiteResult] = []
    broken: list[tuple[str, list[str]]] = []
    for file in corpus_files(sources):
        result, problems = _stream(runner, file, facts, digest, workers)
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
