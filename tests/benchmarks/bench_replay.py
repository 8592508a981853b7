"""`replay` of a long trace: CPU time and peak RSS, the list-then-replay way beside the
streaming `replay_file`, each in its own child process so their peaks do not mix.

The trace is synthetic: a probe every 10 s, warm lognormal TTFTs, and every third block of
20,000 probes hot (throttle bit on, clocks down, TTFT up) so latency events open and stay
open, the costly case for the monitor.

    .venv/bin/python tests/benchmarks/bench_replay.py [--rows 300000]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HEADER = [
    "ts", "ttft_ms", "ok", "cold", "quality_pass", "gpu_temp_c", "sm_clock_mhz",
    "sm_clock_max_mhz", "power_w", "power_limit_w", "throttle_reasons", "batch_inflight",
    "batch_allowance",
]  # fmt: skip

CHILD = """
import resource, sys, time
from llm_watchdog.drift.replay import parse_trace, replay_file, replay_observations
path, way = sys.argv[1], sys.argv[2]
t0 = time.process_time()
if way == "list":
    events = replay_observations(parse_trace(path))
else:
    events = replay_file(path)
cpu = time.process_time() - t0
print(len(events), cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_trace(path: Path, rows: int) -> None:
    rng = random.Random(1)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        ts = 1.7e9
        for i in range(rows):
            ts += 10
            hot = (i // 20000) % 3 == 2
            ttft = round(rng.lognormvariate(5.6 if hot else 5.0, 0.2), 2)
            w.writerow(
                [ts, ttft, 1, 0, 1, 80 if hot else 60, 1400 if hot else 1900, 1980, 300, 350,
                 0x20 if hot else 0, 4, 8]
            )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        write_trace(trace, args.rows)
        size_mb = trace.stat().st_size / 1e6
        print(f"trace: {args.rows} rows, {size_mb:.1f} MB")
        results = {}
        for way in ("list", "stream"):
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(trace), way],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))},
            ).stdout.split()
            events, cpu_s, rss_kb = int(out[0]), float(out[1]), int(out[2])
            results[way] = (cpu_s, rss_kb / 1024)
            print(
                f"{way:>6}: {events} events, CPU {cpu_s:.1f} s "
                f"({cpu_s / args.rows * 1e6:.0f} µs a row), peak RSS {rss_kb / 1024:.0f} MB, "
                f"wall {time.monotonic() - t0:.1f} s"
            )
        (lc, lm), (sc, sm) = results["list"], results["stream"]
        print(f"stream/list: CPU {sc / lc:.2f}x, peak RSS {sm / lm:.2f}x")


if __name__ == "__main__":
    main()
