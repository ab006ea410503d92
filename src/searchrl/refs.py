"""Stage references on disk: reading, writing and locking them.

A stage removes its `ref.json` first (`begin`) and writes it last (`finish`): a stage
directory with a `ref.json` is complete, and the CLI reads a stage's inputs from its upstream
stages' `ref.json` (`read_ref`). Every reference lists the files it stands for with their
fingerprints (`files_of`), so a cached reference is reused only while those files exist
unchanged (`ref_is_current`), and a stage reads only what its own upstream wrote: it checks
its input references' files before it reads them and again before it publishes
(`check_inputs`), so a run whose inputs another run on the same work dir replaced fails naming
them instead of deciding on that run's numbers.

Below the stages (`stages.py`, `train/stage.py`): it knows the reference types and which stage
makes each (`PRODUCERS`), never a stage function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from searchrl.datasets.io import DataError, atomic_write_text, fingerprint, publish_dir
from searchrl.locks import held
from searchrl.types import (
    CheckpointRef,
    CurriculumRef,
    DatasetRef,
    Decision,
    EvalRef,
    IndexRef,
    StageRef,
)

REF_FILE = "ref.json"
R = TypeVar("R", bound=StageRef)

# The stage that makes each reference type (stages.STAGES' output kinds; a test keeps them
# equal): what an error about a replaced input names to re-run.
PRODUCERS: dict[type, str] = {
    DatasetRef: "validate_gold_labels", IndexRef: "build_index",
    CurriculumRef: "filter_curriculum", CheckpointRef: "train_policy",
    EvalRef: "evaluate_policy", Decision: "decide_go_no_go"}


class StageInputError(RuntimeError):
    """A stage's input is missing or stale; names what to run first."""


class ReplacedInputError(StageInputError):
    """A file an input reference vouches for is no longer what its stage wrote for this run:
    another run on the same work dir (or a hand edit) replaced it since."""


def files_of(*paths: str | Path | None) -> dict[str, str]:
    """path -> content fingerprint, for a reference's `files`."""
    return {str(p): fingerprint(p) for p in paths if p is not None}


def ref_is_current(ref: object) -> bool:
    """True when every file the reference stands for exists with the recorded fingerprint."""
    files = getattr(ref, "files", None)
    return isinstance(files, dict) and bool(files) and next(_changed(ref), None) is None


def changed_files(ref: object) -> list[str]:
    """The files `ref` vouches for that are gone or hold other content than it recorded."""
    return list(_changed(ref))


def _changed(ref: object) -> Iterator[str]:
    """`ref`'s files that are gone, unreadable or hold other content, lazily (a cache check
    stops at the first)."""
    files = getattr(ref, "files", None)
    for path, fp in (files.items() if isinstance(files, dict) else ()):
        try:
            same = Path(path).exists() and fingerprint(path) == fp
        except (OSError, DataError):
            same = False
        if not same:
            yield path


def check_inputs(stage: str, *inputs: StageRef | None) -> None:
    """A run reads only its own results: every file the stage's input references vouch for
    must still be what their stages wrote for this run, else ReplacedInputError naming it.

    Stage dirs are shared by every run on a work dir (one layout, so the CLI, resume and
    retention find them); a run with other inputs rewrites them, e.g. between this run's
    evaluate and its gate. A stage calls this before it reads its inputs and again before
    its result becomes visible (its ref.json, a registration): a replacement while it ran is
    caught too. A reference without `files` (built by hand) vouches for nothing to check."""
    for ref in inputs:
        changed = changed_files(ref) if ref is not None else []
        if changed:
            made_by = PRODUCERS.get(type(ref), "its stage")
            raise ReplacedInputError(
                f"{stage}: {', '.join(changed)} changed after {made_by} wrote it for this run "
                "(another run on this work dir replaced it, or it was edited); a stage reads "
                f"only what its own upstream wrote. Re-run the pipeline (the re-run recomputes "
                f"{made_by} and what follows it); give runs that may overlap their own "
                "run.work_dir")


