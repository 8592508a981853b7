"""Soak: the daemon as `llm-watchdog run` wires it, probing every second with the control loop
on through the gateway, for real minutes; RSS, open descriptors and threads sampled each
10 s. Growth is judged after the warm-up (targets: RSS <= 5 MB, descriptors and threads
none). With --trace, tracemalloc compares the heap at the end of the warm-up with the end
and prints the lines that grew most: where a leak lives.

    .venv/bin/python tests/benchmarks/bench_soak.py [--minutes 10] [--warmup 60] [--trace]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from bench_gateway import gateway_process  # noqa: E402

from llm_watchdog.alerts import AlertManager, LogSink  # noqa: E402
from llm_watchdog.config import settings_from_dict  # noqa: E402
from llm_watchdog.daemon.service import Daemon  # noqa: E402
from llm_watchdog.store.db import Store  # noqa: E402
from tests.helpers.fakenvml import scenario_basic  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--trace", action="store_true", help="tracemalloc: what grew")
    args = ap.parse_args()
    if args.trace:
        tracemalloc.start(8)
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "helpers" / "streamserver.py"),
         "--first-token-delay-s", "0.02", "--answer", "Paris"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        token = Path(tmp) / "token"
        token.write_text("soak-token\n")
        token.chmod(0o600)
        port, _ = stack.enter_context(
            gateway_process(urlsplit(url).port or 80, "--token-file", str(token))
        )
        gw_url = f"http://127.0.0.1:{port}"
        settings = settings_from_dict(
            {
                "server": {"url": gw_url},
                "probe": {"interval": "1s", "jitter": "0s"},
                "gpu": {"interval": "1s"},
                "storage": {"path": f"{tmp}/wd.db", "rollup_interval": "30s"},
                "control": {"enabled": True, "gateway_url": gw_url, "token_file": str(token),
                            "target_p95": "1s"},
            },
            "soak",
        )  # fmt: skip
        store = Store(settings.storage.path, exclusive=True)
        alerts = AlertManager([LogSink()], store)
        daemon = Daemon(settings, store, nvml=scenario_basic(), alerts=alerts)
        daemon.startup()
        daemon.start_jobs()
        samples: list[tuple[float, float, int, int]] = []
        t0 = time.monotonic()
        end = t0 + args.warmup + args.minutes * 60
        base = None
        try:
            while time.monotonic() < end:
                time.sleep(10.0)
                t = time.monotonic() - t0
                samples.append((t, rss_mb(), fds(), threading.active_count()))
                if base is None and t >= args.warmup:
                    base = samples[-1]
                    snap0 = tracemalloc.take_snapshot() if args.trace else None
                print(
                    f"{t:6.0f} s  RSS {samples[-1][1]:6.1f} MB  fds {samples[-1][2]:3d}  "
                    f"threads {samples[-1][3]:2d}",
                    flush=True,
                )
            snap1 = tracemalloc.take_snapshot() if args.trace else None
            probes = len(store.probes())
        finally:
            daemon.shutdown(timeout_s=5)
            alerts.close()
            store.close()
            server.stdin.close()  # type: ignore[union-attr]
            server.wait(timeout=10)
    assert base is not None
    last = samples[-1]
    minutes = (last[0] - base[0]) / 60
    print(f"probes            {probes}")
    print(
        f"after warm-up     RSS {base[1]:.1f} -> {last[1]:.1f} MB ({last[1] - base[1]:+.1f} MB, "
        f"{(last[1] - base[1]) / max(minutes, 1e-9):+.2f} MB/min over {minutes:.1f} min)"
    )
    print(f"                  fds {base[2]} -> {last[2]}, threads {base[3]} -> {last[3]}")
    if args.trace and snap0 is not None and snap1 is not None:
        print("grew most (tracemalloc, since the end of the warm-up):")
        for stat in snap1.compare_to(snap0, "traceback")[:8]:
            print(f"  {stat.size_diff / 1024:+8.1f} KiB  {stat.count_diff:+6d} blocks")
            for line in stat.traceback.format()[-6:]:
                print("     ", line)


if __name__ == "__main__":
    main()
