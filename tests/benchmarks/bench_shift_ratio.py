"""What `drift.shift_ratio` buys: 1.2x latency steps (no telemetry to help) at canary noise
sigma 0.25, and latency events over two-day traces of stationary noise, for each setting.

    .venv/bin/python tests/benchmarks/bench_shift_ratio.py [--ratios 1.3,1.2] [--seeds 12]

Noise as in bench_detector.py: AR(1) (rho 0.3) with Student-t(4) innovations and 1 % spikes,
one probe per 10 s, a 300-probe baseline, two quiet hours, then the step.

`--ideal` adds the ceiling any test of the canary TTFT alone can reach: a CUSUM told the true
baseline (no estimate to be wrong), on independent Gaussian noise of the same sigma (no
correlation, no heavy tail, no spikes), with k = ln(1.2) / 2 (optimal for this step) and h
the lowest that lets 90 % (or 50 %) of two-day noise traces pass with no alarm. CUSUM is the test
with the shortest worst-case delay for a given false-alarm rate (Lorden, Moustakides), so
the share it finds within 30 probes bounds every detector's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_detector as bd  # noqa: E402

from llm_watchdog.drift import DriftConfig  # noqa: E402

SIGMA, RHO, STEP = 0.25, 0.3, 1.2
TWO_DAYS = int(2 * 86400 / bd.INTERVAL_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratios", default="1.3,1.2")
    ap.add_argument("--seeds", type=int, default=12, help="step traces per setting")
    ap.add_argument("--quiet", type=int, default=3, help="two-day noise traces per setting")
    ap.add_argument("--sigma", type=float, default=SIGMA, help="canary noise, log scale")
    ap.add_argument("--ideal", action="store_true", help="the ideal CUSUM's ceiling too")
    args = ap.parse_args()
    sigma = args.sigma
    if args.ideal:
        for passing in (0.9, 0.5):
            ideal(np.random.default_rng(11), passing, sigma)
    for ratio in (float(r) for r in args.ratios.split(",")):
        cfg = DriftConfig(shift_ratio=ratio)
        rng = np.random.default_rng(7)
        delays: list[int | None] = []
        for _ in range(args.seeds):
            n = bd.WARMUP + 300
            x = bd.ar_t_noise(rng, n, sigma, RHO)
            x[bd.WARMUP :] += math.log(STEP)
            res = bd.run_ours(bd.Trace("step", bd.to_obs(x, bd.quiet_gpu(rng, n))), cfg)
            after = [i - bd.WARMUP for i in res["latency"] if i >= bd.WARMUP]  # type: ignore[union-attr]
            delays.append(after[0] if after else None)
        found = [d for d in delays if d is not None]
        within = sum(1 for d in found if d <= 30)
        false_alarms = 0
        for _ in range(args.quiet):
            n = 300 + TWO_DAYS
            x = bd.ar_t_noise(rng, n, sigma, RHO)
            res = bd.run_ours(bd.Trace("quiet", bd.to_obs(x, bd.quiet_gpu(rng, n))), cfg)
            false_alarms += len([i for i in res["latency"] if i >= 300])  # type: ignore[union-attr]
        median = statistics.median(found) if found else None
        print(
            f"shift_ratio {ratio:g}: {STEP:g}x steps at sigma {sigma:g} found within 30 probes "
            f"{within}/{args.seeds} (found at all {len(found)}), delay median {median}, "
            f"max {max(found) if found else None}; latency events in {args.quiet} x 2 days "
            f"of noise: {false_alarms}"
        )


def ideal(
    rng: np.random.Generator, passing: float, sigma: float, quiet: int = 400, steps: int = 4000
) -> None:
    d = math.log(STEP)
    k = d / 2
    s = np.zeros(quiet)
    peak = np.zeros(quiet)
    for _ in range(TWO_DAYS):  # every trace a step at a time: S = max(0, S + x - k)
        s = np.maximum(0.0, s + rng.normal(0.0, sigma, quiet) - k)
        np.maximum(peak, s, out=peak)
    h = float(np.quantile(peak, passing))
    # The step starts where a quiet stretch leaves S (its in-control level, not zero).
    s = np.zeros(steps)
    for _ in range(300):
        s = np.maximum(0.0, s + rng.normal(0.0, sigma, steps) - k)
    found = np.full(steps, -1)
    for i in range(1, 301):
        s = np.maximum(0.0, s + rng.normal(d, sigma, steps) - k)
        found[(found < 0) & (s >= h)] = i
    hit = found[found > 0]
    print(
        f"ideal CUSUM (true baseline, iid Gaussian sigma {sigma:g}, k {k:.3f}, h {h:.2f} "
        f"passes {passing:.0%} of {quiet} two-day traces): {STEP:g}x steps found within 30 probes "
        f"{np.mean((found > 0) & (found <= 30)):.0%} of {steps}, delay median "
        f"{int(np.median(hit)) if hit.size else None}, 90th percentile "
        f"{int(np.quantile(hit, 0.9)) if hit.size else None}"
    )


if __name__ == "__main__":
    main()
