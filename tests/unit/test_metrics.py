"""Metric arithmetic: means, breakdowns, the searched/not split, pairing."""

from __future__ import annotations

import math

import pytest

from searchrl.eval.metrics import (
    QuestionResult,
    align,
    breakdown,
    by_hops,
    by_searched,
    by_type,
    summarize,
)


def _q(i: int, *, em: float, f1: float | None = None, hops: int | None = 1, searches: int = 1,
       fmt: bool = True, ptok: int = 10, rtok: int = 5, support: bool | None = True,
       qtype: str | None = "t") -> QuestionResult:
    return QuestionResult(example_id=f"q{i}", hops=hops, qtype=qtype, em=em,
                          f1=em if f1 is None else f1, searches=searches, format_ok=fmt,
                          prompt_tokens=ptok, response_tokens=rtok, latency_s=0.5 * i,
                          answered=True, finish_reason="answer", retrieved_support=support)


def test_summary_means_are_hand_computed() -> None:
    rs = [_q(1, em=1.0, f1=1.0, searches=2, ptok=10, rtok=6, support=True),
          _q(2, em=0.0, f1=0.5, searches=0, fmt=False, ptok=20, rtok=4, support=False),
          _q(3, em=1.0, f1=1.0, searches=1, ptok=30, rtok=2, support=None),
          _q(4, em=0.0, f1=0.0, searches=1, ptok=40, rtok=8, support=True)]
    s = summarize(rs, samples=200)
    assert s.n == 4
    assert s.em.mean == pytest.approx(0.5)
    assert s.f1.mean == pytest.approx(2.5 / 4)
    assert s.searches_per_question == pytest.approx(1.0)
    assert s.format_rate == pytest.approx(0.75)
    assert s.response_tokens == pytest.approx(5.0)
    assert s.tokens_per_query == pytest.approx((16 + 24 + 32 + 48) / 4)
    assert s.latency_s == pytest.approx((0.5 + 1.0 + 1.5 + 2.0) / 4)
    # Questions without supporting ids do not count towards support recall.
    assert s.support_recall == pytest.approx(2 / 3)


def test_empty_group_is_nan_not_an_error() -> None:
    s = summarize([], samples=10)
    assert s.n == 0
    assert math.isnan(s.em.mean) and math.isnan(s.em.lo)
    assert not s.em.excludes_zero


def test_breakdowns_partition_the_questions() -> None:
    rs = [_q(1, em=1.0, hops=1, searches=0, qtype="a"), _q(2, em=0.0, hops=2, qtype="b"),
          _q(3, em=1.0, hops=2, qtype="b"), _q(4, em=1.0, hops=None, searches=0, qtype=None)]
    hops = breakdown(rs, by_hops, samples=50)
    assert list(hops) == ["1-hop", "2-hop", "unknown"]
    assert hops["2-hop"].n == 2 and hops["2-hop"].em.mean == pytest.approx(0.5)
    types = breakdown(rs, by_type, samples=50)
    assert {k: v.n for k, v in types.items()} == {"a": 1, "b": 2, "unknown": 1}
    searched = breakdown(rs, by_searched, samples=50)
    assert searched["answered_without_search"].n == 2
    assert searched["answered_without_search"].em.mean == pytest.approx(1.0)
    assert searched["searched"].em.mean == pytest.approx(0.5)
    assert sum(v.n for v in searched.values()) == len(rs)


def test_align_pairs_common_questions_in_order() -> None:
    a = [_q(1, em=1.0), _q(2, em=0.0), _q(3, em=1.0)]
    b = [_q(3, em=0.0), _q(1, em=1.0)]
    a2, b2 = align(a, b)
    assert [r.example_id for r in a2] == ["q1", "q3"]
    assert [r.example_id for r in b2] == ["q1", "q3"]


def test_roundtrip_dict() -> None:
    r = _q(7, em=1.0)
    assert QuestionResult.from_dict(r.to_dict()) == r