# The layout of ref.json (its fields and what they mean): bump it when a reference type
# changes so that an older or newer file would be misread. A ref.json without the stamp was
# written before it, in layout 1. A layout this release does not read is a stage to re-run,
# never a guess (the Prefect cache needs no stamp: its key holds the code of searchrl.types).
REF_FORMAT = 1
READABLE_REF_FORMATS = frozenset({1})
_FORMAT_KEY = "format_version"


def write_ref(ref: StageRef, stage_dir: Path) -> None:
    atomic_write_text(stage_dir / REF_FILE, json.dumps(
        {_FORMAT_KEY: REF_FORMAT, **dataclasses.asdict(ref)}, indent=2))


def read_ref(kind: type[R], stage_dir: Path, stage_cli: str) -> R:
    """The reference a finished stage left in `stage_dir`, checked against the disk: a
    StageInputError naming the file and the stage to re-run when it is missing, stale, or
    written in a layout this release does not read."""
    path = stage_dir / REF_FILE
    if not path.is_file():
        raise StageInputError(f"{path} not found: run `python -m searchrl {stage_cli}` first")
    rerun = f"re-run `python -m searchrl {stage_cli}` (it recomputes the stage with this release)"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StageInputError(f"{path}: unreadable ({exc}); {rerun}") from exc
    stamp = data.pop(_FORMAT_KEY, 1) if isinstance(data, dict) else None
    if stamp not in READABLE_REF_FORMATS:
        raise StageInputError(f"{path}: reference format {stamp!r}, this release reads "
                              f"{sorted(READABLE_REF_FORMATS)}; {rerun}")
    try:
        if kind is Decision:
            data["reasons"] = tuple(data["reasons"])
        ref = kind(**data)
    except (TypeError, KeyError) as exc:  # fields added, renamed or removed since
        raise StageInputError(f"{path}: not a {kind.__name__} this release reads ({exc}); "
                              f"{rerun}") from exc
    if not ref_is_current(ref):
        raise StageInputError(f"{path}: the files it references changed or are gone; "
                              f"re-run `python -m searchrl {stage_cli}`")
    return ref


def begin(stage_dir: Path) -> None:
    """The stage starts: its dir exists and holds no ref.json (it is not complete)."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / REF_FILE).unlink(missing_ok=True)


def begin_fresh(stage_dir: Path) -> None:
    """An empty `stage_dir`: what an earlier run left (another config's systems, a champion,
    report files) is neither this run's output nor its artifact. The old directory goes in
    one exchange (`publish_dir` of an empty one); the stage then writes in place, as its
    results record their absolute paths, and its ref.json, written last, marks it complete."""
    stage_dir.parent.mkdir(parents=True, exist_ok=True)
    publish_dir(Path(tempfile.mkdtemp(prefix=f".{stage_dir.name}.new-", dir=stage_dir.parent)),
                stage_dir)


def stage_dir_lock(stage_dir: Path) -> contextlib.AbstractContextManager[Path]:
    """One run at a time in a stage dir: a stage clears or rewrites its dir (evaluate and gate
    replace it whole, validation drops its earlier outputs' manifests, the index build its
    temp dirs), so a concurrent manual run would wipe or mix this one's files (training holds
    its checkpoint dir's lock instead). BusyError naming the holder."""
    return held(stage_dir, busy=f"another run of this stage writes into {stage_dir} (and "
                                "clears or rewrites it)")


def finish(ref: R, stage_dir: Path, inputs: tuple[StageRef | None, ...] = ()) -> R:
    """Write the stage's ref.json (its completion mark), once its inputs are checked again:
    a result computed while another run replaced them is not published."""
    check_inputs(stage_dir.name, *inputs)
    write_ref(ref, stage_dir)
    return ref
