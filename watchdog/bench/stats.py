"""The bench's statistics: percentiles with bootstrap intervals, and the difference of two.

Pure: lists of TTFTs in, numbers out. The bootstrap is seeded, so the same rows always give
the same interval (a stored run shown twice reads the same). Percentiles are numpy's default
(linear interpolation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 20260


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def percentile_interval(
    values: Sequence[float],
    q: float,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """The `q`th percentile (0-100) with its bootstrap 95 % interval; None for no values."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
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
    own: the two runs are independent samples). None when either side has no values."""
    if not a or not b:
        return None
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    pa = np.percentile(rng.choice(xa, size=(resamples, xa.size), replace=True), q, axis=1)
    pb = np.percentile(rng.choice(xb, size=(resamples, xb.size), replace=True), q, axis=1)
    diff = pb - pa
    tail = (1 - CONFIDENCE) / 2 * 100
    return Interval(
        value=float(np.percentile(xb, q) - np.percentile(xa, q)),
        low=float(np.percentile(diff, tail)),
        high=float(np.percentile(diff, 100 - tail)),
    )


def verdict(diff: Interval | None) -> str:
    """ "faster" when the whole interval is below zero, "slower" above, else no difference."""
    if diff is None:
        return "not measured"
    if diff.high < 0:
        return "faster"
    if diff.low > 0:
        return "slower"
    return "no difference shown"


def rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None
