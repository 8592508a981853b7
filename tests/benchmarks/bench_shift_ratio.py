"""What `drift.shift_ratio` buys: 1.2x latency steps (no telemetry to help) at canary noise
sigma 0.25, and latency events over two-day traces of stationary noise, for each setting.

    .venv/bin/python tests/benchmarks/bench_shift_ratio.py [--ratios 1.3,1.2] [--seeds 12]

Noise as in bench_detector.py: AR(1) (rho 0.3) with Student-t(4) innovations and 1 % spikes,
one probe per 10 s, a 300-probe baseline, two quiet hours, then the step.
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
    args = ap.parse_args()
    for ratio in (float(r) for r in args.ratios.split(",")):
        cfg = DriftConfig(shift_ratio=ratio)
        rng = np.random.default_rng(7)
        delays: list[int | None] = []
        for _ in range(args.seeds):
            n = bd.WARMUP + 300
            x = bd.ar_t_noise(rng, n, SIGMA, RHO)
            x[bd.WARMUP :] += math.log(STEP)
            res = bd.run_ours(bd.Trace("step", bd.to_obs(x, bd.quiet_gpu(rng, n))), cfg)
            after = [i - bd.WARMUP for i in res["latency"] if i >= bd.WARMUP]  # type: ignore[union-attr]
            delays.append(after[0] if after else None)
        found = [d for d in delays if d is not None]
        within = sum(1 for d in found if d <= 30)
        false_alarms = 0
        for _ in range(args.quiet):
            n = 300 + TWO_DAYS
            x = bd.ar_t_noise(rng, n, SIGMA, RHO)
            res = bd.run_ours(bd.Trace("quiet", bd.to_obs(x, bd.quiet_gpu(rng, n))), cfg)
            false_alarms += len([i for i in res["latency"] if i >= 300])  # type: ignore[union-attr]
        median = statistics.median(found) if found else None
        print(
            f"shift_ratio {ratio:g}: {STEP:g}x steps at sigma {SIGMA:g} found within 30 probes "
            f"{within}/{args.seeds} (found at all {len(found)}), delay median {median}, "
            f"max {max(found) if found else None}; latency events in {args.quiet} x 2 days "
            f"of noise: {false_alarms}"
        )


if __name__ == "__main__":
    main()
