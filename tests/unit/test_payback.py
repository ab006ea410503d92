"""The cost-payback model on hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import pytest

from searchrl.gate.payback import (
    InvalidInputError,
    compute_payback,
    payback_curve,
)
from tests.unit.test_gate import COSTS

# The hand-computed case the gate's tests decide on too.
BASE = COSTS


def test_hand_computed_case() -> None:
    r = compute_payback(BASE)
    # 40 h * 2.5 = 100; small 1e5 * 0.8 * 0.0005 = 40; frontier 1e5 * 1.5 * 0.01 = 1500.
    assert r.training_cost == pytest.approx(100.0)
    assert r.small_monthly_cost == pytest.approx(40.0)
    assert r.frontier_monthly_cost == pytest.approx(1500.0)
    assert r.monthly_saving == pytest.approx(1460.0)
    assert r.payback_months == pytest.approx(100.0 / 1460.0)


def test_second_hand_computed_case() -> None:
    r = compute_payback(dataclasses.replace(
        BASE, gpu_price_per_hour=3.0, training_gpu_hours=1000.0,
        production_queries_per_month=10_000, small_tokens_per_query=2000,
        small_price_per_1k_tokens=0.001, frontier_tokens_per_query=1000,
        frontier_price_per_1k_tokens=0.005))
    # cost 3000; small 10k*2*0.001 = 20; frontier 10k*1*0.005 = 50; saving 30 -> 100 months.
    assert r.payback_months == pytest.approx(100.0)


def test_no_saving_never_pays_back() -> None:
    r = compute_payback(dataclasses.replace(BASE, small_price_per_1k_tokens=0.05))
    assert r.monthly_saving < 0
    assert math.isinf(r.payback_months)


def test_free_training_pays_back_at_once() -> None:
    r = compute_payback(dataclasses.replace(BASE, training_gpu_hours=0.0))
    assert r.payback_months == 0.0


def test_curve_crosses_zero_at_payback() -> None:
    r = compute_payback(dataclasses.replace(BASE, training_gpu_hours=1168.0))  # cost 2920
    curve = payback_curve(r, 4)
    assert curve[0] == (0, pytest.approx(-2920.0))
    assert [m for m, _ in curve] == [0, 1, 2, 3, 4]
    assert curve[2][1] == pytest.approx(0.0)  # 2 * 1460 = 2920
    assert curve[1][1] < 0 < curve[3][1]


@pytest.mark.parametrize("field", ["gpu_price_per_hour", "training_gpu_hours",
                                   "production_queries_per_month", "small_tokens_per_query",
                                   "small_price_per_1k_tokens", "frontier_tokens_per_query",
                                   "frontier_price_per_1k_tokens"])
@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -1.0])
def test_bad_inputs_raise_naming_the_input(field: str, bad: float | None) -> None:
    short = field.removesuffix("_per_query").removesuffix("_per_1k_tokens")
    with pytest.raises(InvalidInputError, match=short):
        compute_payback(dataclasses.replace(BASE, **{field: bad}))
