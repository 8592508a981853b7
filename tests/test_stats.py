"""Robust statistics helpers: checked against numpy and against their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llm_watchdog import stats


@pytest.fixture
def sample() -> list[float]:
    rng = np.random.default_rng(7)
    return rng.standard_t(4, 101).tolist()


def test_median_and_quantiles_match_numpy(sample: list[float]) -> None:
    assert stats.median(sample) == pytest.approx(float(np.median(sample)))
    assert stats.median(sample[:10]) == pytest.approx(float(np.median(sample[:10])))
    for q in (0.0, 0.05, 0.5, 0.95, 1.0):
        assert stats.quantile(sample, q) == pytest.approx(float(np.quantile(sample, q)))


def test_empty_and_out_of_range_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="no values"):
        stats.median([])
    with pytest.raises(ValueError, match="outside"):
        stats.quantile([1.0], 1.5)


def test_mad_ignores_a_wild_value() -> None:
    xs = [10.0, 11.0, 9.0, 10.5, 9.5]
    assert stats.mad(xs) == pytest.approx(0.5)
    assert stats.mad([*xs, 1e9]) == pytest.approx(0.75)  # the mean would be ruined, MAD is not
    rng = np.random.default_rng(3)
    normal = rng.normal(0.0, 2.0, 20_000).tolist()
    assert stats.robust_sigma(normal) == pytest.approx(2.0, rel=0.03)


def test_mean_variance_and_lag1_autocorrelation() -> None:
    assert stats.variance([1.0, 2.0, 3.0, 4.0]) == pytest.approx(np.var([1, 2, 3, 4]))
    rng = np.random.default_rng(11)
    e = rng.normal(size=20_000)
    ar = np.empty_like(e)
    prev = 0.0
    for i, v in enumerate(e):
        prev = 0.6 * prev + v
        ar[i] = prev
    assert stats.lag1_autocorr(ar.tolist()) == pytest.approx(0.6, abs=0.02)
    assert stats.lag1_autocorr(e.tolist()) == pytest.approx(0.0, abs=0.03)
    assert stats.lag1_autocorr([5.0, 5.0, 5.0]) == 0.0


def test_clipped_normal_mean_against_monte_carlo() -> None:
    rng = np.random.default_rng(5)
    z = rng.normal(size=400_000)
    for shift, c in ((0.0, 3.0), (1.0, 3.0), (3.4, 3.0), (2.0, 1.5)):
        mc = float(np.clip(z + shift, -c, c).mean())
        assert stats.clipped_normal_mean(shift, c) == pytest.approx(mc, abs=0.01)


def test_binomial_tail() -> None:
    n, p = 30, 0.07
    direct = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(8, n + 1))
    assert stats.binom_sf(8, n, p) == pytest.approx(direct)
    assert stats.binom_sf(0, n, p) == 1.0
    assert stats.binom_sf(31, n, p) == 0.0


def test_cusum_threshold_inverts_the_arl_formula() -> None:
    for k in (0.3, 0.5, 1.0):
        h = stats.cusum_threshold(1e5, k)
        assert stats.cusum_arl0(h, k) == pytest.approx(1e5, rel=1e-6)
        assert stats.cusum_threshold(1e6, k) > h  # rarer false alarms need a higher bar
    # k = 0.5, h = 5: about 930 probes one-sided (twice the 465 of the two-sided tables in
    # Montgomery, "Introduction to Statistical Quality Control").
    assert stats.cusum_arl0(5.0, 0.5) == pytest.approx(938, rel=0.05)


def test_ewma_mean_and_half_life() -> None:
    e = stats.Ewma.from_half_life(10)
    for _ in range(10):
        e.update(0.0)
    assert e.mean == 0.0
    for _ in range(10):
        e.update(1.0)
    assert e.mean == pytest.approx(0.5, abs=1e-9)  # half-way after one half-life
    with pytest.raises(ValueError, match="alpha"):
        stats.Ewma(0.0)


def test_window_slope_follows_a_trend_and_forgets_the_past() -> None:
    ws = stats.WindowSlope(300.0)
    t0 = 1.7e9
    for i in range(60):  # 10 min at 1 °C/min
        ws.add(t0 + 10 * i, 60.0 + i / 6.0)
    assert ws.slope() == pytest.approx(1.0 / 60.0)
    for i in range(60, 120):  # then flat: after 5 min only the flat part is in the window
        ws.add(t0 + 10 * i, 70.0)
    assert ws.slope() == pytest.approx(0.0, abs=1e-12)
    assert ws.span_s == 300.0


def test_window_slope_stays_exact_over_weeks() -> None:
    ws = stats.WindowSlope(300.0)
    t0 = 1.7e9
    n = 7 * 24 * 360  # a week at 10 s
    for i in range(n):
        ws.add(t0 + 10 * i, 50.0 + 0.001 * i + (i % 3))  # a trend and a sawtooth
    recent = [(10.0 * i, 50.0 + 0.001 * i + (i % 3)) for i in range(n - 31, n)]
    want = float(np.polyfit([t for t, _ in recent], [y for _, y in recent], 1)[0])
    assert ws.slope() == pytest.approx(want, rel=1e-6)
