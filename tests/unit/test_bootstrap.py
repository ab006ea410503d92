"""Bootstrap intervals: contain the mean, shrink with n, match the normal approximation,
pair correctly, deterministic by seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from searchrl.eval.metrics import bootstrap_mean_ci, paired_bootstrap_delta


def test_interval_brackets_the_mean_and_is_deterministic() -> None:
    vals = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    a = bootstrap_mean_ci(vals, samples=500, seed=3)
    b = bootstrap_mean_ci(vals, samples=500, seed=3)
    assert a == b
    assert a.lo <= a.mean <= a.hi
    assert a.mean == pytest.approx(5 / 8)
    assert a.n == 8


def test_constant_values_give_zero_width() -> None:
    ci = bootstrap_mean_ci([1.0] * 20, samples=200)
    assert ci.lo == ci.hi == ci.mean == 1.0
    assert ci.excludes_zero


def test_width_matches_normal_approximation_and_shrinks_with_n() -> None:
    rng = np.random.default_rng(0)
    small = rng.integers(0, 2, 100).astype(float).tolist()
    large = rng.integers(0, 2, 1600).astype(float).tolist()
    ci_s = bootstrap_mean_ci(small, samples=2000, seed=1)
    ci_l = bootstrap_mean_ci(large, samples=2000, seed=1)
    p = ci_l.mean
    expected = 2 * 1.96 * math.sqrt(p * (1 - p) / 1600)
    assert ci_l.hi - ci_l.lo == pytest.approx(expected, rel=0.15)
    # 16x the data -> about a quarter of the width.
    assert (ci_l.hi - ci_l.lo) < 0.4 * (ci_s.hi - ci_s.lo)


def test_higher_level_is_wider() -> None:
    vals = [float(i % 3 == 0) for i in range(90)]
    narrow = bootstrap_mean_ci(vals, samples=1000, level=0.8)
    wide = bootstrap_mean_ci(vals, samples=1000, level=0.99)
    assert wide.lo < narrow.lo and wide.hi > narrow.hi


def test_paired_delta_sign_and_identity() -> None:
    a = [1.0] * 30 + [0.0] * 10
    b = [0.0] * 20 + [1.0] * 10 + [0.0] * 10
    d = paired_bootstrap_delta(a, b, samples=1000)
    assert d.mean == pytest.approx(0.5)
    assert d.excludes_zero and d.lo > 0
    same = paired_bootstrap_delta(a, a, samples=100)
    assert same.mean == same.lo == same.hi == 0.0
    assert not same.excludes_zero


def test_pairing_is_tighter_than_independent_when_correlated() -> None:
    rng = np.random.default_rng(5)
    base = rng.integers(0, 2, 200).astype(float)
    flips = rng.random(200) < 0.1
    better = np.where(flips, 1.0, base)
    paired = paired_bootstrap_delta(better.tolist(), base.tolist(), samples=1000)
    ci_a = bootstrap_mean_ci(better.tolist(), samples=1000)
    ci_b = bootstrap_mean_ci(base.tolist(), samples=1000)
    assert (paired.hi - paired.lo) < 0.5 * ((ci_a.hi - ci_a.lo) + (ci_b.hi - ci_b.lo))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        paired_bootstrap_delta([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="level"):
        bootstrap_mean_ci([1.0], level=1.5)
    with pytest.raises(ValueError, match="samples"):
        bootstrap_mean_ci([1.0], samples=0)
    empty = bootstrap_mean_ci([], samples=10)
    assert empty.n == 0 and math.isnan(empty.mean)
