"""Forms of the law side by side: `ours` against `ours:key=value,...`, on every scenario.

docs/control.md judges each rule it tried this way: every form runs every scenario with chat
of its own (the 17 of bench_control.py and the 5 held out in tests/benchmarks/heldout/) at
every seed, in one process pool, each run seeded from the day before as bench_control.py's
`ours+seed` is (its map and surge cap from the same scenario run with seed + 1000). The lab
runs in virtual time, so a form run again gives the same figures to the token.

It prints, per form:
    runs at ≥ 99 %      runs whose chat p95 met the target in ≥ 99 % of one-minute windows
    missed              one-minute windows missed, over all runs
    chg/h               mean allowance changes an hour away from disturbances
    >30                 runs over 30 changes an hour
    tok/s               mean batch output tokens per second
    same                runs whose batch and missed windows equal the first form's
    ratio lo / hi       the lowest and highest ratio of a run's batch to the first form's

and, with --per-scenario, a line per scenario: missed windows over its seeds, mean tok/s and
the most changes an hour of any seed, form by form.

    .venv/bin/python tests/benchmarks/bench_forms.py 'ours|ours:slot_reserve=2.5' \\
        [--seeds 0,1,2,3,4] [--scenarios a,b] [--jobs 2] [--jsonl rows.jsonl] [--per-scenario]
    .venv/bin/python tests/benchmarks/bench_forms.py --from rows.jsonl [--per-scenario]

A run takes a few seconds of one core; 110 runs (22 scenarios × 5 seeds) of one form, about
ten minutes on two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_control as bc  # noqa: E402

from llm_watchdog.errors import ConfigError  # noqa: E402
from llm_watchdog.sim.scenario import load_scenario  # noqa: E402
from llm_watchdog.sim.virtual import run_virtual  # noqa: E402

HELD_OUT = HERE / "heldout"
T = TypeVar("T")
R = TypeVar("R")
TARGET_ATT = bc.TARGET_ATT


def scenarios() -> list[str]:
    """The bundled scenarios bench_control.py runs, then the held-out ones, by path."""
    return [*bc.SCENARIOS, *(str(p) for p in sorted(HELD_OUT.glob("*.toml")))]


def short(name: str) -> str:
    return Path(name).name.removesuffix(".toml")


def one(job: tuple[str, str, int]) -> dict[str, Any]:
    """One form on one scenario and seed, seeded from the day before."""
    form, name, seed = job
    s = load_scenario(name)
    rec = bc.seeded(s, seed, form)
    r = run_virtual(s, s.duration_s, rec, seed=seed, warmup_s=bc.WARMUP_S, hold_slots=bc.HOLD_SLOTS)
    att, missed = bc.attained(r)
    return {
        "form": form,
        "scenario": short(name),
        "seed": seed,
        "att": att,
        "missed": missed,
        "tok_s": r.batch_tokens_per_s,
        "changes_per_h": bc.steady_changes_per_h(rec, s),
    }


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The per-form table, the first form seen the one the others are compared with."""
    forms: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for r in rows:
        forms.setdefault(r["form"], {})[(r["scenario"], r["seed"])] = r
    if not forms:
        return ["no runs"]
    first = next(iter(forms.values()))
    width = max(len(f) for f in forms)
    out = [
        f"{'form':{width}}  runs  ≥99%  missed  chg/h  >30   tok/s  same  ratio lo / hi",
    ]
    for form, runs in forms.items():
        rs = list(runs.values())
        n = len(rs)
        met = sum(1 for r in rs if r["att"] >= TARGET_ATT - 1e-9)
        missed = sum(r["missed"] for r in rs)
        chg = sum(r["changes_per_h"] for r in rs) / n
        over = sum(1 for r in rs if r["changes_per_h"] > 30.0)
        tok = sum(r["tok_s"] for r in rs) / n
        pairs = [(r, first[k]) for k, r in runs.items() if k in first]
        same = sum(
            1
            for r, b in pairs
            if r["missed"] == b["missed"] and abs(r["tok_s"] - b["tok_s"]) < 0.05
        )
        ratios = [r["tok_s"] / b["tok_s"] for r, b in pairs if b["tok_s"] > 0]
        span = f"{min(ratios):.2f} / {max(ratios):.2f}" if ratios else "—"
        out.append(
            f"{form:{width}}  {n:4d}  {met:4d}  {missed:6d}  {chg:5.1f}  {over:3d}  {tok:6.1f}"
            f"  {same:4d}  {span}"
        )
    return out


