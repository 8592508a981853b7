"""The bench's statistics: percentiles with bootstrap intervals, and the difference of two.

Pure: lists of TTFTs in, numbers out. The bootstrap is seeded, so the same rows always give
the same interval (a stored run shown twice reads the same). Percentiles are numpy's default
(linear interpolation).

A tail percentile from a handful of values is about their maximum, and a bootstrap cannot
reach above the maximum: its interval is too narrow and a verdict drawn from it is often
wrong. Below `min_values(q)` values there is no interval (`low`, `high` are None) and no
verdict ("too few probes"); the percentile itself is still given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20260
# The fewest values an interval is given from. With lognormal TTFTs (tests/benchmarks/
# bench_bench_power.py, docs/bench.md) the p95 verdict with no true shift is wrong 33 % of
# the time from 2 values, 17 % from 5, 10 % from 10 and 8 % from 20 (nominal: 5 %), and the
# p95 interval holds the true p95 in 8 %, 24 %, 38 % and 60 % of trials: below 20 the
# interval says more than the values do. From 20 to `compare.MIN_PROBES` (50) an interval
# and a verdict are given with a warning.
MIN_INTERVAL_VALUES = 20
TOO_FEW = "too few probes"


@dataclass(frozen=True)
class Interval:
    """A percentile (or a difference of two) and its bootstrap 95 % interval; `low` and
    `high` are None where too few values stand behind it for an interval."""

    value: float
    low: float | None
    high: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "low": self.low, "high": self.high}


def min_values(q: float) -> int:
    """The fewest values the `q`th percentile (below 100) gets an interval from:
    MIN_INTERVAL_VALUES, and for a tail beyond the 95th enough that one value in expectation
    lies above the percentile (100 for the 99th); with fewer it is about the maximum."""
    return max(MIN_INTERVAL_VALUES, math.ceil(100 / (100 - q) - 1e-9))


def too_few_note(n: int, q: float = 95) -> str:
    """What a level with `n` values says instead of an interval."""
    return (
        f"{TOO_FEW}: {n} right answer{'' if n == 1 else 's'}, a p{q:g} interval needs "
        f"{min_values(q)}; run longer levels (--duration)"
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`th percentile (0-100); None for no values."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def percentile_interval(
    values: Sequence[float],
    q: float,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """The `q`th percentile (0-100) with its bootstrap 95 % interval; None for no values, no
    interval (`low`, `high` None) for fewer than `min_values(q)`."""
    if not len(values):
        return None
    arr = np.asarray(values, dtype=float)
    if arr.size < min_values(q):
        return Interval(value=float(np.percentile(arr, q)), low=None, high=None)
    rng = np.random.default_rng(seed)
    boot = np.percentile(rng.choice(arr, size=(resamples, arr.size), replace=True), q, axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return Interval(
        value=float(np.percentile(arr, q)),
        low=float(np.percentile(boot, tail)),
        high=float(np.percentile(boot, 100 - tail)),
    )


def percentile_difference(
    a: Sequence[float],
    b: Sequence[float],
    q: float = 95,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """b's percentile minus a's, with a bootstrap 95 % interval (each side resampled on its
    own: the two runs are independent samples). None when either side has no values, no
    interval when either has fewer than `min_values(q)`."""
    if not len(a) or not len(b):
        return None
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    point = float(np.percentile(xb, q) - np.percentile(xa, q))
    if min(xa.size, xb.size) < min_values(q):
        return Interval(value=point, low=None, high=None)
    rng = np.random.default_rng(seed)
    pa = np.percentile(rng.choice(xa, size=(resamples, xa.size), replace=True), q, axis=1)
    pb = np.percentile(rng.choice(xb, size=(resamples, xb.size), replace=True), q, axis=1)
    diff = pb - pa
    tail = (1 - CONFIDENCE) / 2 * 100
    return Interval(
        value=point,
        low=float(np.percentile(diff, tail)),
        high=float(np.percentile(diff, 100 - tail)),
    )


def verdict(diff: Interval | None) -> str:
    """ "faster" when the whole interval is below zero, "slower" above, else no difference;
    "too few probes" where there is no interval."""
    if diff is None:
        return "not measured"
    if diff.low is None or diff.high is None:
        return TOO_FEW
    if diff.high < 0:
        return "faster"
    if diff.low > 0:
        return "slower"
    return "no difference shown"


def rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None
