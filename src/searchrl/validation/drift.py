"""Gold-set drift: what changed between the gold set the champion was trained on and this one.

Each successful validation writes a compact digest of what it passed (`GoldDigest`):

    qa.json            per QA set: id -> [question sha, answers sha, hops, type, answer chars]
    corpus_<name>.npz  per corpus: sorted 64-bit id hashes and content hashes (16 bytes a
                       passage: a 21M-passage corpus is ~340 MB, compared with numpy)
    meta.json          the data fingerprints and when it was written

to `<validate dir>/gold_digest/`, and keeps a copy as `<work dir>/history/gold_digest/last/`.
On GO the gate copies the evaluated dataset's digest to `history/gold_digest/champion/`. The
next validation compares itself with the champion's digest (else the last one): rows added,
removed, changed (question or answers; answer changes counted apart), hop and type mix, answer
lengths, passages added, removed and changed. A set whose changed share (added + removed +
changed over the reference's size) passes `validate.drift_warn_fraction` is a warning in the
audit report and in the `drift_warnings` metric; drift never fails the stage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from searchrl.datasets.io import atomic_write_text
from searchrl.paths import StagePaths, safe_filename
from searchrl.types import Passage, QAExample

DIGEST_DIR = "gold_digest"
QA_FILE, META_FILE = "qa.json", "meta.json"
# The digest's layout and hashes (meta.json `format`; none: written before the stamp, 1).
# A kept digest of another format is not compared with (its hashes would all differ: every
# row "changed"); the drift report resumes once this release has written one.
DIGEST_FORMAT = 1

log = logging.getLogger(__name__)


def history_dir(work_dir: Path) -> Path:
    """Digests kept across runs: `last/` (the last validated set), `champion/` (on GO)."""
    return StagePaths(work_dir).work_dir / "history" / DIGEST_DIR


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _h16(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


def qa_row_digest(ex: QAExample) -> list[Any]:
    return [_h16(ex.question), _h16("\x1f".join(ex.golden_answers)), ex.hops, ex.type,
            [len(a) for a in ex.golden_answers]]


class CorpusDigest:
    """Passage id and content hashes of one corpus, gathered chunk by chunk as it streams."""

    def __init__(self) -> None:
        self._ids: list[np.ndarray] = []
        self._content: list[np.ndarray] = []

    def add(self, passages: list[Passage]) -> None:
        # 8-byte digests joined and read as little-endian uint64 (= _h64, one call less each)
        b2 = hashlib.blake2b
        ids = b"".join(b2(p.id.encode(), digest_size=8).digest() for p in passages)
        content = b"".join(b2(f"{p.title}\n{p.contents}".encode(), digest_size=8).digest()
                           for p in passages)
        self._ids.append(np.frombuffer(ids, dtype="<u8").astype(np.uint64))
        self._content.append(np.frombuffer(content, dtype="<u8").astype(np.uint64))

    def extend(self, other: CorpusDigest) -> None:
        """The chunks `other` gathered (a corpus check worker's), after these."""
        self._ids += other._ids
        self._content += other._content

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.uint64)
        content = np.concatenate(self._content) if self._content else np.zeros(0, np.uint64)
        order = np.argsort(ids, kind="stable")
        return ids[order], content[order]


@dataclass
class GoldDigest:
    qa: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    corpora: dict[str, CorpusDigest] = field(default_factory=dict)

    def corpus(self, name: str) -> CorpusDigest:
        return self.corpora.setdefault(name, CorpusDigest())

    def add_qa(self, name: str, rows: list[QAExample]) -> None:
        self.qa[name] = {ex.id: qa_row_digest(ex) for ex in rows}

    def write(self, out_dir: Path, meta: dict[str, Any]) -> Path:
        """The digest as `out_dir` (replaced whole)."""
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        atomic_write_text(out_dir / QA_FILE, json.dumps(self.qa, separators=(",", ":")))
        for name, digest in self.corpora.items():
            ids, content = digest.arrays()
            np.savez(out_dir / f"corpus_{safe_filename(name)}.npz", ids=ids, content=content,
                     name=np.array(name))
        atomic_write_text(out_dir / META_FILE, json.dumps(
            meta | {"written_at": datetime.now(UTC).isoformat(), "format": DIGEST_FORMAT},
            indent=1, default=str))
        return out_dir


def keep_digest(src: Path, dest: Path) -> None:
    """Copy a digest directory to `dest` (replacing it) through a sibling temp dir."""
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def reference_digest(work_dir: Path) -> tuple[str, Path] | None:
    """(`champion` or `last`, its dir): the champion's digest when there is one in this
    release's format, else the last one's; None when neither is."""
    base = history_dir(work_dir)
    for kind in ("champion", "last"):
        meta = base / kind / META_FILE
        if not meta.is_file():
            continue
        try:
            stamp = json.loads(meta.read_text()).get("format", 1)
        except (OSError, ValueError, AttributeError):
            stamp = None
        if stamp == DIGEST_FORMAT:
            return kind, base / kind
        log.warning("%s: gold digest format %r, this release compares %d: no drift measured "
                    "against it (the next validations are)", meta, stamp, DIGEST_FORMAT)
    return None


# --- comparison


@dataclass(frozen=True)
class SetDrift:
    name: str
    kind: str  # qa | corpus
    old: int
    new: int
    added: int
    removed: int
    changed: int  # same id, other content (QA: question or answers)
    answers_changed: int = 0

    @property
    def fraction(self) -> float:
        return (self.added + self.removed + self.changed) / max(self.old, 1)


