"""A batch job that starts, or comes back, into an allowance it left unused: ramped or all at once.

The gateway ramps a raise (`--batch-ramp`), and since `--batch-ramp-idle` it also ramps a
job that returns to an allowance it has left unused for that long, with nobody waiting. This
runs both ways side by side in the heat lab, on the same seeds (the same chat, to the
request), behind the slot line as the shipped gateway runs:

- hr-night-cooling-late-batch, whose job starts 20 minutes in, as bundled;
- job-start variants of scenarios built for other things (no batch until 20 minutes, then
  the scenario's own job), and job-pause variants (the job stops for 10 minutes at 30 and
  comes back at 40);

under the gateway's default allowance (8), a larger static one, and ours. Per row: chat TTFT
p95 and worst over the minute after each start (pooled over seeds), 1-minute windows over
target in those minutes and in the whole run, and batch tokens per second.

    .venv/bin/python tests/benchmarks/bench_ramp_idle.py [--seeds 0,1,2,3,4] [--fast]

`--rates` asks how fast a ramp is safe instead: the job-start variants of three cards, a
static allowance of the job's size, at `--batch-ramp` 0.5, 1, 2 and 4 a second and all at
once (docs/gateway.md, "Ramped again after idle").

    .venv/bin/python tests/benchmarks/bench_ramp_idle.py --rates --seeds 0,1
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_control as bc  # noqa: E402

from llm_watchdog.gateway.config import DEFAULT_BATCH_RAMP_IDLE_S  # noqa: E402
from llm_watchdog.sim.scenario import Scenario, ScheduleEvent, load_scenario  # noqa: E402
from llm_watchdog.sim.virtual import run_virtual  # noqa: E402
from llm_watchdog.stats import quantile  # noqa: E402

START_S = 1200.0
PAUSE_S, BACK_S = 1800.0, 2400.0


def job_start(s: Scenario) -> tuple[Scenario, list[float]]:
    """`s` with no batch until START_S, then its own job."""
    streams = s.batch.streams
    sched = sorted(
        [*s.schedule, ScheduleEvent(at_s=START_S, batch_streams=streams)], key=lambda e: e.at_s
    )
    out = dataclasses.replace(
        s,
        name=f"{s.name}+start",
        batch=dataclasses.replace(s.batch, streams=0),
        schedule=tuple(sched),
    )
    return out, [START_S]


def job_pause(s: Scenario) -> tuple[Scenario, list[float]]:
    """`s` with its job stopped from PAUSE_S to BACK_S."""
    streams = s.batch.streams
    extra = [
        ScheduleEvent(at_s=PAUSE_S, batch_streams=0),
        ScheduleEvent(at_s=BACK_S, batch_streams=streams),
    ]
    sched = sorted([*s.schedule, *extra], key=lambda e: e.at_s)
    return dataclasses.replace(s, name=f"{s.name}+pause", schedule=tuple(sched)), [BACK_S]


def cases(fast: bool) -> list[tuple[Scenario, list[float]]]:
    out = [(load_scenario("hr-night-cooling-late-batch"), [START_S])]
    others = (
        ["consumer-warm-room", "workstation"]
        if fast
        else [
            "consumer-warm-room",
            "workstation",
            "datacenter",
            "sunny-window-job-grows",
        ]
    )
    for name in others:
        s = load_scenario(name)
        s = dataclasses.replace(s, duration_s=min(s.duration_s, 3600.0))
        out.append(job_start(s))
        out.append(job_pause(s))
    return out


def run_lab(s: Scenario, spec: str, seed: int, **ramp: float) -> tuple[Any, Any]:
    """`spec` over `s` behind the slot line, as the shipped gateway runs; `ramp` sets the
    gateway's ramp_per_s or ramp_idle_s. The recording controller (its chat samples) and
    the run's result."""
    rec = bc.make(spec, s)
    r = run_virtual(s, s.duration_s, rec, seed=seed, warmup_s=bc.WARMUP_S, hold_slots=True, **ramp)
    return rec, r


