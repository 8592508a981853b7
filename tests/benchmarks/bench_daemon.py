"""Daemon steady state: CPU share of one core and resident memory.

The daemon runs in this process exactly as `llm-watchdog run` wires it (APScheduler jobs,
SQLite store, drift judge, log alert sink), probing every 10 s and sampling the fake NVML
(tests.helpers.fakenvml.scenario_basic, 2 GPUs) every 1 s. The streaming server it probes runs in
its own process, so its work is not counted. Targets: CPU <= 1 % of one core, RSS <= 80 MB.

With --control, `llm-watchdog gateway` (its own process, not counted) stands in front of
the server, the canaries go through it, and the control loop steps at its default interval
(1 s): reading the gateway's allowance and observed chat TTFTs back every step, renewing
its lease, recording decisions.

    .venv/bin/python tests/benchmarks/bench_daemon.py [--seconds 120] [--interval 10s] [--control]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_gateway import gateway_process  # noqa: E402

from llm_watchdog.alerts import AlertManager, LogSink  # noqa: E402
from llm_watchdog.config import settings_from_dict  # noqa: E402
from llm_watchdog.daemon.service import Daemon  # noqa: E402
from llm_watchdog.durations import parse_duration  # noqa: E402
from llm_watchdog.store.db import Store  # noqa: E402
from tests.helpers.fakenvml import scenario_basic  # noqa: E402


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--interval", default="10s")
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--control", action="store_true", help="through a gateway, control on")
    args = ap.parse_args()

    server = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "helpers" / "streamserver.py"),
            "--first-token-delay-s",
            "0.05",
            "--answer",
            "Paris",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        config: dict = {
            "server": {"url": url},
            # A tenth of the interval: the config wants the jitter under it.
            "probe": {"interval": args.interval, "jitter": parse_duration(args.interval) / 10},
            "gpu": {"interval": "1s"},
            "storage": {"path": f"{tmp}/wd.db"},
        }
        if args.control:
            token = Path(tmp) / "token"
            token.write_text("bench-token\n")
            token.chmod(0o600)
            port, _ = stack.enter_context(
                gateway_process(urlsplit(url).port or 80, "--token-file", str(token))
            )
            gw_url = f"http://127.0.0.1:{port}"
            config["server"]["url"] = gw_url
            config["control"] = {
                "enabled": True,
                "gateway_url": gw_url,
                "token_file": str(token),
                "target_p95": "1s",
            }
        settings = settings_from_dict(config, "bench")
        store = Store(settings.storage.path)
        alerts = AlertManager([LogSink()], store)
        daemon = Daemon(settings, store, nvml=scenario_basic(), alerts=alerts)
        daemon.startup()
        counted = [0]
        if daemon.steer is not None:
            step = daemon.steer.step

            def counting_step() -> object:
                counted[0] += 1
                return step()

            daemon.steer.step = counting_step  # type: ignore[method-assign]
        daemon.start_jobs()
        try:
            time.sleep(args.warmup)  # imports, first probe, first fingerprint
            c0, t0, r0 = cpu_s(), time.monotonic(), rss_mb()
            peak = r0
            end = t0 + args.seconds
            while time.monotonic() < end:
                time.sleep(1.0)
                peak = max(peak, rss_mb())
            c1, t1 = cpu_s(), time.monotonic()
            probes = len(store.probes())
            samples = len(store.gpu_samples())
            steps = counted[0]
        finally:
            daemon.shutdown(timeout_s=5)
            alerts.close()
            store.close()
            server.stdin.close()  # type: ignore[union-attr]
            server.wait(timeout=10)
    share = 100.0 * (c1 - c0) / (t1 - t0)
    print(f"window            {t1 - t0:.0f} s after {args.warmup:.0f} s warm-up")
    print(f"probes / samples  {probes} probes, {samples} GPU samples (2 GPUs)")
    if args.control:
        print(f"control           {steps} steps through the gateway")
    print(f"CPU               {share:.2f} % of one core   (target <= 1 %)")
    print(
        f"RSS               {r0:.1f} MB at start of window, peak {peak:.1f} MB   (target <= 80 MB)"
    )


if __name__ == "__main__":
    main()
