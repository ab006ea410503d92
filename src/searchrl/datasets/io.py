"""Read QA records and passages from JSONL, JSON, parquet or a `datasets` dataset; write them
atomically with a manifest (row count + sha256 of content) that serves as their fingerprint.

Accepted layouts (Search-R1 / FlashRAG): QA rows with `question` and `golden_answers`
(or `answer`/`answers`), passages with `id` and `contents` (or `text`, optionally
`"title"\\ntext` as FlashRAG's wiki dumps store it).

Over 400 lines because it is the one reader and writer of data files (raw rows and their errors,
the gold-answer rule, normalisation, atomic writes, manifests, directory publishing): one way to
read and write each.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import math
import numbers
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from searchrl.types import Passage, QAExample

T = TypeVar("T", bound=BaseModel)
_encode_str = json.encoder.encode_basestring  # json.dumps(str, ensure_ascii=False), in C


class DataError(ValueError):
    """A data file is missing or a row is unreadable; the message names file, row and field."""


def read_user_text(path: Path, what: str, error: type[Exception] = DataError) -> str:
    """The UTF-8 text of a file the user names (`what` says which, e.g. "overrides file
    (validate.overrides_path)"); `error` naming the file, and the line of a byte that is not
    UTF-8, when it is missing, unreadable or not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise error(f"{path}: line {line}: the {what} is not UTF-8 text (byte "
                    f"{raw[exc.start]:#04x} at offset {exc.start}); save it as UTF-8") from None


# --- raw rows

# How much of an unreadable line a quarantine record keeps: enough to recognise it.
BAD_LINE_KEEP_CHARS = 200


@dataclass(frozen=True)
class BadRow:
    """A JSONL line that is not a JSON object (truncated, not UTF-8, a bare value).

    Only QA validation receives these (`read_raw_qa_rows_lenient`), to quarantine them; every
    other reader raises `message` as a DataError.
    """

    source: str
    line: int
    error: str
    text: str  # the line as read (cut to BAD_LINE_KEEP_CHARS), for the steward

    @property
    def message(self) -> str:
        return f"{self.source}:{self.line}: {self.error}"


def _parse_jsonl_line(path: Path, lineno: int, raw: bytes) -> dict[str, Any] | BadRow:
    # orjson parses a line ~4x faster (a wiki-scale corpus: a minute saved). It refuses part
    # of what json accepts (NaN, lone surrogates) and reads an integer past 64 bits as a
    # float, so a refused line, or one holding a float, goes the json way: same values, errors
    # worded as before.
    try:
        fast = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(fast, dict) and not _has_float(fast):
            return fast
    try:
        # Without its newline a line cut short reads "Unterminated string", not "Invalid
        # control character" (the newline inside the open string).
        row = json.loads(raw.rstrip(b"\r\n").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        error = (f"not valid UTF-8 at byte {exc.start}" if isinstance(exc, UnicodeDecodeError)
                 else f"not valid JSON: {exc.msg} (column {exc.colno})")
        return BadRow(str(path), lineno, error, _shown(raw))
    if not isinstance(row, dict):
        return BadRow(str(path), lineno, "expected a JSON object", _shown(raw))
    return row


def _has_float(row: dict[str, Any]) -> bool:
    for value in row.values():  # the usual row: strings only, no walk
        if type(value) is not str:
            break
    else:
        return False
    stack: list[Any] = [row]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is float:
            return True
        if kind is dict:
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
    return False


def _shown(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")[:BAD_LINE_KEEP_CHARS]


def _iter_rows(source: str | Path) -> Iterator[tuple[int, dict[str, Any]] | BadRow]:
    """Yield (1-based row number, raw dict), or a BadRow for a JSONL line that is not a JSON
    object. Row number is the line for JSONL. A file that cannot be read at all (missing,
    unknown format, unreadable parquet or JSON) raises a one-line DataError naming it."""
    text_source = str(source)
    if text_source.startswith("hf://"):
        yield from _iter_hub_rows(text_source)
        return
    path = Path(source)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if path.is_dir():
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:  # datasets raises several unrelated types here
            raise DataError(f"{path}: not a `datasets` save_to_disk directory: {exc}") from exc
        if isinstance(ds, datasets.DatasetDict):
            raise DataError(f"{path}: is a DatasetDict; point at one split ({list(ds)})")
        for i, row in enumerate(ds, start=1):
            yield i, dict(row)
        return
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        # Bytes, decoded per line: one line that is not UTF-8 is that line's problem, not a
        # decoding error for the whole file.
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                parsed = _parse_jsonl_line(path, lineno, line)
                yield parsed if isinstance(parsed, BadRow) else (lineno, parsed)
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from exc
        if isinstance(data, dict):
            data = data.get("data", data.get("rows"))
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of objects (or {{'data': [...]}})")
        for i, row in enumerate(data, start=1):
            if not isinstance(row, dict):
                raise DataError(f"{path}: row {i}: expected a JSON object")
            yield i, row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
            first = (str(exc).strip().splitlines() or [""])[0]
            raise DataError(f"{path}: not a readable parquet file: {type(exc).__name__}: "
                            f"{first}") from exc
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row
    else:
        raise DataError(f"{path}: unsupported format {suffix!r}; use .jsonl, .json, .parquet "
                        "or a datasets directory")


def _iter_raw_rows(source: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based row number, raw dict); a line that is not a JSON object raises
    DataError naming file and line (corpora, training inputs: no row may go missing)."""
    for item in _iter_rows(source):
        if isinstance(item, BadRow):
            raise DataError(item.message)
        yield item


def _iter_hub_rows(spec: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """`hf://name[:config]@split`: only where the machine is online (never on the default path)."""
    import datasets

    body = spec.removeprefix("hf://")
    name, _, split = body.partition("@")
    name, _, config = name.partition(":")
    ds = datasets.load_dataset(name, config or None, split=split or "train")
    for i, row in enumerate(ds, start=1):
        yield i, dict(row)


# --- gold answers: the one rule for every reader (validation's and prepare-data's)

# SQuAD's answer field: parallel lists of answer texts and their character offsets (a raw
# SQuAD file has a list of such dicts with one text each).
SQUAD_ANSWER_KEYS = frozenset({"text", "answer_start"})


class AnswerTypeError(ValueError):
    """A gold-answer value holding no answer text (a boolean, a dict that is not SQuAD's, a
    list inside the list, a null item, a non-finite number); the message says what it is."""


def answer_strings(value: Any) -> list[str]:
    """The answers one gold-answer field holds, in order, as text: a string is one answer, a
    number its decimal text (1412 and 1412.0 -> "1412"), a list each of its items, SQuAD's
    `{"text": [...], "answer_start": [...]}` its texts; None none. Blank strings are kept
    (the data contract reports them). Raises AnswerTypeError for anything else."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [text for item in value for text in _answer_texts(item, in_list=True)]
    return _answer_texts(value, in_list=False)


def _answer_texts(value: Any, *, in_list: bool) -> list[str]:
    if isinstance(value, dict) and "text" in value and set(value) <= SQUAD_ANSWER_KEYS:
        texts = value["text"]
        return [_answer_text(t) for t in (texts if isinstance(texts, list | tuple) else [texts])]
    if isinstance(value, list | tuple) and in_list:
        raise AnswerTypeError(f"a list inside the list ({_cut(value)}); expected strings")
    return [_answer_text(value)]


def _answer_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # before Real: bool is an int in Python, not an answer
        raise AnswerTypeError(f"a boolean ({json.dumps(value)}) is not an answer text")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise AnswerTypeError(f"{value!r} is not a finite number")
        return str(int(number)) if number.is_integer() else repr(number)
    if value is None:
        raise AnswerTypeError("a null among the answers")
    if isinstance(value, dict):
        raise AnswerTypeError(f"a dict with keys {sorted(map(str, value))}; only SQuAD's "
                              '{"text": [...], "answer_start": [...]} holds answers')
    raise AnswerTypeError(f"a {type(value).__name__} ({_cut(value)}) is not an answer text")


def _cut(value: Any, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


# --- normalisation to our record types


def _normalise_qa(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if "golden_answers" not in out:
        for alt in ("answers", "answer", "golden_answer"):
            if alt in out:
                out["golden_answers"] = out[alt]
                break
    answers = out.get("golden_answers")
    if answers is not None:
        # One of another type is left as read: the data contract quarantines the row,
        # naming the field (file and line come with the row).
        with contextlib.suppress(AnswerTypeError):
            out["golden_answers"] = answer_strings(answers)
    if out.get("id") is not None and not isinstance(out["id"], str):
        out["id"] = str(out["id"])
    return out


def _normalise_passage(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if "contents" not in out and "text" in out:
        out["contents"] = out["text"]
    if out.get("id") is not None and not isinstance(out["id"], str):
        out["id"] = str(out["id"])
    if out.get("title") is None and isinstance(out.get("contents"), str):
        title = flashrag_title(out["contents"])
        if title is not None:
            out["title"] = title
    return out


def flashrag_title(contents: str) -> str | None:
    """The title of a passage in FlashRAG's (wiki-18's) `"Title"\\ntext` layout, else None."""
    head, sep, _ = contents.partition("\n")
    if sep and head.startswith('"') and head.endswith('"') and len(head) > 2:
        return head.strip('"')
    return None


def _row_error(source: str | Path, rowno: int, exc: ValidationError) -> DataError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "<row>"
    return DataError(f"{source}: row {rowno}: field {field!r}: {first['msg']}")


def _iter_valid(source: str | Path, model: type[T], normalise: Any) -> Iterator[T]:
    """Rows of `source` as `model`, in file order; the first invalid row raises DataError."""
    for rowno, raw in _iter_raw_rows(source):
        try:
            yield model.model_validate(normalise(raw))
        except ValidationError as exc:
            raise _row_error(source, rowno, exc) from exc


def _validate_rows(source: str | Path, model: type[T], normalise: Any) -> list[T]:
    return list(_iter_valid(source, model, normalise))


def read_qa(source: str | Path) -> list[QAExample]:
    """Read QA records; a row without question or gold answer raises DataError naming file/row."""
    return _validate_rows(source, QAExample, _normalise_qa)


def read_raw_qa_rows(source: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """Raw normalised rows with row numbers, for validation that must quarantine, not raise.

    A line that is not a JSON object raises DataError; `read_raw_qa_rows_lenient` returns it.
    """
    return [(rowno, _normalise_qa(raw)) for rowno, raw in _iter_raw_rows(source)]


def read_raw_qa_rows_lenient(source: str | Path
                             ) -> tuple[list[tuple[int, dict[str, Any]]], list[BadRow]]:
    """As `read_raw_qa_rows`, but lines that are not JSON objects come back as BadRows for
    the caller to quarantine: one truncated line must not stop validation of the other
    100,000. rows + bad rows = every non-blank line read.

    Raises DataError (one line, naming the file) when the file is unreadable as a whole:
    missing, unknown format, unreadable parquet / JSON, or not one line a JSON object.
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    bad: list[BadRow] = []
    for item in _iter_rows(source):
        if isinstance(item, BadRow):
            bad.append(item)
        else:
            rows.append((item[0], _normalise_qa(item[1])))
    if bad and not rows:
        raise DataError(f"{source}: not JSONL: none of its {len(bad)} lines is a JSON object "
                        f"(line {bad[0].line}: {bad[0].error})")
    return rows, bad


def read_passages(source: str | Path) -> list[Passage]:
    return _validate_rows(source, Passage, _normalise_passage)


def iter_passage_chunks(source: str | Path, size: int) -> Iterator[list[Passage]]:
    """`read_passages` in chunks of `size` passages, in file order, for a corpus too large to
    hold (a JSONL file is read line by line); the first unreadable line or invalid row raises
    the DataError `read_passages` raises, after the chunks before it."""
    chunk: list[Passage] = []
    for passage in _iter_valid(source, Passage, _normalise_passage):
        chunk.append(passage)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def passage_id_at(path: Path, rows: set[int]) -> dict[int, str]:
    """The id of each of `rows` (0-based) of a passages file with one passage a line (as this
    module writes them), read again: what a streamed check looks up at its end."""
    out: dict[int, str] = {}
    with path.open("rb") as fh:
        for i, line in enumerate(fh):
            if i in rows:
                out[i] = str(_normalise_passage(json.loads(line))["id"])
    return out


# --- writing with manifests


def content_sha256(path: Path) -> str:
    """sha256 of the file's bytes, read now (checkpoint verification wants exactly this)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def known_sha256(path: Path) -> str:
    """`content_sha256`, not read again in this process while the file's path, size,
    modification time and inode are unchanged. Fingerprints are asked for many times per
    pipeline run (every stage's cache key re-checks its inputs' files, policies and indexes
    of gigabytes among them); a rewrite changes the inode (atomic rename) or the mtime."""
    stat = path.stat()
    return _sha256_for_stat(str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)


@lru_cache(maxsize=4096)
def _sha256_for_stat(path: str, size: int, mtime_ns: int, inode: int) -> str:
    return content_sha256(Path(path))


# A directory's manifest (an index component's) lives inside it, written last.
DIR_MANIFEST = "manifest.json"


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name + ".manifest.json")


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and rename: never a half-written file."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory and rename: never a half-written file."""
    with atomic_writer(path) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[IO[bytes]]:
    """A binary file to stream into; it becomes `path` (temp file in the same directory,
    fsync, rename) only when the block ends without an exception, else it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; artifacts are shared, so give them the umask's usual mode.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- directories: publish a complete one in place of the old, readers never see none

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


@lru_cache(maxsize=1)
def _renameat2() -> Any:
    """libc's renameat2, or None (not Linux, or a libc without it)."""
    if sys.platform != "linux":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False
    where the libc, kernel or filesystem cannot, so the caller falls back."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def publish_dir(tmp: Path, final: Path) -> None:
    """Put the complete directory `tmp` at `final` (a sibling path), replacing what is there.

    A reader of `final` sees the old directory or the new one, never none: the two are
    exchanged in one step where the filesystem can (`exchange_paths`); elsewhere the old one
    is renamed aside, the new one in, and the old one put back if that rename fails. The old
    copy is removed afterwards, and so are old copies a killed publish left
    (`.<name>.old-*`); the caller's own temp dirs are the caller's to clean.
    """
    tmp, final = Path(tmp), Path(final)
    if not tmp.is_dir():
        raise FileNotFoundError(f"{tmp}: no directory to publish at {final}")
    for stale in final.parent.glob(f".{final.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if not final.exists():
        os.rename(tmp, final)
    elif exchange_paths(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old content
    else:
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:
            os.rename(old, final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(final.parent)


def _fsync_dir(directory: Path) -> None:
    """Make renames in `directory` survive a crash (where the filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_jsonl(path: str | Path, records: Sequence[BaseModel | dict[str, Any]]) -> str:
    """Write records as JSONL plus `<file>.manifest.json`; return the content sha256.

    The manifest is written last, so a file without a manifest is never taken as complete.
    """
    path = Path(path)
    manifest_path(path).unlink(missing_ok=True)
    lines = [
        json.dumps(r.model_dump(mode="json") if isinstance(r, BaseModel) else r,
                   ensure_ascii=False, sort_keys=True)
        for r in records
    ]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    sha = content_sha256(path)
    write_manifest(path, len(lines), sha)
    return sha


def write_manifest(path: Path, rows: int, sha: str) -> None:
    """`<file>.manifest.json` for a complete `path` of `rows` rows and content sha256 `sha`."""
    manifest = {"file": path.name, "rows": rows, "sha256": sha}
    atomic_write_text(manifest_path(path), json.dumps(manifest, indent=2))


def passage_line(passage: Passage) -> str:
    """`passage` as `write_jsonl` writes it (same bytes: sorted keys, `json.dumps` spacing,
    non-ASCII as is), without the model dump and the general encoder: a wiki-scale copy
    spends seconds per million passages on those."""
    title = "null" if passage.title is None else _encode_str(passage.title)
    return (f'{{"contents": {_encode_str(passage.contents)}, "id": {_encode_str(passage.id)}, '
            f'"title": {title}}}\n')


def read_manifest(path: str | Path, *, directory: bool = False) -> dict[str, Any] | None:
    """The manifest that marks `path` complete, else None (absent, unreadable or stale).

    A file's manifest is `<file>.manifest.json` and must still match the file's content. A
    directory's (`directory=True`) is `<dir>/DIR_MANIFEST`; it is written last, so its presence
    is the completeness mark (re-hashing an index on every read would cost a build).
    """
    path = Path(path)
    mpath = path / DIR_MANIFEST if directory else manifest_path(path)
    try:
        manifest: dict[str, Any] = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError):  # a torn or missing manifest is no manifest
        return None
    if not directory and not (path.is_file() and manifest.get("sha256") == known_sha256(path)):
        return None
    return manifest


def fingerprint(path: str | Path) -> str:
    """Content fingerprint of a dataset file (from a valid manifest, else hashed now)."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is not None:
        return str(manifest["sha256"])
    if path.is_dir():
        digest = hashlib.sha256()
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(child.relative_to(path)).encode())
            digest.update(known_sha256(child).encode())
        return digest.hexdigest()
    if not path.exists():
        raise DataError(f"{path}: file not found")
    return known_sha256(path)


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a subprocess's log, as a person reads them in an error
    message: tqdm's carriage-return redraws collapsed to their last state."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
    return "\n".join(kept[-lines:]) or "(empty log)"


def records_fingerprint(records: Iterable[BaseModel]) -> str:
    """sha256 of the records' content in order (every field: gold answers and passage text,
    not just ids), for keys of results built from them: a corrected label changes it."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(record.model_dump_json().encode())
        digest.update(b"\n")
    return digest.hexdigest()
