"""Where the law leaves batch behind a static allowance, minute by minute, by the rule that held it.

bench_hindsight.py says which runs trail their best static; this says where the batch went.
For one scenario and seed, the law (seeded from the day before, as bench_forms.py runs it)
and a static allowance run the same scenario; the lab draws chat from its own stream, so both
see the same chat to the request. Each minute's batch tokens are subtracted (static − law),
and the difference is put on:

- **a chat burst**, where the minute starts in one of the scenario's bursts or the two
  minutes after it (the shed, and the regrowth after it);
- otherwise **the decision in force at the minute's end**, its reason with the numbers
  taken out: "held at the engine's slots a chat burst needs", "low, in cooldown after the
  last change".

A negative figure is batch the law took above the static there.

    .venv/bin/python tests/benchmarks/bench_losses.py consumer-warm-room --seed 1 --static 16
    .venv/bin/python tests/benchmarks/bench_losses.py --from hindsight.jsonl [--under 0.95]

With --from, every run that bench_hindsight.py's --jsonl kept where ours is under --under ×
its best static runs against that static, and a last table sums each cause over those runs.
A run takes a few seconds of one core, three runs of the lab each (the day before, the law,
the static).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_control as bc  # noqa: E402
import bench_forms as bf  # noqa: E402
import bench_hindsight as bh  # noqa: E402

from llm_watchdog.errors import ConfigError  # noqa: E402
from llm_watchdog.sim.scenario import Scenario, load_scenario  # noqa: E402
from llm_watchdog.sim.virtual import MinuteRow  # noqa: E402

BURST = "a chat burst and the 2 minutes after it"
AFTER_BURST_S = 120.0
TOP = 6  # causes printed per run


def cause(reason: str) -> str:
    """A decision's reason with its numbers taken out, so the same rule reads the same at
    every level: "hold 13: p95≈537 ms low, held at the engine's slots a chat burst needs"
    → "held at the engine's slots a chat burst needs"."""
    why = reason.split(": ", 1)[-1]
    if "held at " in why:
        why = why[why.index("held at ") :]
    why = re.sub(r"^p95≈\d+ ms ", "", why)
    return re.sub(r"\d+(?:\.\d+)?", "N", why)


def bursts(s: Scenario) -> list[tuple[float, float]]:
    """(start, end) of each chat burst, with the two minutes after it."""
    return [(a, b + AFTER_BURST_S) for a, b in bc.chat_bursts(s)]


def losses(
    static: Sequence[MinuteRow],
    law: Sequence[MinuteRow],
    decisions: Sequence[tuple[float, str]],
    spans: Sequence[tuple[float, float]],
    duration_s: float,
) -> dict[str, float]:
    """Batch tokens a second the static took above the law, per cause (module doc).

    decisions: (time, reason) in time order; a minute takes the last one at or before its end.
    """
    out: dict[str, float] = defaultdict(float)
    k = -1
    for a, b in zip(static, law, strict=False):
        end = b.t_s + 60.0
        while k + 1 < len(decisions) and decisions[k + 1][0] < end:
            k += 1
        if any(lo <= b.t_s < hi for lo, hi in spans):
            why = BURST
        elif k >= 0:
            why = cause(decisions[k][1])
        else:
            why = "before the first decision"
        out[why] += (a.batch_tokens - b.batch_tokens) / duration_s
    return dict(out)


def one(job: tuple[str, int, int, str]) -> dict[str, Any]:
    """The law (form) and static:n on one scenario and seed, and where the batch went."""
    name, seed, n, form = job
    s = load_scenario(name)
    rec = bc.seeded(s, seed, form)
    law_run = bh.lab_run(s, seed, rec)
    static_run = bh.lab_run(s, seed, bc.make(f"static:{n}", s))
    actions = rec.inner.actions  # type: ignore[attr-defined]
    by = losses(
        static_run.minutes,
        law_run.minutes,
        [(a.ts, a.reason) for a in actions],
        bursts(s),
        s.duration_s,
    )
    return {
        "scenario": bf.short(name),
        "seed": seed,
        "static": n,
        "form": form,
        "static_tok_s": static_run.batch_tokens_per_s,
        "law_tok_s": law_run.batch_tokens_per_s,
        "law_att": bc.attained(law_run)[0],
        "static_att": bc.attained(static_run)[0],
        "causes": by,
    }


def report(row: dict[str, Any], top: int = TOP) -> list[str]:
    gap = row["static_tok_s"] - row["law_tok_s"]
    out = [
        f"{row['scenario']} seed {row['seed']}: {row['form']} {row['law_tok_s']:.1f} tok/s"
        f" (att {row['law_att']:.3f}) against static:{row['static']} {row['static_tok_s']:.1f}"
        f" (att {row['static_att']:.3f}), {gap:+.1f} tok/s behind"
    ]
    causes = sorted(row["causes"].items(), key=lambda kv: -abs(kv[1]))
    for why, v in causes[:top]:
        out.append(f"  {v:7.1f}  {why}")
    rest = sum(v for _, v in causes[top:])
    if len(causes) > top:
        out.append(f"  {rest:7.1f}  {len(causes) - top} more")
    return out


def totals(rows: Sequence[dict[str, Any]], top: int = 12) -> list[str]:
    """Each cause summed over the runs, with the runs where it is the largest."""
    total: dict[str, float] = defaultdict(float)
    first: dict[str, int] = defaultdict(int)
    for r in rows:
        for why, v in r["causes"].items():
            total[why] += v
        if r["causes"]:
            first[max(r["causes"].items(), key=lambda kv: kv[1])[0]] += 1
    gap = sum(r["static_tok_s"] - r["law_tok_s"] for r in rows)
    out = [f"over {len(rows)} runs, {gap:.1f} tok/s behind their statics in all:"]
    out.append(f"  {'tok/s':>7}  {'largest in':>10}  cause")
    for why, v in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"  {v:7.1f}  {first[why]:10d}  {why}")
    return out


def from_hindsight(path: Path, under: float) -> list[tuple[str, int, int]]:
    """(scenario, seed, best static) of each kept run where ours is under `under` × best."""
    picked = []
    for r in bf.read_rows(path, bh.ROW_KEYS):
        x = r["ours_x_best"]
        if r["best"] is not None and x is not None and x < under:
            picked.append((r["scenario"], int(r["seed"]), int(r["best"])))
    return picked


def by_path(name: str) -> str:
    """A bench_hindsight row names a held-out scenario by its short name: find its file."""
    held = bf.HELD_OUT / f"{name}.toml"
    return str(held) if held.exists() else name


def run_all(jobs: Iterable[tuple[str, int, int, str]], procs: int) -> Iterable[dict[str, Any]]:
    return bf.pool_map(one, list(jobs), procs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", help="a scenario's name or path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static", type=int, help="the static allowance to measure against")
    ap.add_argument("--form", default="ours", help="the law's form, e.g. ours:slot_reserve=2.5")
    ap.add_argument("--from", dest="rows_from", type=Path, help="bench_hindsight.py's --jsonl")
    ap.add_argument("--under", type=float, default=0.95, help="with --from: ours under this ×best")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.form.split(":", 1)[0] == "ours":
        raise SystemExit(f"error: --form is ours or ours:key=value,..., got {args.form!r}")
    if args.rows_from is not None:
        if args.scenario is not None:
            raise SystemExit("error: give a scenario or --from, not both")
        picked = from_hindsight(args.rows_from, args.under)
        if not picked:
            raise SystemExit(f"error: no run in {args.rows_from} has ours under {args.under:g}×")
        jobs = [(by_path(name), seed, n, args.form) for name, seed, n in picked]
    else:
        if args.scenario is None or args.static is None:
            raise SystemExit(
                "error: give a scenario and --static N (or --from rows.jsonl of bench_hindsight.py)"
            )
        if args.static < 0:
            raise SystemExit(f"error: --static is 0 or more, got {args.static}")
        jobs = [(args.scenario, args.seed, args.static, args.form)]
    try:
        for name, *_ in jobs:
            load_scenario(name)
    except (ConfigError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    rows = []
    for row in run_all(jobs, args.jobs):
        rows.append(row)
        print("\n".join(report(row)))
    if len(rows) > 1:
        print()
        print("\n".join(totals(rows)))


if __name__ == "__main__":
    main()
