"""The go/no-go gate: each condition flips the decision; bad inputs fail closed."""

from __future__ import annotations

import dataclasses
import math

import pytest

from searchrl.gate.payback import (
    ChampionInputs,
    CostInputs,
    GateInputs,
    GateThresholds,
    decide,
)

COSTS = CostInputs(gpu_type="H100", gpu_price_per_hour=2.5, training_gpu_hours=40.0,
                   production_queries_per_month=100_000, small_tokens_per_query=800,
                   small_price_per_1k_tokens=0.0005, frontier_tokens_per_query=1500,
                   frontier_price_per_1k_tokens=0.01)  # payback 100/1460 months
PASSING = GateInputs(gold_pairs=500, accuracy_delta=0.12, accuracy_delta_lo=0.05,
                     accuracy_delta_hi=0.19, comparison_baseline="sft", costs=COSTS,
                     comparator="frontier")
T = GateThresholds(min_gold_pairs=200, min_accuracy_margin=0.05, max_payback_months=6.0)


def _failed(inputs: GateInputs, t: GateThresholds = T) -> set[str]:
    result = decide(inputs, t)
    assert result.go == (not result.failed)
    return {c.name for c in result.failed}


def test_all_conditions_met_is_go_with_reasons() -> None:
    result = decide(PASSING, T)
    assert result.go and result.label == "GO"
    assert [r.split(":")[0] for r in result.reasons] == ["data", "accuracy", "champion",
                                                       "scripted", "payback"]
    assert result.payback is not None


def test_too_few_gold_pairs_flips_to_no_go() -> None:
    assert _failed(dataclasses.replace(PASSING, gold_pairs=199)) == {"data"}
    assert _failed(dataclasses.replace(PASSING, gold_pairs=200)) == set()


def test_margin_not_met_flips_to_no_go() -> None:
    inputs = dataclasses.replace(PASSING, accuracy_delta=0.04, accuracy_delta_lo=0.01)
    result = decide(inputs, T)
    assert not result.go
    assert {c.name for c in result.failed} == {"accuracy"}
    assert "margin" in result.reasons[0] and "sft" in result.reasons[0]


def test_interval_touching_zero_flips_to_no_go() -> None:
    inputs = dataclasses.replace(PASSING, accuracy_delta_lo=0.0)
    result = decide(inputs, T)
    assert {c.name for c in result.failed} == {"accuracy"}
    assert "exclude zero" in result.reasons[0]


def test_slow_payback_flips_to_no_go() -> None:
    slow = dataclasses.replace(COSTS, training_gpu_hours=40.0 * 100)  # 10000/1460 = 6.85 months
    assert _failed(dataclasses.replace(PASSING, costs=slow)) == {"payback"}
    ok = dataclasses.replace(COSTS, training_gpu_hours=40.0 * 80)  # 8000/1460 = 5.48 months
    assert _failed(dataclasses.replace(PASSING, costs=ok)) == set()


def test_no_saving_is_no_go() -> None:
    costly = dataclasses.replace(COSTS, small_price_per_1k_tokens=1.0)
    result = decide(dataclasses.replace(PASSING, costs=costly), T)
    assert not result.go and "never pays back" in result.reasons[0]


def test_every_failed_condition_is_named() -> None:
    bad = dataclasses.replace(PASSING, gold_pairs=10, accuracy_delta=-0.1,
                              accuracy_delta_lo=-0.2, accuracy_delta_hi=0.0,
                              costs=dataclasses.replace(COSTS, training_gpu_hours=1e6),
                              champion=ChampionInputs("1", -0.2, -0.3, -0.1),
                              scripted_delta=(-0.1, -0.2, -0.05))
    result = decide(bad, T)
    assert [r.split(":")[0] for r in result.reasons] == ["data", "accuracy", "champion",
                                                       "scripted", "payback"]


@pytest.mark.parametrize("field", ["accuracy_delta", "accuracy_delta_lo", "accuracy_delta_hi"])
@pytest.mark.parametrize("bad", [None, math.nan, math.inf])
def test_non_finite_accuracy_fails_closed(field: str, bad: float | None) -> None:
    result = decide(dataclasses.replace(PASSING, **{field: bad}), T)
    assert not result.go
    assert {c.name for c in result.failed} == {"accuracy"}


@pytest.mark.parametrize("field", ["training_gpu_hours", "small_tokens_per_query",
                                   "gpu_price_per_hour", "frontier_price_per_1k_tokens"])
@pytest.mark.parametrize("bad", [None, math.nan, -3.0])
def test_bad_cost_input_fails_closed_naming_it(field: str, bad: float | None) -> None:
    costs = dataclasses.replace(COSTS, **{field: bad})
    result = decide(dataclasses.replace(PASSING, costs=costs), T)
    assert not result.go and result.payback is None
    assert {c.name for c in result.failed} == {"payback"}
    assert field in result.reasons[0]


def test_missing_gold_pairs_fails_closed() -> None:
    assert _failed(dataclasses.replace(PASSING, gold_pairs=None)) == {"data"}


def test_non_finite_threshold_fails_closed() -> None:
    result = decide(PASSING, dataclasses.replace(T, min_accuracy_margin=math.nan))
    assert not result.go


def test_no_champion_yet_passes_stated() -> None:
    result = decide(PASSING, T)
    check = next(c for c in result.checks if c.name == "champion")
    assert check.passed and "no champion yet" in check.detail


def test_a_go_never_replaces_a_stronger_champion() -> None:
    # Beats the frontier comfortably, but may be 5 points worse than the champion.
    worse = dataclasses.replace(PASSING, champion=ChampionInputs("3", -0.02, -0.05, 0.01))
    result = decide(worse, T)
    assert not result.go and {c.name for c in result.failed} == {"champion"}
    assert "version 3" in result.reasons[0] and "gate.champion_margin" in result.reasons[0]
    # Within the margin (lower bound -0.02 >= -0.02): non-inferior, GO.
    close = dataclasses.replace(PASSING, champion=ChampionInputs("3", 0.0, -0.02, 0.02))
    assert _failed(close) == set()
    wider = dataclasses.replace(T, champion_margin=0.06)
    assert _failed(worse, wider) == set()


def test_a_registered_champion_that_was_not_evaluated_fails_closed() -> None:
    missing = dataclasses.replace(PASSING, champion=ChampionInputs("2", problem="not run"))
    assert _failed(missing) == {"champion"}
    nan = dataclasses.replace(PASSING, champion=ChampionInputs("2", math.nan, math.nan, 0.1))
    assert _failed(nan) == {"champion"}
