"""Heat-lab benchmark: two simulated hours per scenario in virtual time, wall time printed.

    .venv/bin/python tests/benchmarks/bench_sim.py [--duration 2h] [SCENARIO ...]

Also prints the llamacpp-cpu calibration table beside the measured figures.
"""

from __future__ import annotations

import argparse
import time

from llm_watchdog.durations import parse_duration
from llm_watchdog.sim.scenario import available_scenarios, load_scenario
from llm_watchdog.sim.virtual import run_virtual

MEASURED = {0: (159, 182, None), 2: (192, 5960, 29), 4: (211, 10100, None), 7: (279, 6700, 41)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("scenarios", nargs="*")
    ap.add_argument("--duration", default="2h")
    args = ap.parse_args()
    duration = parse_duration(args.duration)
    names = args.scenarios or available_scenarios()
    print(
        f"{'scenario':<20} {'controller':<10} {'sim':>5} {'wall s':>7} {'chat p95 ms':>12} "
        f"{'batch tok/s':>11} {'peak °C':>8}"
    )
    for name in names:
        sc = load_scenario(name)
        for ctl in ("none", f"static:{max(1, sc.batch.streams // 4)}"):
            t0 = time.perf_counter()
            r = run_virtual(sc, duration, ctl)
            wall = time.perf_counter() - t0
            p95 = "-" if r.chat_ttft_p95_ms is None else f"{r.chat_ttft_p95_ms:,.0f}"
            print(
                f"{name:<20} {ctl:<10} {args.duration:>5} {wall:>7.2f} {p95:>12} "
                f"{r.batch_tokens_per_s:>11,.1f} {r.peak_temp_c:>8.1f}"
            )
    print()
    print("llamacpp-cpu calibration (30 simulated minutes per row; measured in brackets)")
    sc = load_scenario("llamacpp-cpu")
    for n, (p50, p95, cps) in MEASURED.items():
        r = run_virtual(sc, 1800, batch_streams=n, seed=1)
        chars = f"{r.batch_chars_per_s:5.1f} [{cps if cps is not None else '-'}]"
        print(
            f"  {n} batch streams: chat p50 {r.chat_ttft_p50_ms:6.0f} [{p50}] ms, "
            f"p95 {r.chat_ttft_p95_ms:7.0f} [{p95}] ms, batch chars/s {chars}"
        )


if __name__ == "__main__":
    main()
