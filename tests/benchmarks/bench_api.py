"""The daemon's /metrics server under idle connections: one asyncio thread against a thread
per connection (the stdlib ThreadingHTTPServer it replaced), side by side in one run.

    python tests/benchmarks/bench_api.py [--idle 1000] [--scrapes 200]

Prints, for each server: threads and resident memory added by the idle connections, and the
scrape latency p50/p95 while they are held, and the ratios between the two.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from prometheus_client import generate_latest

from llm_watchdog.daemon.api import ApiServer, ProbeMetrics, build_registry
from tests.daemon.test_api import status_of


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class ThreadPerConnection:
    """What the daemon served with before: stdlib ThreadingHTTPServer, a thread each."""

    def __init__(self) -> None:
        registry = build_registry(status_of, ProbeMetrics())

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def measure(name: str, start: Callable[[], Any], idle: int, scrapes: int) -> dict[str, float]:
    server = start()
    url = server.url
    host, port = url.removeprefix("http://").split(":")
    threads0, rss0 = threading.active_count(), rss_kib()
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(idle)]
    for s in held[::2]:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request, then nothing
    time.sleep(0.5)
    threads, rss = threading.active_count() - threads0, rss_kib() - rss0
    latencies, failures = [], 0
    with httpx.Client(timeout=10) as client:
        for _ in range(scrapes):
            t = time.perf_counter()
            try:
                client.get(url + "/metrics").raise_for_status()
                latencies.append((time.perf_counter() - t) * 1000)
            except httpx.HTTPError:
                failures += 1
    for s in held:
        s.close()
    server.stop()
    latencies.sort()
    row = {
        "threads": float(threads),
        "rss_mib": rss / 1024,
        "p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "p95_ms": latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan"),
        "failed": float(failures),
    }
    print(
        f"{name:<22} idle {idle:5d}: +{row['threads']:5.0f} threads  +{row['rss_mib']:6.1f} MiB  "
        f"scrape p50 {row['p50_ms']:6.2f} ms  p95 {row['p95_ms']:6.2f} ms  failed {failures}"
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    old = measure("thread per connection", ThreadPerConnection, args.idle, args.scrapes)
    new = measure(
        "asyncio, bounded",
        lambda: ApiServer("127.0.0.1", 0, status_of, ProbeMetrics()).start(),
        args.idle,
        args.scrapes,
    )
    print(
        f"ratios (thread per connection / asyncio): threads "
        f"{old['threads'] / max(new['threads'], 1):.0f}x, memory "
        f"{old['rss_mib'] / max(new['rss_mib'], 0.1):.1f}x, scrape p50 "
        f"{old['p50_ms'] / new['p50_ms']:.2f}x"
    )


if __name__ == "__main__":
    main()
