"""Pure evaluation arithmetic: per-question results -> means with bootstrap intervals,
breakdowns by hop count / question type / named slice / searched-or-not / retrieval
confidence, and paired deltas between systems.

Nothing here runs a model. An empty group gives NaN means and a zero count (never an
exception), so a downstream gate that checks `math.isfinite` fails closed on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class QuestionResult:
    """One system's greedy trajectory on one eval question, reduced to what metrics need.

    `em`/`f1` are in [0, 1]; `searches` counts issued `<search>` calls; `format_ok` is the
    reward's format check; `prompt_tokens + response_tokens` is what one query costs to serve;
    `latency_s` is the question's share of its batch's wall time; `retrieved_support` is
    whether any supporting passage was among the retrieved ids (None when the question has no
    supporting ids); `confidence` is the geometric-mean probability of the final generated turn;
    `top_score` is the retriever's score of the best hit of the first retrieval (None when
    nothing was retrieved); `slices` are the named slices the question belongs to (the
    QAExample's: unseen_phrasing, answer_novel, alias, namesake, cross_passage, comparison;
    several or none).
    """

    example_id: str
    hops: int | None
    qtype: str | None
    em: float
    f1: float
    searches: int
    format_ok: bool
    prompt_tokens: int
    response_tokens: int
    latency_s: float
    answered: bool
    finish_reason: str
    answer: str | None = None
    retrieved_support: bool | None = None
    confidence: float | None = None
    search_errors: int = 0
    top_score: float | None = None
    slices: tuple[str, ...] = ()

    @property
    def searched(self) -> bool:
        return self.searches > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuestionResult:
        # JSON gives a list; files written before slices were recorded have none.
        return cls(**{**data, "slices": tuple(data.get("slices") or ())})


@dataclass(frozen=True)
class Interval:
    """A sample mean with a percentile-bootstrap interval at `level` over `n` items."""

    mean: float
    lo: float
    hi: float
    n: int
    level: float = 0.95

    @property
    def excludes_zero(self) -> bool:
        return self.n > 0 and (self.lo > 0.0 or self.hi < 0.0)

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n,
                "level": self.level}


NAN_INTERVAL = Interval(math.nan, math.nan, math.nan, 0)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")


def bootstrap_mean_ci(values: Sequence[float], *, samples: int = 1000, level: float = 0.95,
                      seed: int = 0) -> Interval:
    """Mean of `values` with a percentile-bootstrap interval (resampling items with replacement).

    Deterministic for a given seed. Empty input -> NaN interval with n=0.
    """
    _check_level(level)
    if samples < 1:
        raise ValueError(f"bootstrap samples must be >= 1, got {samples}")
    arr = np.asarray(values, dtype=np.float64)
    n = int(arr.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))  # [samples, n] resampled item indices
    means = arr[idx].mean(axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return Interval(float(arr.mean()), float(lo), float(hi), n, level)


def paired_bootstrap_delta(a: Sequence[float], b: Sequence[float], *, samples: int = 1000,
                           level: float = 0.95, seed: int = 0) -> Interval:
    """Mean of `a[i] - b[i]` with a bootstrap interval resampling *questions* (paired), which
    is tighter and more honest than differencing two independent intervals."""
    if len(a) != len(b):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(a)} and {len(b)}")
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return bootstrap_mean_ci(diff.tolist(), samples=samples, level=level, seed=seed)


@dataclass(frozen=True)
class Summary:
    """Aggregates over one group of questions."""

    n: int
    em: Interval
    f1: Interval
    searches_per_question: float
    format_rate: float
    answered_rate: float
    response_tokens: float
    tokens_per_query: float
    latency_s: float
    support_recall: float  # share of questions (with supporting ids) whose support was retrieved
    search_errors: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["em"] = self.em.to_dict()
        out["f1"] = self.f1.to_dict()
        return out


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def summarize(results: Sequence[QuestionResult], *, samples: int = 1000, level: float = 0.95,
              seed: int = 0) -> Summary:
    """Means over `results` (EM and F1 with bootstrap intervals)."""
    with_support = [r.retrieved_support for r in results if r.retrieved_support is not None]
    return Summary(
        n=len(results),
        em=bootstrap_mean_ci([r.em for r in results], samples=samples, level=level, seed=seed),
        f1=bootstrap_mean_ci([r.f1 for r in results], samples=samples, level=level, seed=seed),
        searches_per_question=_mean([r.searches for r in results]),
        format_rate=_mean([float(r.format_ok) for r in results]),
        answered_rate=_mean([float(r.answered) for r in results]),
        response_tokens=_mean([r.response_tokens for r in results]),
        tokens_per_query=_mean([r.prompt_tokens + r.response_tokens for r in results]),
        latency_s=_mean([r.latency_s for r in results]),
        support_recall=_mean([float(s) for s in with_support]),
        search_errors=sum(r.search_errors for r in results),
    )


def breakdown(results: Sequence[QuestionResult], key: Callable[[QuestionResult], str], *,
              samples: int = 1000, level: float = 0.95, seed: int = 0) -> dict[str, Summary]:
    """`summarize` per group, groups in sorted key order."""
    groups: dict[str, list[QuestionResult]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    return {k: summarize(groups[k], samples=samples, level=level, seed=seed)
            for k in sorted(groups)}


def by_slices(results: Sequence[QuestionResult], *, samples: int = 1000, level: float = 0.95,
              seed: int = 0) -> dict[str, Summary]:
    """`summarize` per named slice, slices in sorted order. A question counts in each of its
    slices (they overlap, so the groups do not partition the results); one in none is in no
    group."""
    groups: dict[str, list[QuestionResult]] = {}
    for r in results:
        for name in dict.fromkeys(r.slices):
            groups.setdefault(name, []).append(r)
    return {k: summarize(groups[k], samples=samples, level=level, seed=seed)
            for k in sorted(groups)}


def by_hops(r: QuestionResult) -> str:
    return f"{r.hops}-hop" if r.hops is not None else "unknown"


def by_type(r: QuestionResult) -> str:
    return r.qtype or "unknown"


def by_searched(r: QuestionResult) -> str:
    """Exposes a retriever blind spot the policy learned to route around: if accuracy without
    searching is high on some slice, the policy answers those from memory or guesses."""
    return "searched" if r.searched else "answered_without_search"


NO_SEARCH, NO_HITS = "no_search", "no_hits"
CONFIDENCE_BUCKETS = (NO_SEARCH, NO_HITS, "q1_low", "q2_mid", "q3_high")


def tercile_cuts(scores: Sequence[float]) -> tuple[float, float] | None:
    """The 1/3 and 2/3 quantiles of `scores` (None when empty): retriever scores have no common
    scale (BM25 is unbounded, RRF tiny), so confidence is relative to this eval set."""
    finite = [s for s in scores if math.isfinite(s)]
    if not finite:
        return None
    lo, hi = np.quantile(np.asarray(finite, dtype=np.float64), [1 / 3, 2 / 3])
    return float(lo), float(hi)


def by_confidence(cuts: tuple[float, float] | None) -> Callable[[QuestionResult], str]:
    """Group key: the tercile of the question's first-retrieval top-1 score under `cuts`
    (q1_low <= lo < q2_mid <= hi < q3_high), `no_search` when the policy did not search,
    `no_hits` when its first search returned nothing (an error or an empty result)."""
    def key(r: QuestionResult) -> str:
        if not r.searched:
            return NO_SEARCH
        if r.top_score is None or cuts is None or not math.isfinite(r.top_score):
            return NO_HITS
        if r.top_score <= cuts[0]:
            return "q1_low"
        return "q2_mid" if r.top_score <= cuts[1] else "q3_high"
    return key


def align(a: Sequence[QuestionResult], b: Sequence[QuestionResult]
          ) -> tuple[list[QuestionResult], list[QuestionResult]]:
    """The two systems' results on their common questions, in the same order (for pairing)."""
    b_by_id = {r.example_id: r for r in b}
    pairs = [(r, b_by_id[r.example_id]) for r in a if r.example_id in b_by_id]
    return [p[0] for p in pairs], [p[1] for p in pairs]
