"""Robust statistics for small samples: median, MAD, quantiles, EWMA, a windowed slope, ARL.

Pure functions over plain sequences. They run once per probe inside the drift monitor, so they
are written for lists of tens to hundreds of floats (no numpy round trip for 20 values); the
results match numpy's defaults (`np.quantile(..., method="linear")`, population variance).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

# 1 / Phi^-1(3/4): makes the median absolute deviation a consistent estimate of the standard
# deviation for normal data (Rousseeuw & Croux 1993, "Alternatives to the MAD", JASA 88).
MAD_TO_SIGMA = 1.4826


def median(values: Iterable[float]) -> float:
    """Median of the values; ValueError when there are none."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    return xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation from `center` (the median when None), unscaled."""
    c = median(values) if center is None else center
    return median(abs(x - c) for x in values)


def robust_sigma(values: Sequence[float]) -> float:
    """1.4826 x MAD: a standard deviation that a few wild values cannot move."""
    return MAD_TO_SIGMA * mad(values)


def quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by linear interpolation between order statistics.

    Same definition as numpy's default ("linear", Hyndman & Fan type 7), so a p95 printed here
    matches one computed from an exported trace with numpy or pandas.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("quantile of no values")
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def variance(values: Sequence[float]) -> float:
    """Population variance (divides by n)."""
    m = mean(values)
    return math.fsum((x - m) ** 2 for x in values) / len(values)


def lag1_autocorr(values: Sequence[float]) -> float:
    """Lag-1 autocorrelation of a series in time order; 0.0 when it is too short or constant."""
    n = len(values)
    if n < 3:
        return 0.0
    m = mean(values)
    den = math.fsum((x - m) ** 2 for x in values)
    if den <= 0.0:
        return 0.0
    num = math.fsum((values[i] - m) * (values[i - 1] - m) for i in range(1, n))
    return num / den


def clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def normal_pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def clipped_normal_mean(shift: float, c: float) -> float:
    """E[clip(Z + shift, -c, c)] for Z standard normal.

    How much of a location shift survives the clipping a robust detector applies: for
    shift << c nearly all of it, for shift >> c about c.
    """
    a, b = -c - shift, c - shift  # clip limits in Z's own coordinates
    inside = shift * (normal_cdf(b) - normal_cdf(a)) + (normal_pdf(a) - normal_pdf(b))
    return inside + c * (1.0 - normal_cdf(b)) - c * normal_cdf(a)


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly (n is a window of tens)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    p = clip(p, 0.0, 1.0)
    if p in (0.0, 1.0):
        return 1.0 if p == 1.0 else 0.0
    return math.fsum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k, n + 1))


def cusum_arl0(h: float, k: float) -> float:
    """In-control average run length of a one-sided CUSUM, Siegmund's approximation.

    Increments of unit variance and mean -k; alarm when S >= h. ARL0 ~ (e^{2kb} - 2kb - 1) /
    (2k^2) with b = h + 1.166 (Siegmund 1985, "Sequential Analysis", ch. X; the 1.166 corrects
    for overshoot of a normal walk). Within a few percent of Markov-chain values for h >= 3.
    """
    if k <= 0:
        raise ValueError("CUSUM reference value k must be > 0")
    b = h + 1.166
    x = 2.0 * k * b
    if x > 700:  # exp would overflow a float; the ARL is astronomically large anyway
        return math.inf
    return (math.exp(x) - x - 1.0) / (2.0 * k * k)


def cusum_threshold(arl0: float, k: float) -> float:
    """Smallest h whose `cusum_arl0(h, k)` reaches `arl0` (bisection; ARL grows with h)."""
    if arl0 <= 1:
        raise ValueError("target ARL0 must be > 1")
    lo, hi = 0.0, 1.0
    while cusum_arl0(hi, k) < arl0:
        hi *= 2.0
        if hi > 1e6:
            raise ValueError(f"no CUSUM threshold reaches ARL0 {arl0} with k={k}")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if cusum_arl0(mid, k) < arl0:
            lo = mid
        else:
            hi = mid
    return hi


class Ewma:
    """Exponentially weighted mean and variance (West 1979 / Finch 2009 "Incremental
    calculation of weighted mean and variance"). `alpha` is the weight of the newest value."""

    def __init__(self, alpha: float) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"EWMA alpha {alpha} is outside (0, 1]")
        self.alpha = alpha
        self.mean: float | None = None
        self.var = 0.0
        self.n = 0

    @classmethod
    def from_half_life(cls, samples: float) -> Ewma:
        """The EWMA whose weights halve every `samples` values."""
        if samples <= 0:
            raise ValueError("half-life must be > 0")
        return cls(1.0 - 0.5 ** (1.0 / samples))

    def update(self, x: float) -> float:
        self.n += 1
        if self.mean is None:
            self.mean = x
            return x
        diff = x - self.mean
        incr = self.alpha * diff
        self.mean += incr
        self.var = (1.0 - self.alpha) * (self.var + diff * incr)
        return self.mean


class WindowSlope:
    """Least-squares slope of y against t over the points of the last `window_s` seconds.

    Kept as running sums, O(1) per point. Times are taken relative to an origin inside the
    window, moved forward (and the sums recomputed) once it falls far behind, so neither unix
    timestamps nor weeks of add/subtract round-off eat the precision.
    """

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("slope window must be > 0 s")
        self.window_s = window_s
        self._points: deque[tuple[float, float]] = deque()
        self._t0: float | None = None
        self._st = self._sy = self._stt = self._sty = 0.0

    def add(self, t: float, y: float) -> None:
        if self._t0 is None:
            self._t0 = t
        x = t - self._t0
        self._points.append((x, y))
        self._st += x
        self._sy += y
        self._stt += x * x
        self._sty += x * y
        while self._points and self._points[0][0] < x - self.window_s:
            ox, oy = self._points.popleft()
            self._st -= ox
            self._sy -= oy
            self._stt -= ox * ox
            self._sty -= ox * oy
        if self._points[0][0] > 10.0 * self.window_s:
            self._rebase()

    def _rebase(self) -> None:
        shift = self._points[0][0]
        assert self._t0 is not None
        self._t0 += shift
        self._points = deque((x - shift, y) for x, y in self._points)
        self._st = math.fsum(x for x, _ in self._points)
        self._sy = math.fsum(y for _, y in self._points)
        self._stt = math.fsum(x * x for x, _ in self._points)
        self._sty = math.fsum(x * y for x, y in self._points)

    def __len__(self) -> int:
        return len(self._points)

    @property
    def span_s(self) -> float:
        return self._points[-1][0] - self._points[0][0] if self._points else 0.0

    def slope(self) -> float | None:
        """dy/dt per second, or None with fewer than 3 points or no time spread."""
        n = len(self._points)
        if n < 3:
            return None
        den = n * self._stt - self._st * self._st
        if den <= 1e-9 * max(1.0, n * self._stt):
            return None
        return (n * self._sty - self._st * self._sy) / den

    def reset(self) -> None:
        self._points.clear()
        self._t0 = None
        self._st = self._sy = self._stt = self._sty = 0.0
