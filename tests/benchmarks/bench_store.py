"""A year of history in the store: database size, write cost, rollup cost, query times.

Steady state of a daemon that has run for a year: one probe per 10 s, one GPU sample per
second, raw rows kept for the retention window (default 14 days, the config default) and
per-minute rollups for everything older.

By default the days older than the retention window are written through the real path
(record_*, then rollup) for one day, and that day's rollup rows are copied, shifted in time,
for the other old days; the last retention window (+1 day) is written through the real path.
`--full` writes every day through the real path (31.5 M samples per GPU: minutes of CPU).

    .venv/bin/python tests/benchmarks/bench_store.py [--days 365] [--retention-days 14] [--full]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llm_watchdog.models import Fingerprint, GpuSample, ProbeResult  # noqa: E402
from llm_watchdog.nvml.throttle import GPU_IDLE, SW_POWER_CAP, SW_THERMAL_SLOWDOWN  # noqa: E402
from llm_watchdog.store.db import Store  # noqa: E402

DAY = 86400
PROBE_EVERY_S = 10
END = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a whole day


def probes_for(day_start: float, rng: random.Random) -> list[ProbeResult]:
    out = []
    for i in range(DAY // PROBE_EVERY_S):
        ts = day_start + i * PROBE_EVERY_S
        ok = rng.random() > 0.002
        ttft = math.exp(rng.gauss(math.log(180.0), 0.2)) if ok else None
        out.append(
            ProbeResult(
                ts=ts,
                prompt_id=f"p{i % 5}",
                probe_set="default",
                url="http://127.0.0.1:8080/v1",
                model="smollm2-135m",
                ok=ok,
                cache_mode="bust",
                cache_bust="cache_prompt_false",
                error_class=None if ok else "first_token_timeout",
                ttft_ms=ttft,
                first_event_ms=ttft,
                total_ms=ttft + 250.0 if ttft else None,
                output_tokens=12 if ok else None,
                gap_p50_ms=18.0 if ok else None,
                gap_max_ms=40.0 if ok else None,
                answer="Paris" if ok else "",
                quality_pass=True if ok else None,
            )
        )
    return out


def samples_for(start: float, seconds: int, gpus: int) -> list[GpuSample]:
    out = []
    for s in range(seconds):
        ts = start + s
        heat = math.sin(ts / 3600.0)  # a slow daily rhythm of load and heat
        temp = 65.0 + 15.0 * heat
        reasons = SW_THERMAL_SLOWDOWN if temp > 79.0 else SW_POWER_CAP if heat > 0.7 else GPU_IDLE
        for g in range(gpus):
            out.append(
                GpuSample(
                    ts=ts,
                    gpu_index=g,
                    uuid=f"GPU-{g:04d}",
                    temp_c=round(temp, 1),
                    sm_clock_mhz=2520.0 - max(0.0, temp - 75.0) * 40.0,
                    sm_clock_max_mhz=2520.0,
                    mem_clock_mhz=10501.0,
                    mem_clock_max_mhz=10501.0,
                    power_w=round(300.0 + 100.0 * heat, 1),
                    power_limit_w=450.0,
                    util_gpu_pct=90.0,
                    util_mem_pct=60.0,
                    fan_pct=55.0,
                    pstate=0,
                    throttle_reasons=reasons,
                    thermal_violation_ms=0.0,
                    power_violation_ms=0.0,
                    temp_slowdown_c=87.0,
                )
            )
    return out


def write_day(store: Store, fp: str, day_start: float, gpus: int, rng: random.Random) -> None:
    for p in probes_for(day_start, rng):
        store.record_probe(p, fp)
    # Batched by the minute here; the daemon writes one batch per second (timed separately).
    for m in range(0, DAY, 60):
        store.record_gpu_samples(samples_for(day_start + m, 60, gpus))


def timed(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--retention-days", type=float, default=14.0)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--full", action="store_true", help="every day through the real write path")
    ap.add_argument("--dir", type=Path, help="where to put the database (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, Path(args.dir or tmp) / "bench.db")


def run(args: argparse.Namespace, path: Path) -> None:
    rng = random.Random(42)
    retention_s = args.retention_days * DAY
    start = END - args.days * DAY
    real_from = END - (math.ceil(args.retention_days) + 1) * DAY  # days written for real
    print(f"database {path}; {args.days} days, {args.gpus} GPU(s)", end="")
    print(f", raw rows kept {args.retention_days:g} days")
    store = Store(path)
    fp = store.record_fingerprint(Fingerprint(engine="llamacpp", model="smollm2-135m"), start)

    # Per-call write latency, the way the daemon writes (one sample batch per second).
    lat_probe, lat_gpu = [], []
    warm = start - 600
    warm_probes = probes_for(warm, rng)[:300]
    for i in range(300):
        t = time.perf_counter()
        store.record_probe(warm_probes[i], fp)
        lat_probe.append(time.perf_counter() - t)
        t = time.perf_counter()
        store.record_gpu_samples(samples_for(warm + i, 1, args.gpus))
        lat_gpu.append(time.perf_counter() - t)
    q = statistics.quantiles
    print(
        f"write latency: record_probe p50 {q(lat_probe, n=100)[49] * 1e3:.2f} ms "
        f"p99 {q(lat_probe, n=100)[98] * 1e3:.2f} ms; record_gpu_samples p50 "
        f"{q(lat_gpu, n=100)[49] * 1e3:.2f} ms p99 {q(lat_gpu, n=100)[98] * 1e3:.2f} ms"
    )

    t_write = t_roll = 0.0
    days_real = 0
    template_day: float | None = None
    day = start
    while day < END:
        if args.full or day >= real_from or template_day is None:
            t = time.perf_counter()
            write_day(store, fp, day, args.gpus, rng)
            t_write += time.perf_counter() - t
            t = time.perf_counter()
            store.rollup(day + DAY, retention_s)
            t_roll += time.perf_counter() - t
            days_real += 1
            if template_day is None:
                template_day = day
        else:
            # Copy the template day's rollups, shifted: the same rows rollup() would write.
            shift = day - template_day
            with store.transaction() as db:
                for table in ("probes_1m", "gpu_1m", "probes_1h", "gpu_1h"):
                    cols = [c["name"] for c in db.query(f"PRAGMA table_info({table})")]
                    sel = ", ".join("ts + ?" if c == "ts" else c for c in cols)
                    db.execute(
                        f"INSERT INTO {table} ({', '.join(cols)}) SELECT {sel} FROM {table} "
                        "WHERE ts >= ? AND ts < ?",
                        [shift, template_day, template_day + DAY],
                    )
        day += DAY
    per_day = (t_write + t_roll) / days_real
    print(
        f"wrote {days_real} days through record_*: {t_write:.1f} s writing, {t_roll:.1f} s "
        f"rolling up ({per_day:.2f} s per simulated day)"
    )

    # A daemon's routine rollup: five more minutes of data, then rollup().
    for p in probes_for(END, rng)[:30]:
        store.record_probe(p, fp)
    store.record_gpu_samples(samples_for(END, 300, args.gpus))
    t_inc, n_inc = timed(lambda: store.rollup(END + 300, retention_s), repeat=1)
    print(f"incremental rollup of 5 min: {t_inc * 1e3:.1f} ms ({n_inc} rows)")

    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    counts = {
        t: store.rows(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]
        for t in ("probes", "gpu_samples", "probes_1m", "gpu_1m", "probes_1h", "gpu_1h")
    }
    pages = store.rows("PRAGMA page_count")[0]["page_count"]
    free = store.rows("PRAGMA freelist_count")[0]["freelist_count"]
    page = store.rows("PRAGMA page_size")[0]["page_size"]
    print("rows: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    print(
        f"database size: {db_bytes(path) / 1e6:.1f} MB on disk "
        f"({pages * page / 1e6:.1f} MB in pages, {free * page / 1e6:.1f} MB of them free)"
    )

    sizes = store.rows(
        "SELECT CASE WHEN name LIKE 'sqlite_%' OR name LIKE '\\_%' ESCAPE '\\' THEN 'other' "
        "WHEN name LIKE 'idx_gpu_samples%' THEN 'gpu_samples' "
        "WHEN name LIKE 'idx_probes%' THEN 'probes' "
        "WHEN name LIKE 'idx_%' THEN 'other' ELSE name END AS part, SUM(pgsize) AS bytes "
        "FROM dbstat GROUP BY part ORDER BY bytes DESC"
    )
    print(
        "by table, indexes included: "
        + ", ".join(f"{r['part']} {r['bytes'] / 1e6:.1f} MB" for r in sizes if r["bytes"] > 1e5)
    )

    now = END + 300
    queries: list[tuple[str, Callable[[], Any]]] = [
        (
            "status: last_probe + last_gpu_samples",
            lambda: (store.last_probe(), store.last_gpu_samples()),
        ),
        ("probes(--since 24h) raw", lambda: store.probes(now - DAY, now)),
        ("gpu_samples(--since 24h) raw", lambda: store.gpu_samples(now - DAY, now)),
        ("history 24h probes auto (raw)", lambda: store.history(now - DAY, now)),
        ("history 24h gpu auto (raw)", lambda: store.history(now - DAY, now, series="gpu")),
        ("history 24h gpu 1m", lambda: store.history(now - DAY, now, "1m", series="gpu")),
        ("history 30d probes raw", lambda: store.history(now - 30 * DAY, now, "raw")),
        ("history 30d probes auto (1m)", lambda: store.history(now - 30 * DAY, now)),
        ("history 30d probes 1h", lambda: store.history(now - 30 * DAY, now, "1h")),
        ("history 30d gpu raw", lambda: store.history(now - 30 * DAY, now, "raw", series="gpu")),
        ("history 30d gpu auto (1m)", lambda: store.history(now - 30 * DAY, now, series="gpu")),
        ("history 30d gpu 1h", lambda: store.history(now - 30 * DAY, now, "1h", series="gpu")),
        ("history 365d probes auto (1h)", lambda: store.history(now - 365 * DAY, now)),
        ("history 365d gpu auto (1h)", lambda: store.history(now - 365 * DAY, now, series="gpu")),
    ]
    print(f"{'query':42} {'time':>9} {'rows':>9}")
    for name, fn in queries:
        secs, result = timed(fn)
        n = len(result) if isinstance(result, list) else 1
        print(f"{name:42} {secs * 1e3:7.1f} ms {n:9,}")
    store.close()


if __name__ == "__main__":
    main()
