"""The headroom map's group rule against the SLO it stands for, on probes from the heat lab.

    .venv/bin/python tests/benchmarks/bench_headroom_rule.py \
        [--scenario tests/benchmarks/heldout/office-tight-target.toml] \
        [--levels 0,2,4,6,8,12,16,20] [--seeds 3] [--every 4] [--per-minute N]

Each static allowance runs over the whole scenario in virtual time (slot line held), once per
seed. Every `--every`-th chat answer stands in for a canary probe: its TTFT, the allowance as
its batch in flight, and the thermal state of the minute it arrived in (the minute's clock,
temperature and reason bits, read as the daemon reads a GPU sample). Printed: per run the
share of one-minute windows within the target and the pooled p95; then the map those probes
make under the pooled rule (a group holds with at most 5 % over the target) and under
`--chat-per-minute`'s (`minute_share`: N defaults to the scenario's chat rate a minute, bursts
left out), with each group's count over the target. Where the two answers differ, the runs
above say which one the minutes agree with.
"""

from __future__ import annotations

import argparse
import bisect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llm_watchdog.control.headroom import (  # noqa: E402
    EXCEED_SHARE,
    Observation,
    clock_ratio,
    describe,
    headroom_map,
    minute_share,
)
from llm_watchdog.nvml.throttle import GPU_IDLE  # noqa: E402
from llm_watchdog.sim.cli import window_state  # noqa: E402
from llm_watchdog.sim.scenario import load_scenario  # noqa: E402
from llm_watchdog.sim.virtual import WINDOW_S, run_virtual  # noqa: E402

HELD_OUT = Path(__file__).resolve().parent / "heldout"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default=str(HELD_OUT / "office-tight-target.toml"))
    ap.add_argument("--levels", default="0,2,4,6,8,12,16,20")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--every", type=int, default=4, help="one chat answer in this many is a probe")
    ap.add_argument("--per-minute", type=int, default=None)
    args = ap.parse_args()

    scen = load_scenario(args.scenario)
    gpu = scen.gpu
    target = scen.slo_chat_ttft_p95_ms
    per_minute = args.per_minute or max(1, round(scen.chat.arrivals_per_s * 60.0))
    obs: list[Observation] = []
    print(f"{scen.name}: target {target:.0f} ms, one answer in {args.every} as a probe")
    for level in (int(x) for x in args.levels.split(",")):
        for seed in range(args.seeds):
            r = run_virtual(
                scen, controller=f"static:{level}", seed=seed, warmup_s=120.0, hold_slots=True
            )
            starts = [m.t_s for m in r.minutes]
            for arrival_s, ttft_ms in r.answers[:: args.every]:
                m = r.minutes[max(0, bisect.bisect_right(starts, arrival_s) - 1)]
                # As `sim sweep` reads a window: its clock is the one a kernel got.
                ratio = clock_ratio(m.sm_clock_mhz, gpu.sm_clock_max_mhz, m.reasons & ~GPU_IDLE)
                obs.append(Observation(ttft_ms, level, window_state(m, scen), m.temp_c, ratio))
            met = (r.slo_attainment or 0.0) * 100.0
            p95 = r.chat_ttft_p95_ms or 0.0
            print(
                f"  static {level:3d} seed {seed}: {met:5.1f} % of {r.slo_windows} "
                f"{WINDOW_S:.0f}-s windows, pooled p95 {p95:,.0f} ms"
            )
    for label, share in (
        ("pooled p95", EXCEED_SHARE),
        (f"--chat-per-minute {per_minute}", minute_share(per_minute)),
    ):
        print(f"{label} (a group holds with at most {share * 100:.2f} % over the target):")
        for row in headroom_map(obs, target, share=share):
            print("  " + describe(row))
            for g in row.groups:
                span = str(g.lo) if g.lo == g.hi else f"{g.lo}-{g.hi}"
                print(f"      {span:>6}: {g.over:4d} of {g.n:5d} over, {g.verdict}")


if __name__ == "__main__":
    main()
