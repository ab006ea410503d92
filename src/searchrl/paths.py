"""Where each stage keeps its outputs under `run.work_dir`, so stages and CLIs agree on layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StagePaths:
    """Stage directories under the work dir, made absolute: references passed between stages
    (and cached across processes) must not depend on the working directory."""

    work_dir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "work_dir", Path(self.work_dir).resolve())

    @property
    def source_dir(self) -> Path:
        """Raw inputs as materialised (synthetic world written, files normalised)."""
        return self.work_dir / "source"

    @property
    def validate_dir(self) -> Path:
        return self.work_dir / "validate_gold_labels"

    @property
    def index_dir(self) -> Path:
        return self.work_dir / "build_index"

    @property
    def curriculum_dir(self) -> Path:
        return self.work_dir / "filter_curriculum"

    @property
    def train_dir(self) -> Path:
        return self.work_dir / "train_policy"

    @property
    def eval_dir(self) -> Path:
        return self.work_dir / "evaluate_policy"

    @property
    def gate_dir(self) -> Path:
        return self.work_dir / "decide_go_no_go"


_SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def safe_filename(name: str) -> str:
    """A file name derived from data, config or a request, made safe to join to a directory.

    Anything outside [A-Za-z0-9._-] becomes '_' and leading dots are stripped, so '../x',
    '/etc/passwd' or 'a/b' can never escape the directory or create subdirectories.
    """
    cleaned = "".join(c if c in _SAFE_CHARS else "_" for c in name).lstrip(".")
    if not cleaned:
        raise ValueError(f"{name!r} gives an empty file name")
    return cleaned[:128]


def plain_name_problem(name: str) -> str | None:
    """Why a name the config gives a data set cannot name its files as it stands, else None.

    The rule is `safe_filename`'s, kept strict: the name must be what safe_filename makes of
    it (so two names never share a file, and none leaves its directory) and have no '.' (a
    `key.sub=value` override splits on dots, and a stage's own files have dotted names)."""
    try:
        safe = safe_filename(name)
    except ValueError:
        return "is empty"
    if safe != name or "." in name:
        return ("is not a plain name: use letters, digits, '-' and '_' (at most 128), e.g. "
                f"{safe.replace('.', '_')!r}")
    return None