def run_one(s: Scenario, starts: list[float], spec: str, seed: int, idle_s: float) -> dict:
    rec, r = run_lab(s, spec, seed, ramp_idle_s=idle_s)
    minutes = [[v for t, v in rec.samples if a <= t < a + 60.0] for a in starts]
    after = [v for m in minutes for v in m]
    slo = s.slo_chat_ttft_p95_ms
    bad_after = sum(1 for m in minutes if m and quantile(m, 0.95) > slo)
    return {
        "after": after,
        "bad_after": bad_after,
        "bad": bc.attained(r)[1],
        "tok_s": r.batch_tokens_per_s,
    }


def first_minute(s: Scenario, start: float, spec: str, seed: int, ramp_per_s: float) -> list[float]:
    """Chat TTFTs of the minute after `start`, the job let in at `ramp_per_s`."""
    rec, _ = run_lab(s, spec, seed, ramp_per_s=ramp_per_s)
    return [v for t, v in rec.samples if start <= t < start + 60.0]


def rates(seeds: list[int]) -> None:
    print(
        f"{'card':20s} {'slots':>5s} {'allowance':>9s} {'ramp/s':>6s} {'p95 1st min':>11s} "
        f"{'minutes over':>12s}"
    )
    for name in ("datacenter", "workstation", "consumer-warm-room"):
        s = load_scenario(name)
        s, starts = job_start(dataclasses.replace(s, duration_s=START_S + 600.0))
        streams = max(e.batch_streams or 0 for e in s.schedule)
        for per_s in (0.5, 1.0, 2.0, 4.0, 0.0):
            minutes = [
                first_minute(s, starts[0], f"static:{streams}", seed, per_s) for seed in seeds
            ]
            after = [v for m in minutes for v in m]
            over = sum(1 for m in minutes if m and quantile(m, 0.95) > s.slo_chat_ttft_p95_ms)
            label = f"{per_s:g}" if per_s > 0 else "at once"
            print(
                f"{name:20s} {s.engine.max_running_seqs:5d} {streams:9d} {label:>6s} "
                f"{quantile(after, 0.95):9.0f}ms {over:6d} of {len(seeds)}",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--fast", action="store_true", help="two variant scenarios, not four")
    ap.add_argument("--rates", action="store_true", help="how fast a ramp is safe, per card")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.rates:
        rates(seeds)
        return
    print(
        f"{'scenario':34s} {'allowance':9s} {'idle':>5s} {'p95 1st min':>11s} {'worst':>7s} "
        f"{'bad 1st':>7s} {'bad run':>7s} {'tok/s':>7s}"
    )
    totals: dict[tuple[str, float], list[float]] = {}
    for s, starts in cases(args.fast):
        static_hi = "static:16" if s.engine.max_running_seqs >= 32 else "static:12"
        for spec in ("static:8", static_hi, "ours"):
            for idle_s in (0.0, DEFAULT_BATCH_RAMP_IDLE_S):
                rows = [run_one(s, starts, spec, seed, idle_s) for seed in seeds]
                after = [v for r in rows for v in r["after"]]
                p95 = quantile(after, 0.95) if after else math.nan
                worst = max(after, default=math.nan)
                bad_after = sum(r["bad_after"] for r in rows)
                bad = sum(r["bad"] for r in rows)
                tok = sum(r["tok_s"] for r in rows) / len(rows)
                t = totals.setdefault((spec.split(":")[0], idle_s), [0, 0, 0.0])
                t[0] += bad_after
                t[1] += bad
                t[2] += tok
                print(
                    f"{s.name[:34]:34s} {spec:9s} {idle_s:5.0f} {p95:9.0f}ms {worst:5.0f}ms "
                    f"{bad_after:7d} {bad:7d} {tok:7.1f}",
                    flush=True,
                )
    print()
    print("over every case and seed: missed first minutes, missed windows, tok/s (idle / off)")
    for kind in ("static", "ours"):
        off, on = totals[(kind, 0.0)], totals[(kind, DEFAULT_BATCH_RAMP_IDLE_S)]
        print(
            f"  {kind:6s} first minutes {off[0]:3d} -> {on[0]:3d}   "
            f"run {off[1]:3d} -> {on[1]:3d}   tok/s x{on[2] / off[2]:.3f}"
        )


if __name__ == "__main__":
    main()