def per_scenario(rows: Sequence[dict[str, Any]]) -> list[str]:
    """missed; mean tok/s; most changes an hour: one cell per form, a line per scenario."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    order: dict[str, None] = {}
    for r in rows:
        by[r["scenario"]][r["form"]].append(r)
        order.setdefault(r["form"], None)
    out = ["scenario: missed; tok/s; most chg/h  (" + " | ".join(order) + ")"]
    for name in sorted(by):
        cells = []
        for form in order:
            rs = by[name].get(form, [])
            if not rs:
                cells.append("—")
                continue
            cells.append(
                f"{sum(r['missed'] for r in rs)}; {sum(r['tok_s'] for r in rs) / len(rs):.1f};"
                f" {max(r['changes_per_h'] for r in rs):.0f}"
            )
        out.append(f"{name[:28]:28} " + " | ".join(cells))
    return out


# What a row of this script's --jsonl holds; --from checks each row for it.
ROW_KEYS = ("form", "scenario", "seed", "att", "missed", "tok_s", "changes_per_h")


def read_rows(path: Path, keys: Sequence[str] = ROW_KEYS) -> list[dict[str, Any]]:
    """The rows a --jsonl kept; a file that cannot be read, or a row that is not one, is one
    line naming it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SystemExit(
            f"error: cannot read {path}: {reason}; give a file --jsonl wrote"
        ) from None
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(
                f"error: {path}:{i}: not a JSON row ({e.msg}); give a file --jsonl wrote"
            ) from None
        missing = [k for k in keys if not isinstance(row, dict) or k not in row]
        if missing:
            raise SystemExit(
                f"error: {path}:{i}: not a row of this benchmark (no {missing[0]!r});"
                " give a file its --jsonl wrote"
            )
        rows.append(row)
    return rows


def pool_map(fn: Callable[[T], R], work: Sequence[T], jobs: int) -> Iterable[R]:
    """fn over work in `jobs` processes (in this one at 1), results in work's order."""
    if jobs <= 1:
        yield from map(fn, work)
        return
    with ProcessPoolExecutor(jobs) as pool:
        yield from pool.map(fn, work)


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(
            f"error: --seeds takes whole numbers split by commas, got {text!r}"
        ) from None


def collect(rows: Iterable[dict[str, Any]], jsonl: Path | None) -> list[dict[str, Any]]:
    """The rows, each appended to `jsonl` as it comes, so a run cut short keeps what it did."""
    out = []
    try:
        sink = jsonl.open("a") if jsonl else None
    except OSError as e:
        raise SystemExit(
            f"error: cannot write {jsonl}: {e.strerror};"
            " give --jsonl a file in a folder that exists"
        ) from None
    try:
        for row in rows:
            out.append(row)
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
    finally:
        if sink:
            sink.close()
    return out


def run_forms(
    forms: Sequence[str], names: Sequence[str], seeds: Iterable[int], jobs: int
) -> Iterable[dict[str, Any]]:
    work = [(f, name, seed) for name in names for seed in seeds for f in forms]
    return pool_map(one, work, jobs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("forms", nargs="?", help="forms split by |, e.g. 'ours|ours:window_s=90'")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated, e.g. 0,1,2")
    ap.add_argument("--scenarios", help="comma-separated names or paths (default: all 22)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    ap.add_argument("--jsonl", type=Path, help="append each run's row to this file")
    ap.add_argument("--from", dest="rows_from", type=Path, help="summarize rows kept by --jsonl")
    ap.add_argument("--per-scenario", action="store_true", help="a line per scenario too")
    args = ap.parse_args(argv)
    if (args.forms is None) == (args.rows_from is None):
        ap.error("give forms to run ('ours|ours:key=value') or --from FILE, one of the two")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.rows_from is not None:
        rows = read_rows(args.rows_from)
    else:
        forms = [f.strip() for f in args.forms.split("|") if f.strip()]
        bad = [f for f in forms if f.partition(":")[0] != "ours"]
        if bad:
            raise SystemExit(
                f"error: forms are of the law: 'ours' or 'ours:key=value,...', got {bad[0]!r}"
            )
        seeds = parse_seeds(args.seeds)
        names = args.scenarios.split(",") if args.scenarios else scenarios()
        try:
            # Every form and scenario checked here, before the pool: a wrong key or name is
            # one line now, not a traceback from a worker minutes in.
            loaded = [load_scenario(n) for n in names]
            for form in forms:
                bc.make(form, loaded[0])
        except (ConfigError, ValueError) as e:
            raise SystemExit(f"error: {e}") from None
        rows = collect(run_forms(forms, names, seeds, args.jobs), args.jsonl)
    print("\n".join(summary(rows)))
    if args.per_scenario:
        print()
        print("\n".join(per_scenario(rows)))


if __name__ == "__main__":
    main()
