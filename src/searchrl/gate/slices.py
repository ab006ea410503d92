"""Slices the gate looks at: per question type, per hop count and per named slice (the
questions' `slices`: unseen_phrasing, answer_novel, comparison, ...; they overlap), the
trained policy's EM and its paired EM delta against the comparator (and the registry's
champion when it was evaluated on the same questions), with bootstrap intervals. Pure:
per-question results in.

A slice is a `regression` against a system when the delta's upper bound is below zero on at
least `min_questions` paired questions (fewer: "too few", reported, never flagged), and is
`zero` when the trained policy answers none of its questions. An aggregate EM can clear the
gate while one kind of question collapses; `gate.slice_regression` says whether that only
warns (the report marks it) or fails the gate.

A slice is a `win` against a system only when the delta's lower bound is above zero on at
least `claim_min_questions` questions (`gate.slice_claim_min_questions`): a smaller slice is
"too few to claim" and is never shown as a win, whatever its interval says. Regressions are
flagged on fewer questions than wins are claimed on, on purpose: a warning may be noisy, a
claim may not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from searchrl.eval.metrics import (
    NAN_INTERVAL,
    Interval,
    QuestionResult,
    align,
    bootstrap_mean_ci,
    by_hops,
    by_type,
    paired_bootstrap_delta,
)
from searchrl.gate.payback import Check

SliceKind = Literal["type", "hops", "slice"]


def _named_slices(r: QuestionResult) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.slices))


# Each kind's groups of a question (a question is in one type and one hop count, and in any
# number of named slices), in the order the report lists them.
SLICE_KINDS: dict[SliceKind, Callable[[QuestionResult], tuple[str, ...]]] = {
    "hops": lambda r: (by_hops(r),), "type": lambda r: (by_type(r),), "slice": _named_slices}


@dataclass(frozen=True)
class SliceDelta:
    """The trained policy minus `against` on the slice's questions both answered: the other
    system's EM there, the paired delta, whether it is a flagged regression, and whether it
    is a claimable win (interval above 0 on enough questions to claim)."""

    against: str
    em: float
    delta: Interval
    regression: bool
    win: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"against": self.against, "em": self.em, "delta": self.delta.to_dict(),
                "regression": self.regression, "win": self.win}


@dataclass(frozen=True)
class Slice:
    kind: SliceKind
    name: str
    n: int  # the trained policy's questions in the slice
    correct: int  # of them answered with EM 1
    trained_em: float
    too_few: bool  # n < gate.slice_min_questions: shown, never flagged as a regression
    vs: tuple[SliceDelta, ...]
    trained_ci: Interval = NAN_INTERVAL  # the trained policy's EM with its interval
    # n < gate.slice_claim_min_questions: shown as "too few to claim", never as a win.
    too_few_to_claim: bool = False

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def zero(self) -> bool:
        return self.n >= 1 and self.trained_em == 0.0

    @property
    def regressions(self) -> tuple[SliceDelta, ...]:
        return tuple(d for d in self.vs if d.regression)

    @property
    def wins(self) -> tuple[SliceDelta, ...]:
        return tuple(d for d in self.vs if d.win)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "n": self.n, "correct": self.correct,
                "trained_em": self.trained_em, "trained_ci": self.trained_ci.to_dict(),
                "too_few": self.too_few, "too_few_to_claim": self.too_few_to_claim,
                "zero": self.zero, "regression": bool(self.regressions),
                "win": [d.against for d in self.wins], "vs": [d.to_dict() for d in self.vs]}


@dataclass(frozen=True)
class SliceReport:
    """Every slice, and how the gate treats a regression (`mode`: "warn" or "fail").
    `against` names the compared systems, comparator first; `missing` those whose
    per-question results could not be read; `note` says why slices are missing or partial."""

    mode: str
    min_questions: int
    level: float
    against: tuple[str, ...]
    slices: tuple[Slice, ...] = ()
    note: str = ""
    missing: tuple[str, ...] = ()
    claim_min_questions: int = 30  # gate.slice_claim_min_questions

    @property
    def regressions(self) -> tuple[tuple[Slice, SliceDelta], ...]:
        return tuple((s, d) for s in self.slices for d in s.regressions)

    @property
    def at_zero(self) -> tuple[Slice, ...]:
        return tuple(s for s in self.slices if s.zero)

    @property
    def wins(self) -> tuple[tuple[Slice, SliceDelta], ...]:
        return tuple((s, d) for s in self.slices for d in s.wins)

    def regression_text(self) -> str:
        """`type org_founder vs sft -1.000 [-1.000, -1.000] (n=10)`, joined by `; `."""
        return "; ".join(f"{s.label} vs {d.against} {d.delta.mean:+.3f} "
                         f"[{d.delta.lo:+.3f}, {d.delta.hi:+.3f}] (n={d.delta.n})"
                         for s, d in self.regressions)

    def check(self) -> Check:
        """The gate's `slices` condition (only with gate.slice_regression=fail); fails closed
        when a system's per-question results are missing."""
        if self.missing:
            return Check("slices", False, f"slices cannot be checked: {self.note}")
        if not self.regressions:
            return Check("slices", True, f"no slice regresses significantly (interval upper "
                                         f"bound < 0 on >= {self.min_questions} questions)")
        return Check("slices", False, f"significant slice regression (gate.slice_regression"
                                      f"=fail): {self.regression_text()}")

    def sentence(self) -> str:
        """For the decision box: slices at EM 0 and regressions ("" when there are none)."""
        parts = []
        if self.at_zero:
            parts.append("slice scores 0: " + ", ".join(
                f"{s.name} ({s.correct}/{s.n})" for s in self.at_zero))
        if self.regressions:
            effect = ("fails the gate" if self.mode == "fail"
                      else "warning only, gate.slice_regression=warn")
            parts.append(f"slice regressions ({effect}): {self.regression_text()}")
        if self.note:
            parts.append(self.note)
        return ("Slices: " + "; ".join(parts) + ".") if parts else ""

    def figures(self) -> dict[str, float]:
        return {"slice_regressions": float(len(self.regressions)),
                "slices_at_zero": float(len(self.at_zero)), "slices": float(len(self.slices)),
                "slice_wins": float(len(self.wins))}

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "min_questions": self.min_questions, "level": self.level,
                "claim_min_questions": self.claim_min_questions,
                "against": list(self.against), "note": self.note,
                "regressions": [f"{s.label} vs {d.against}" for s, d in self.regressions],
                "wins": [f"{s.label} vs {d.against}" for s, d in self.wins],
                "at_zero": [s.label for s in self.at_zero],
                "slices": [s.to_dict() for s in self.slices]}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def compute_slices(trained: Sequence[QuestionResult],
                   against: Mapping[str, Sequence[QuestionResult]], *, mode: str,
                   min_questions: int, samples: int, level: float, seed: int,
                   note: str = "", missing: tuple[str, ...] = (),
                   claim_min_questions: int = 30) -> SliceReport:
    """Per question type, hop count and named slice: the trained policy's EM with its
    interval and, for each system in `against` (comparator first), the paired EM delta on
    their common questions in the slice (`paired_bootstrap_delta` with the evaluation's
    samples, level and seed), flagged a regression or a win as the module docstring says."""
    slices: list[Slice] = []
    for kind, keys in SLICE_KINDS.items():
        groups: dict[str, list[QuestionResult]] = {}
        for r in trained:
            for key in keys(r):
                groups.setdefault(key, []).append(r)
        for name in sorted(groups):
            mine = groups[name]
            claimable = len(mine) >= claim_min_questions
            vs = []
            for other, results in against.items():
                a, b = align(mine, results)  # by question id: the slice is the trained's
                delta = paired_bootstrap_delta([r.em for r in a], [r.em for r in b],
                                               samples=samples, level=level, seed=seed)
                flagged = (delta.n >= min_questions and math.isfinite(delta.hi)
                           and delta.hi < 0.0)
                win = (claimable and delta.n >= claim_min_questions
                       and math.isfinite(delta.lo) and delta.lo > 0.0)
                vs.append(SliceDelta(other, _mean([r.em for r in b]), delta, flagged, win))
            ems = [r.em for r in mine]
            slices.append(Slice(kind, name, len(mine), sum(1 for e in ems if e >= 1.0),
                                _mean(ems), len(mine) < min_questions, tuple(vs),
                                bootstrap_mean_ci(ems, samples=samples, level=level,
                                                  seed=seed),
                                not claimable))
    return SliceReport(mode, min_questions, level, tuple(against), tuple(slices), note,
                       missing, claim_min_questions)
