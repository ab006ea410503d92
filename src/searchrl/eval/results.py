"""What an evaluation leaves behind and the gate and the report read: per-system results,
extra eval sets' summaries and the audits (`EvalResult`, as `results.json`), and the readers
of `results.json` and of the per-question files."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.eval.baselines import SystemSpec
from searchrl.eval.metrics import Interval, QuestionResult, Summary

RESULTS_FILE = "results.json"
# The layout of results.json: bump it when `EvalResult.to_dict` changes so that another
# release's file would be misread. A file without the stamp was written before it, in layout 1.
RESULTS_FORMAT = 1
READABLE_RESULTS_FORMATS = frozenset({1})


class EvalResultsError(RuntimeError):
    """A results.json this release does not read (another release's layout): names the file
    and the stage to re-run."""


@dataclass(frozen=True)
class SystemResult:
    spec: SystemSpec
    summary: Summary
    by_hops: dict[str, Summary]
    by_type: dict[str, Summary]
    by_searched: dict[str, Summary]
    questions_path: str
    trajectories_path: str
    seconds: float
    # Tercile of the first search's top-1 retriever score (cuts in EvalResult.confidence_cuts).
    by_confidence: dict[str, Summary] = field(default_factory=dict)
    # Why the system did not answer every question (its request budget ran out); None: did.
    incomplete: str | None = None
    # Per named slice (QAExample.slices; overlapping: a question counts in each of its own).
    by_slice: dict[str, Summary] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditSummary:
    """One audit's suspect file and how many rows each tier holds, over `n_questions`
    questions of `split` rolled out by `systems`."""

    path: str
    split: str
    n_questions: int
    systems: tuple[str, ...]
    tiers: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "split": self.split, "n_questions": self.n_questions,
                "systems": list(self.systems), "tiers": dict(self.tiers)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AuditSummary:
        return cls(path=d["path"], split=d["split"], n_questions=int(d["n_questions"]),
                   systems=tuple(d["systems"]), tiers={k: int(v) for k, v in d["tiers"].items()})


def _interval_from(d: Mapping[str, Any]) -> Interval:
    return Interval(float(d["mean"]), float(d["lo"]), float(d["hi"]), int(d["n"]),
                    float(d.get("level", 0.95)))


def summary_from_dict(d: Mapping[str, Any]) -> Summary:
    """Inverse of `Summary.to_dict` (JSON turns NaN into NaN, so round trips are exact)."""
    rest = {k: v for k, v in d.items() if k not in ("em", "f1")}
    return Summary(em=_interval_from(d["em"]), f1=_interval_from(d["f1"]), **rest)


@dataclass(frozen=True)
class SetResult:
    """Every system on one extra eval set, searched in that set's own corpus; the full
    per-set EvalResult (breakdowns, audit) is in `results_path`."""

    name: str
    n_questions: int
    systems: dict[str, Summary]
    deltas: dict[str, Interval]
    results_path: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n_questions": self.n_questions,
                "systems": {n: s.to_dict() for n, s in self.systems.items()},
                "deltas": {k: v.to_dict() for k, v in self.deltas.items()},
                "results_path": self.results_path}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SetResult:
        return cls(name=d["name"], n_questions=int(d["n_questions"]),
                   systems={n: summary_from_dict(s) for n, s in d["systems"].items()},
                   deltas={k: _interval_from(v) for k, v in d["deltas"].items()},
                   results_path=d["results_path"])


@dataclass(frozen=True)
class EvalResult:
    """What the gate and the report read: per-system summaries and paired EM deltas of the
    trained policy against each baseline (on the questions both answered), on the main eval
    split; `extra_sets` holds the same systems on each extra eval set (name -> SetResult)."""

    eval_set: str
    n_questions: int
    systems: dict[str, SystemResult]
    deltas: dict[str, Interval]
    suspects_path: str
    n_suspects: int
    notes: tuple[str, ...] = ()
    level: float = 0.95
    extra_sets: dict[str, SetResult] = field(default_factory=dict)
    # The audit of the eval questions (per tier) and of sampled train questions (None: off).
    audit: AuditSummary | None = None
    train_audit: AuditSummary | None = None
    confidence_cuts: tuple[float, float] | None = None
    # Which checkpoint of the training run `trained` is (`policy_selection`), for the report.
    policy_selection: dict[str, Any] = field(default_factory=dict)
    # The world card: what each named slice of these questions tests (slice -> description),
    # as the world that made them says (`known_slice_card`); {}: none recorded.
    slice_card: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "eval_set": self.eval_set, "n_questions": self.n_questions, "level": self.level,
            "systems": {n: {"name": s.spec.name, "policy": s.spec.policy, "mode": s.spec.mode,
                            "description": s.spec.description,
                            "summary": s.summary.to_dict(),
                            "by_hops": {k: v.to_dict() for k, v in s.by_hops.items()},
                            "by_type": {k: v.to_dict() for k, v in s.by_type.items()},
                            "by_searched": {k: v.to_dict() for k, v in s.by_searched.items()},
                            "by_confidence": {k: v.to_dict()
                                              for k, v in s.by_confidence.items()},
                            "by_slice": {k: v.to_dict() for k, v in s.by_slice.items()},
                            "questions_path": s.questions_path,
                            "trajectories_path": s.trajectories_path, "seconds": s.seconds,
                            "incomplete": s.incomplete}
                        for n, s in self.systems.items()},
            "deltas": {k: v.to_dict() for k, v in self.deltas.items()},
            "suspects_path": self.suspects_path, "n_suspects": self.n_suspects,
            "notes": list(self.notes),
            "extra_sets": {k: v.to_dict() for k, v in self.extra_sets.items()},
            "audit": self.audit.to_dict() if self.audit else None,
            "train_audit": self.train_audit.to_dict() if self.train_audit else None,
            "confidence_cuts": list(self.confidence_cuts) if self.confidence_cuts else None,
            "policy_selection": dict(self.policy_selection),
            "slice_card": dict(self.slice_card),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
        systems = {}
        for name, s in d["systems"].items():
            spec = SystemSpec(s["name"], s["policy"], s["mode"], s["description"])
            systems[name] = SystemResult(
                spec=spec, summary=summary_from_dict(s["summary"]),
                by_hops={k: summary_from_dict(v) for k, v in s["by_hops"].items()},
                by_type={k: summary_from_dict(v) for k, v in s["by_type"].items()},
                by_searched={k: summary_from_dict(v) for k, v in s["by_searched"].items()},
                by_confidence={k: summary_from_dict(v)
                               for k, v in s.get("by_confidence", {}).items()},
                questions_path=s["questions_path"], trajectories_path=s["trajectories_path"],
                seconds=float(s["seconds"]), incomplete=s.get("incomplete"),
                by_slice={k: summary_from_dict(v) for k, v in s.get("by_slice", {}).items()})
        return cls(eval_set=d["eval_set"], n_questions=int(d["n_questions"]), systems=systems,
                   deltas={k: _interval_from(v) for k, v in d["deltas"].items()},
                   suspects_path=d["suspects_path"], n_suspects=int(d["n_suspects"]),
                   notes=tuple(d.get("notes", ())), level=float(d.get("level", 0.95)),
                   extra_sets={k: SetResult.from_dict(v)
                               for k, v in d.get("extra_sets", {}).items()},
                   audit=AuditSummary.from_dict(d["audit"]) if d.get("audit") else None,
                   train_audit=(AuditSummary.from_dict(d["train_audit"])
                                if d.get("train_audit") else None),
                   confidence_cuts=((float(d["confidence_cuts"][0]),
                                     float(d["confidence_cuts"][1]))
                                    if d.get("confidence_cuts") else None),
                   policy_selection=dict(d.get("policy_selection") or {}),
                   slice_card={str(k): str(v)
                               for k, v in (d.get("slice_card") or {}).items()})

    def set_result(self, name: str, results_path: str) -> SetResult:
        """This (one extra set's) evaluation reduced to what the main results.json keeps."""
        return SetResult(name=name, n_questions=self.n_questions,
                         systems={n: s.summary for n, s in self.systems.items()},
                         deltas=dict(self.deltas), results_path=results_path)


def known_slice_card(names: Iterable[str]) -> dict[str, str]:
    """What each of `names` tests, from the world module's `SLICE_CARD`
    (`searchrl.datasets.reading_world`); names it does not describe, or every name when that
    module or its card is missing, are left out (the report says "not described")."""
    try:  # by name: optional (a world without named slices has no card)
        reading_world = importlib.import_module("searchrl.datasets.reading_world")
    except ImportError:
        return {}
    card = getattr(reading_world, "SLICE_CARD", None)
    if not isinstance(card, Mapping):
        return {}
    return {n: str(card[n]) for n in names if n in card}


def eval_result_json(result: EvalResult) -> str:
    """results.json's text: the result stamped with its layout."""
    return json.dumps({"format_version": RESULTS_FORMAT, **result.to_dict()}, indent=2)


def load_eval_result(path: str | Path) -> EvalResult:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no evaluation results; run the evaluate_policy stage")
    rerun = "re-run the evaluate_policy stage (`python -m searchrl evaluate`) with this release"
    data = json.loads(path.read_text())
    stamp = data.pop("format_version", 1) if isinstance(data, dict) else None
    if stamp not in READABLE_RESULTS_FORMATS:
        raise EvalResultsError(f"{path}: results format {stamp!r}, this release reads "
                               f"{sorted(READABLE_RESULTS_FORMATS)}; {rerun}")
    try:
        return EvalResult.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EvalResultsError(f"{path}: not evaluation results this release reads "
                               f"({type(exc).__name__}: {exc}); {rerun}") from exc


def read_question_results(path: str | Path) -> list[QuestionResult]:
    with Path(path).open(encoding="utf-8") as fh:
        return [QuestionResult.from_dict(json.loads(line)) for line in fh if line.strip()]
