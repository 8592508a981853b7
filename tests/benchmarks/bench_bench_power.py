"""How many chat probes a bench level needs before `bench compare` can tell two p95s apart.

TTFTs are drawn lognormal (σ of ln = 0.5, the spread the heat lab's engine shows), run B's
p95 truly `shift` higher than run A's. For each probe count the script prints the median
width of the p95 bootstrap interval (relative to the p95) and how often the comparison's
verdict is "slower" (its power) and, with no shift, how often it says anything but "no
difference shown" (its false alarms). Pure computation, about 20 s.

    python tests/benchmarks/bench_bench_power.py [--trials 60]
"""

from __future__ import annotations

import argparse

import numpy as np

from llm_watchdog.bench.stats import percentile_difference, percentile_interval, verdict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--shift", type=float, default=0.25, help="B's true p95 over A's, minus 1")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    print(f"{'probes':>6}  {'p95 CI width':>12}  {'power':>6}  {'false alarms':>12}")
    for n in (20, 50, 100, 200, 400):
        widths, hits, alarms = [], 0, 0
        for t in range(args.trials):
            a = rng.lognormal(np.log(200), 0.5, n)
            b = rng.lognormal(np.log(200 * (1 + args.shift)), 0.5, n)
            same = rng.lognormal(np.log(200), 0.5, n)
            iv = percentile_interval(list(a), 95, seed=t)
            assert iv is not None
            widths.append((iv.high - iv.low) / iv.value)
            hits += verdict(percentile_difference(list(a), list(b), seed=t)) == "slower"
            alarms += verdict(percentile_difference(list(a), list(same), seed=t)) != (
                "no difference shown"
            )
        print(
            f"{n:>6}  {np.median(widths):>11.0%}  {hits / args.trials:>6.0%}  "
            f"{alarms / args.trials:>12.0%}"
        )


if __name__ == "__main__":
    main()
