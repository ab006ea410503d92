"""The cost-payback model and the go/no-go gate (pure, typed, no I/O).

Model (all money in the configured currency, tokens are prompt + generated per query):

    device_hours     = sum over stages (curriculum incl. cold start, training, evaluation)
                       of wall_seconds * devices / 3600, training scaled by the projection
    projection       = full_run_tokens / prototype_tokens   (when full_run_tokens is set)
                     | full_run_steps / prototype_steps     (when full_run_steps is set)
    training_gpu_hours = device_hours (or the configured number)
    training_cost    = training_gpu_hours * gpu_price_per_hour
    small_monthly    = queries_per_month * small_tokens_per_query / 1000 * small_price_per_1k
    frontier_monthly = queries_per_month * frontier_tokens_per_query / 1000 * frontier_price_per_1k
    monthly_saving   = frontier_monthly - small_monthly
    payback_months   = training_cost / monthly_saving      (inf when the saving is <= 0)

Gate: GO only if every condition holds:

    data      gold_pairs >= min_gold_pairs
    accuracy  accuracy_delta >= min_accuracy_margin and the delta's interval lies above zero,
              measured against the frontier system itself (a stand-in passes only when
              allowed, and a comparator that was not fully measured never does)
    champion  not worse than the registry's current champion on the same questions: the
              paired EM delta's lower bound >= -champion_margin (passes, stated, when no
              champion is registered yet; fails when one is but was not evaluated)
    payback   payback_months <= max_payback_months

Fail closed: a missing (None) or non-finite input, or a negative count/price, fails the
condition that needs it with a reason naming the input; `decide` never raises on bad numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class CostInputs:
    gpu_type: str
    gpu_price_per_hour: float | None
    training_gpu_hours: float | None
    production_queries_per_month: float | None
    small_tokens_per_query: float | None
    small_price_per_1k_tokens: float | None
    frontier_tokens_per_query: float | None
    frontier_price_per_1k_tokens: float | None


@dataclass(frozen=True)
class PaybackResult:
    training_cost: float
    small_monthly_cost: float
    frontier_monthly_cost: float
    monthly_saving: float
    payback_months: float  # inf when the trained model never pays back

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class InvalidInputError(ValueError):
    """A cost input is missing, non-finite or negative; the message names the input."""


def _valid(name: str, value: float | None) -> float:
    if value is None:
        raise InvalidInputError(f"{name} is missing")
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{name} is not a finite number ({value!r})")
    if value < 0:
        raise InvalidInputError(f"{name} is negative ({value!r})")
    return float(value)


def compute_payback(inputs: CostInputs) -> PaybackResult:
    """The cost model above; raises InvalidInputError naming the first bad input."""
    hours = _valid("training_gpu_hours", inputs.training_gpu_hours)
    price = _valid("gpu_price_per_hour", inputs.gpu_price_per_hour)
    queries = _valid("production_queries_per_month", inputs.production_queries_per_month)
    small_tok = _valid("small_tokens_per_query", inputs.small_tokens_per_query)
    small_price = _valid("small_price_per_1k_tokens", inputs.small_price_per_1k_tokens)
    big_tok = _valid("frontier_tokens_per_query", inputs.frontier_tokens_per_query)
    big_price = _valid("frontier_price_per_1k_tokens", inputs.frontier_price_per_1k_tokens)
    training_cost = hours * price
    small = queries * small_tok / 1000.0 * small_price
    frontier = queries * big_tok / 1000.0 * big_price
    saving = frontier - small
    payback = training_cost / saving if saving > 0 else math.inf
    return PaybackResult(training_cost=training_cost, small_monthly_cost=small,
                         frontier_monthly_cost=frontier, monthly_saving=saving,
                         payback_months=payback)


def payback_curve(result: PaybackResult, months: int) -> list[tuple[int, float]]:
    """Cumulative net saving after m months (m = 0..months): -training_cost + m * saving."""
    return [(m, -result.training_cost + m * result.monthly_saving) for m in range(months + 1)]


# --- measured cost: wall time x devices per stage, and the projection to a full run


@dataclass(frozen=True)
class StageCost:
    """One stage's compute: its wall time and the devices (ranks) it held. `seconds` None
    means not recorded; a rank on CPU counts as one device."""

    stage: str
    seconds: float | None
    devices: int

    @property
    def device_hours(self) -> float:
        """seconds * devices / 3600; NaN when not recorded or invalid (fails closed)."""
        s, d = self.seconds, self.devices
        if s is None or not _finite(s) or s < 0 or not _finite(d) or d < 1:
            return math.nan
        return s * d / 3600.0


@dataclass(frozen=True)
class Projection:
    """The prototype's training device-hours scaled to the configured full run by `basis`
    ("tokens" or "steps"): ratio = full / done, NaN when `done` is missing or not positive."""

    basis: str
    done: float | None
    full: float
    measured_device_hours: float

    @property
    def ratio(self) -> float:
        d = self.done
        if d is None or not _finite(d) or d <= 0 or not _finite(self.full) or self.full <= 0:
            return math.nan
        return self.full / d

    @property
    def projected_device_hours(self) -> float:
        return self.measured_device_hours * self.ratio


def project_training(measured_device_hours: float, *, steps_done: float | None,
                     tokens_done: float | None, full_run_steps: float | None,
                     full_run_tokens: float | None) -> Projection | None:
    """The projection to the full run: by tokens when `full_run_tokens` is set (it follows
    batch and response-length changes that a step count does not), else by steps; None when
    neither is set (the prototype's own cost stands)."""
    if full_run_tokens is not None:
        return Projection("tokens", tokens_done, float(full_run_tokens), measured_device_hours)
    if full_run_steps is not None:
        return Projection("steps", steps_done, float(full_run_steps), measured_device_hours)
    return None


def total_device_hours(stages: Sequence[StageCost], projection: Projection | None = None,
                       projected_stage: str = "training") -> float:
    """Sum of the stages' device-hours, `projected_stage` replaced by the projection's;
    NaN when any term is (the payback condition then fails closed)."""
    total = 0.0
    for s in stages:
        total += (projection.projected_device_hours
                  if projection is not None and s.stage == projected_stage else s.device_hours)
    return total


# --- the gate


@dataclass(frozen=True)
class GateThresholds:
    min_gold_pairs: int
    min_accuracy_margin: float
    max_payback_months: float
    champion_margin: float = 0.02  # how much worse than the champion a GO may be (lower bound)


@dataclass(frozen=True)
class GateInputs:
    gold_pairs: int | None
    accuracy_delta: float | None  # trained EM - comparison baseline EM
    accuracy_delta_lo: float | None  # the delta's bootstrap interval
    accuracy_delta_hi: float | None
    comparison_baseline: str
    costs: CostInputs
    # "frontier": the comparator is the frontier system, measured on the same eval set;
    # "stand-in": another system in its place, which passes only with `allow_stand_in`.
    comparator: Literal["frontier", "stand-in"] = "stand-in"
    allow_stand_in: bool = False
    comparator_problem: str | None = None  # why the comparator was not fully measured
    champion: ChampionInputs | None = None  # None: no champion registered yet
    # Trained minus the scripted baseline (a fixed program, no learning), paired EM delta and
    # its interval; None when the script was not evaluated (the report says so).
    scripted_delta: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class ChampionInputs:
    """The registry's current champion: its version, and the trained policy's paired EM
    delta against it on the same questions (None when it was not evaluated, with `problem`
    saying why)."""

    version: str
    delta: float | None = None
    delta_lo: float | None = None
    delta_hi: float | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Check:
    name: str  # data | accuracy | champion | scripted | payback | training
    passed: bool
    detail: str


@dataclass(frozen=True)
class GateResult:
    go: bool
    checks: tuple[Check, ...]
    payback: PaybackResult | None

    @property
    def label(self) -> str:
        return "GO" if self.go else "NO-GO"

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Each failed condition on NO-GO; each satisfied condition on GO."""
        chosen = self.checks if self.go else self.failed
        return tuple(f"{c.name}: {c.detail}" for c in chosen)

    def to_dict(self) -> dict[str, Any]:
        return {"go": self.go, "label": self.label,
                "checks": [asdict(c) for c in self.checks],
                "payback": self.payback.to_dict() if self.payback else None}


def _finite(value: float | None) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _check_data(inputs: GateInputs, t: GateThresholds) -> Check:
    n = inputs.gold_pairs
    if n is None or not _finite(n) or n < 0:
        return Check("data", False, f"gold pair count is missing or invalid ({n!r})")
    ok = n >= t.min_gold_pairs
    rel = ">=" if ok else "<"
    return Check("data", ok, f"{n} gold pairs {rel} required {t.min_gold_pairs}")


def _check_accuracy(inputs: GateInputs, t: GateThresholds) -> Check:
    d, lo, hi = inputs.accuracy_delta, inputs.accuracy_delta_lo, inputs.accuracy_delta_hi
    base = inputs.comparison_baseline
    if inputs.comparator_problem:
        return Check("accuracy", False,
                     f"comparator {base} not fully measured: {inputs.comparator_problem}")
    if not (_finite(d) and _finite(lo) and _finite(hi)):
        return Check("accuracy", False,
                     f"EM delta vs {base} is missing or not finite "
                     f"(delta={d!r}, interval=[{lo!r}, {hi!r}])")
    assert d is not None and lo is not None and hi is not None
    problems = []
    if d < t.min_accuracy_margin:
        problems.append(f"below the required margin {t.min_accuracy_margin:+.3f}")
    if lo <= 0.0:
        problems.append("interval does not exclude zero")
    detail = f"EM delta vs {base} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    allowed = ""
    if inputs.comparator != "frontier":
        detail += f", measured against a stand-in ({base}), not the frontier system"
        if not inputs.allow_stand_in:
            problems.append("a stand-in comparator may not pass "
                            "(gate.allow_stand_in_comparator=false; set eval.frontier to "
                            "measure the frontier system)")
        allowed = " (stand-in allowed by gate.allow_stand_in_comparator)"
    if problems:
        return Check("accuracy", False, f"{detail}: {'; '.join(problems)}")
    return Check("accuracy", True,
                 f"{detail} >= margin {t.min_accuracy_margin:+.3f}, interval excludes "
                 f"zero{allowed}")


def _check_champion(inputs: GateInputs, t: GateThresholds) -> Check:
    """Non-inferiority: a GO never replaces a stronger champion."""
    c = inputs.champion
    if c is None:
        return Check("champion", True, "no champion yet: nothing registered to be worse than")
    name = f"champion (version {c.version})"
    if c.problem:
        return Check("champion", False, f"{name} not compared: {c.problem}")
    d, lo, hi = c.delta, c.delta_lo, c.delta_hi
    if not (_finite(d) and _finite(lo) and _finite(hi)):
        return Check("champion", False, f"EM delta vs {name} is missing or not finite "
                                        f"(delta={d!r}, interval=[{lo!r}, {hi!r}])")
    assert d is not None and lo is not None and hi is not None
    ok = lo >= -t.champion_margin
    rel = ">=" if ok else "<"
    detail = (f"EM delta vs {name} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]: lower bound {rel} "
              f"-{t.champion_margin:.3f} (gate.champion_margin)")
    return Check("champion", ok, detail + ("" if ok else ": the candidate may be worse than "
                                                         "the current champion"))


def _check_scripted(inputs: GateInputs) -> Check:
    """A model a fixed script matches is not worth training: the paired EM delta against the
    scripted baseline must have its lower bound above 0 (not evaluated: passes, and the report
    says the world's need for learning is unmeasured)."""
    if inputs.scripted_delta is None:
        return Check("scripted", True, "scripted baseline not evaluated")
    d, lo, hi = inputs.scripted_delta
    if not (_finite(d) and _finite(lo) and _finite(hi)):
        return Check("scripted", False, f"EM delta vs scripted not finite ({d!r}, [{lo!r}, "
                                        f"{hi!r}])")
    ok = lo > 0.0
    return Check("scripted", ok, f"EM delta vs scripted (a fixed program, no learning) "
                                 f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]: lower bound "
                                 f"{'>' if ok else '<='} 0" + (
                                     "" if ok else ": the trained policy does not beat a "
                                                   "fixed script"))


def _check_payback(payback: PaybackResult | None, error: str | None,
                   t: GateThresholds) -> Check:
    if payback is None:
        return Check("payback", False, f"cost model input invalid: {error}")
    months = payback.payback_months
    if not math.isfinite(months):
        return Check("payback", False,
                     f"never pays back: monthly saving {payback.monthly_saving:.2f} <= 0")
    ok = months <= t.max_payback_months
    rel = "<=" if ok else ">"
    return Check("payback", ok, f"payback {months:.2f} months {rel} allowed "
                                f"{t.max_payback_months:g} (training cost "
                                f"{payback.training_cost:.2f}, saving "
                                f"{payback.monthly_saving:.2f}/month)")


def decide(inputs: GateInputs, thresholds: GateThresholds) -> GateResult:
    """Evaluate every condition (all are reported, not just the first failure)."""
    payback: PaybackResult | None
    error: str | None = None
    try:
        payback = compute_payback(inputs.costs)
    except InvalidInputError as exc:
        payback, error = None, str(exc)
    checks: tuple[Check, ...] = (_check_data(inputs, thresholds),
                                 _check_accuracy(inputs, thresholds),
                                 _check_champion(inputs, thresholds),
                                 _check_scripted(inputs),
                                 _check_payback(payback, error, thresholds))
    # Invalid thresholds cannot produce a GO either.
    bad_thresholds = [k for k, v in asdict(thresholds).items() if not _finite(v)]
    if bad_thresholds:
        checks = (*checks, Check("thresholds", False, f"not finite: {bad_thresholds}"))
    return GateResult(go=all(c.passed for c in checks), checks=checks, payback=payback)