@dataclass
class DriftReport:
    reference: str  # e.g. "champion (…/history/gold_digest/champion, written …)"
    warn_fraction: float
    sets: list[SetDrift] = field(default_factory=list)
    hop_mix: dict[str, tuple[dict[str, float], dict[str, float]]] = field(default_factory=dict)
    type_mix: dict[str, tuple[dict[str, float], dict[str, float]]] = field(default_factory=dict)
    answer_chars: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        return [f"{s.kind} {s.name!r}: {s.fraction:.1%} of the reference's {s.old} rows added, "
                f"removed or changed (+{s.added} -{s.removed} ~{s.changed}), above "
                f"validate.drift_warn_fraction={self.warn_fraction}"
                for s in self.sets if s.fraction > self.warn_fraction]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"drift_warnings": float(len(self.warnings)),
                                 "drift_max_fraction": max((s.fraction for s in self.sets),
                                                           default=0.0)}
        for s in self.sets:
            key = f"drift.{s.kind}.{safe_filename(s.name)}"
            out |= {f"{key}.added": s.added, f"{key}.removed": s.removed,
                    f"{key}.changed": s.changed, f"{key}.fraction": s.fraction}
            if s.kind == "qa":
                out[f"{key}.answers_changed"] = s.answers_changed
        for name, (old, new) in self.answer_chars.items():
            out[f"drift.qa.{safe_filename(name)}.answer_chars_delta"] = new - old
        return out


def _mix(rows: dict[str, list[Any]], col: int) -> dict[str, float]:
    counts = Counter(str(r[col]) for r in rows.values())
    n = max(len(rows), 1)
    return {k: counts[k] / n for k in sorted(counts)}


def _mean_answer_chars(rows: dict[str, list[Any]]) -> float:
    lengths = [n for r in rows.values() for n in r[4]]
    return sum(lengths) / len(lengths) if lengths else 0.0


def _qa_drift(name: str, old: dict[str, list[Any]], new: dict[str, list[Any]]) -> SetDrift:
    common = old.keys() & new.keys()
    changed = [k for k in common if old[k][:2] != new[k][:2]]
    return SetDrift(name, "qa", len(old), len(new), len(new.keys() - old.keys()),
                    len(old.keys() - new.keys()), len(changed),
                    sum(1 for k in changed if old[k][1] != new[k][1]))


def _corpus_drift(name: str, old: tuple[np.ndarray, np.ndarray],
                  new: tuple[np.ndarray, np.ndarray]) -> SetDrift:
    _, i_old, i_new = np.intersect1d(old[0], new[0], assume_unique=True, return_indices=True)
    changed = int(np.count_nonzero(old[1][i_old] != new[1][i_new]))
    return SetDrift(name, "corpus", len(old[0]), len(new[0]), len(new[0]) - len(i_new),
                    len(old[0]) - len(i_old), changed)


def _load_corpora(ref_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in sorted(ref_dir.glob("corpus_*.npz")):
        with np.load(path) as z:
            out[str(z["name"])] = (z["ids"], z["content"])
    return out


def compare(new: GoldDigest, ref_kind: str, ref_dir: Path, warn_fraction: float
            ) -> DriftReport:
    """Drift of `new` against the digest in `ref_dir` (sets in only one side: all added or
    all removed)."""
    old_qa: dict[str, dict[str, list[Any]]] = json.loads((ref_dir / QA_FILE).read_text())
    meta = json.loads((ref_dir / META_FILE).read_text())
    report = DriftReport(f"{ref_kind} ({ref_dir}, written {meta.get('written_at', '?')})",
                         warn_fraction)
    for name in sorted(old_qa.keys() | new.qa.keys()):
        old, cur = old_qa.get(name, {}), new.qa.get(name, {})
        report.sets.append(_qa_drift(name, old, cur))
        report.hop_mix[name] = (_mix(old, 2), _mix(cur, 2))
        report.type_mix[name] = (_mix(old, 3), _mix(cur, 3))
        report.answer_chars[name] = (_mean_answer_chars(old), _mean_answer_chars(cur))
    old_corpora = _load_corpora(ref_dir)
    new_corpora = {n: d.arrays() for n, d in new.corpora.items()}
    empty = (np.zeros(0, np.uint64), np.zeros(0, np.uint64))
    for name in sorted(old_corpora.keys() | new_corpora.keys()):
        report.sets.append(_corpus_drift(name, old_corpora.get(name, empty),
                                         new_corpora.get(name, empty)))
    return report


# --- report sections (the audit report's "Drift" section)


def _mix_text(mix: dict[str, float]) -> str:
    return ", ".join(f"{k}: {v:.0%}" for k, v in mix.items()) or "-"


def drift_rows(drift: DriftReport) -> list[list[str]]:
    return [[s.kind, s.name, str(s.old), str(s.new), str(s.added), str(s.removed),
             str(s.changed), str(s.answers_changed) if s.kind == "qa" else "-",
             f"{s.fraction:.1%}" + (" WARN" if s.fraction > drift.warn_fraction else "")]
            for s in drift.sets]


DRIFT_HEADER = ["kind", "set", "reference rows", "rows now", "added", "removed", "changed",
                "answers changed", "changed share"]
MIX_HEADER = ["set", "hops (reference -> now)", "type (reference -> now)",
              "mean answer chars"]


def mix_rows(drift: DriftReport) -> list[list[str]]:
    return [[name, f"{_mix_text(old)} -> {_mix_text(new)}",
             f"{_mix_text(drift.type_mix[name][0])} -> {_mix_text(drift.type_mix[name][1])}",
             f"{drift.answer_chars[name][0]:.1f} -> {drift.answer_chars[name][1]:.1f}"]
            for name, (old, new) in drift.hop_mix.items()]
