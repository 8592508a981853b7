"""Gateway overhead: the same SSE streams direct to the engine, through the gateway
(and through HAProxy when it is installed), over loopback.

Three processes: a minimal asyncio SSE engine (so the engine is never what is measured),
the gateway (`llm-watchdog gateway`, one asyncio event loop: one core at most), and this
script as the client, on raw asyncio sockets with keep-alive connections.

- Added TTFT: client-side time from writing the request to the first body chunk, at 1, 16
  and 64 concurrent streams; the gateway's p50/p99 minus the direct p50/p99. Each worker
  starts at its own moment within one answer's length (`--in-step`: all at once).
- Relay rate: 64 streams paced like token output, so each SSE event is its own chunk. The
  events relayed per CPU-second of the gateway process is its capacity on one core; a
  saturated run (engine writes as fast as it can) is shown beside it.
- Memory per open stream: the gateway's RSS growth with N streams held open, / N.

    .venv/bin/python tests/benchmarks/bench_gateway.py [--quick] [--no-haproxy] [--no-pin]
        [--in-step]

On a shared machine the figures move from run to run; the script says how busy the
machine was (1-minute load average) beside them.

With two cores or more the proxy under test runs on a core of its own and the engine and
this client on the others (`--no-pin` turns that off). A proxy sharing one core with the
client that measures it is measuring the client: on a two-core machine, unpinned, each of
64 streams' chunks wakes three processes on two cores, and the run-queue wait shows up as
"added TTFT" however fast the proxy is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil
from placement import split_cpus

ROOT = Path(__file__).resolve().parents[2]

EVENT = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,'
    b'"model":"bench","choices":[{"index":0,"delta":{"content":" token"},'
    b'"finish_reason":null}]}\n\n'
)
DONE = b"data: [DONE]\n\n"
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
BODY = json.dumps(
    {
        "model": "bench",
        "messages": [{"role": "user", "content": "Say something."}],
        "stream": True,
        "max_tokens": 16,
    }
).encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# -- the engine stand-in -----------------------------------------------------------------


async def _engine_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One keep-alive connection: POST ...?events=N&interval_ms=X&hold_s=Y -> SSE."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            target = lines[0].split(b" ")[1].decode()
            length = 0
            for line in lines[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            q = parse_qs(urlsplit(target).query)
            events = int(q.get("events", ["8"])[0])
            interval_s = float(q.get("interval_ms", ["0"])[0]) / 1000
            hold_s = float(q.get("hold_s", ["0"])[0])
            first_s = float(q.get("first_ms", ["0"])[0]) / 1000
            if first_s:
                await asyncio.sleep(first_s)  # a prefill
            writer.write(HEAD + chunk(EVENT))  # headers and the first event at once
            for _ in range(events - 1):
                if interval_s:
                    await asyncio.sleep(interval_s)
                writer.write(chunk(EVENT))
                await writer.drain()
            if hold_s:
                await asyncio.sleep(hold_s)
            writer.write(chunk(DONE) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve_engine() -> None:
    server = await asyncio.start_server(_engine_conn, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- the client --------------------------------------------------------------------------


class Conn:
    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.sent = 0.0

    async def stream(self, query: str, on_first: asyncio.Event | None = None) -> tuple[float, int]:
        """One streamed request; (TTFT seconds, SSE events received)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        request = (
            b"POST /v1/chat/completions?%s HTTP/1.1\r\nhost: bench\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        ) % (query.encode(), len(BODY), BODY)
        sent = self.sent = time.perf_counter()
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {head[:80]!r}")
        first = 0.0
        events = 0
        rest = b""
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self.reader.readline()
                break
            data = await self.reader.readexactly(size + 2)
            if not first:
                first = time.perf_counter()
                if on_first is not None:
                    on_first.set()
            rest += data[:-2]
            events += rest.count(b"\n\n")
            rest = rest[rest.rfind(b"\n\n") + 2 :] if b"\n\n" in rest else rest
        return first - sent, events

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def ttft_run(
    port: int, concurrency: int, per_worker: int, query: str, stagger_s: float = 0.0
) -> list[float]:
    conns = [Conn(port) for _ in range(concurrency)]
    for c in conns:  # connect and warm each connection (and the gateway's pool) first
        await c.stream("events=2")
    out: list[float] = []
    # Independent users: each starts at its own moment within one answer's length. Started
    # together, equal-length answers keep every worker in step, and each round arrives as one
    # wave of `concurrency` requests at the same instant, which no chat traffic does; the
    # wave's last request then waits behind all the others' set-up, in any proxy.
    offsets = random.Random(concurrency).sample(range(1000), concurrency)

    async def worker(c: Conn, offset: int) -> None:
        await asyncio.sleep(stagger_s * offset / 1000)
        for _ in range(per_worker):
            ttft, _ = await c.stream(query)
            out.append(ttft)

    await asyncio.gather(*(worker(c, o) for c, o in zip(conns, offsets, strict=True)))
    for c in conns:
        c.close()
    return out


async def wave_run(port: int, concurrency: int, waves: int, query: str) -> list[float]:
    """`waves` rounds of `concurrency` requests sent together, each on a fresh connection;
    TTFT counts from the connect, so accepting the connection is part of what is added."""
    out: list[float] = []

    async def one() -> None:
        c = Conn(port)
        started = time.perf_counter()
        c.reader, c.writer = await asyncio.open_connection("127.0.0.1", port)
        ttft, _ = await c.stream(query)
        out.append(ttft + (c.sent - started))
        c.close()

    for _ in range(2):  # warm the proxy's pool to the engine first
        await asyncio.gather(*(one() for _ in range(concurrency)))
    out.clear()
    for _ in range(waves):
        await asyncio.gather(*(one() for _ in range(concurrency)))
        await asyncio.sleep(0.02)  # the next wave starts from quiet
    return out


async def relay_run(port: int, streams: int, events: int, interval_ms: float) -> tuple[int, float]:
    conns = [Conn(port) for _ in range(streams)]
    for c in conns:
        await c.stream("events=2")
    started = time.perf_counter()
    results = await asyncio.gather(
        *(c.stream(f"events={events}&interval_ms={interval_ms}") for c in conns)
    )
    wall = time.perf_counter() - started
    for c in conns:
        c.close()
    return sum(n for _, n in results), wall


async def hold_open(port: int, n: int, hold_s: float, proc: psutil.Process) -> float:
    """RSS growth in bytes per stream with `n` streams held open at once."""
    warm = [Conn(port) for _ in range(8)]
    await asyncio.gather(*(c.stream("events=2") for c in warm))
    for c in warm:
        c.close()
    await asyncio.sleep(0.3)
    before = proc.memory_info().rss
    firsts = [asyncio.Event() for _ in range(n)]
    conns = [Conn(port) for _ in range(n)]
    tasks = [
        asyncio.ensure_future(c.stream(f"events=1&hold_s={hold_s}", on_first=e))
        for c, e in zip(conns, firsts, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in firsts)), 30)
    await asyncio.sleep(0.3)
    during = proc.memory_info().rss
    await asyncio.gather(*tasks)
    for c in conns:
        c.close()
    return (during - before) / n


# -- processes ---------------------------------------------------------------------------


# CPU sets: (proxy under test, everything else); None when not pinning.
PINS: tuple[set[int], set[int]] | None = None


def pin(pid: int, proxy: bool) -> None:
    if PINS is not None:
        os.sched_setaffinity(pid, PINS[0] if proxy else PINS[1])


@contextmanager
def engine_process() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-engine"], stdout=subprocess.PIPE, text=True
    )
    pin(proc.pid, proxy=False)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


@contextmanager
def gateway_process(
    engine_port: int, *extra: str, source: Path | None = None
) -> Iterator[tuple[int, psutil.Process]]:
    """`llm-watchdog gateway` on a free port in front of the engine; `extra`: more options.

    `source`: another checkout's `watchdog/` folder (an older commit, to compare), run as
    the default install of its day ran: where its pyproject.toml does not depend on uvloop
    and httptools, they are hidden, so uvicorn falls back to asyncio's loop and h11.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_WATCHDOG")}
    tmp = tempfile.TemporaryDirectory() if source is not None else None
    if tmp is not None and source is not None:
        shadow = Path(tmp.name)
        (shadow / "llm_watchdog").symlink_to(source.resolve())
        project = source.resolve().parent / "pyproject.toml"
        wanted = project.read_text() if project.exists() else ""
        for name in ("uvloop", "httptools"):
            if f'"{name}' in wanted:
                continue  # a default dependency of that checkout: it ran with it
            (shadow / name).mkdir()
            (shadow / name / "__init__.py").write_text(f"raise ImportError('{name} hidden')\n")
        env["PYTHONPATH"] = str(shadow)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from llm_watchdog.gateway.cli import gateway; gateway()",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            f"http://127.0.0.1:{engine_port}",
            "--log-level",
            "info",
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    pin(proc.pid, proxy=True)
    assert proc.stderr is not None
    port = 0
    while not port:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("the gateway did not start")
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        port = int(found.group(1)) if found else 0
    # Keep reading its log: a full pipe would block the gateway at its next log line.
    drain = threading.Thread(target=proc.stderr.read, daemon=True)
    drain.start()
    try:
        yield port, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)
        drain.join(5)
        proc.stderr.close()
        if tmp is not None:
            tmp.cleanup()


@contextmanager
def haproxy_process(engine_port: int) -> Iterator[tuple[int, psutil.Process]]:
    with socket_port() as port, tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "haproxy.cfg"
        cfg.write_text(
            "global\n  nbthread 1\n  maxconn 4096\n"
            "defaults\n  mode http\n  option http-no-delay\n  timeout connect 5s\n"
            "  timeout client 60s\n  timeout server 60s\n"
            f"frontend fe\n  bind 127.0.0.1:{port}\n  default_backend be\n"
            f"backend be\n  server engine 127.0.0.1:{engine_port} maxconn 1000\n"
        )
        proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pin(proc.pid, proxy=True)
        try:
            deadline = time.monotonic() + 10
            while not _listening(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("haproxy did not start")
                time.sleep(0.05)
            yield port, psutil.Process(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# -- profile ---------------------------------------------------------------------------


def start_sampler(proc: psutil.Process, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `proc` (CPU only, idle waits left out) until SIGINT."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    sampler = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(proc.pid),
            "--format",
            "raw",
            "--rate",
            "500",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pin(sampler.pid, proxy=False)
    time.sleep(1.0)  # attached before the load starts
    return sampler


# Where a frame's time is put: the first pattern its file or function matches, leaf first.
CATEGORIES = (
    ("event loop (uvloop/asyncio, epoll, callbacks)", ("uvloop", "asyncio/", "selectors")),
    ("client side HTTP (uvicorn protocol, ASGI cycle)", ("uvicorn/",)),
    ("upstream HTTP (gateway/upstream.py)", ("gateway/upstream.py",)),
    (
        "direct path (gateway/protocol.py, gateway/direct.py)",
        ("gateway/protocol.py", "gateway/direct.py"),
    ),
    ("proxy logic (gateway/proxy.py, admission, observe)", ("gateway/",)),
    ("Starlette (own paths only)", ("starlette/",)),
    ("h11 (pure-Python HTTP)", ("h11/",)),
)


def summarize_profile(path: Path, top: int = 12) -> None:
    """Self time by category and by function, from py-spy's collapsed stacks."""
    by_function: dict[str, int] = {}
    by_category: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        leaf = frames[-1]
        by_function[leaf] = by_function.get(leaf, 0) + n
        category = "other (interpreter, stdlib)"
        for frame in reversed(frames):
            found = next((c for c, pats in CATEGORIES if any(p in frame for p in pats)), None)
            if found is not None:
                category = found
                break
        by_category[category] = by_category.get(category, 0) + n
        total += n
    if not total:
        print("  no samples")
        return
    for category, n in sorted(by_category.items(), key=lambda kv: -kv[1]):
        print(f"  {100 * n / total:5.1f} %  {category}")
    print("  top functions by self time:")
    for function, n in sorted(by_function.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:5.1f} %  {function[:110]}")


# -- report ------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--no-haproxy", action="store_true")
    parser.add_argument(
        "--in-step",
        action="store_true",
        help="start every worker at once (waves of simultaneous requests)",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="let the OS place every process (no own core)"
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run the gateway from another checkout's watchdog/ folder (e.g. main's)",
    )
    parser.add_argument(
        "--pattern",
        choices=("both", "staggered", "waves", "none"),
        default="both",
        help="staggered keep-alive workers, waves of fresh connections, both, or none "
        "(relay and memory only)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="sample each gateway with py-spy into DIR/<name>.txt and print where its CPU "
        "time goes (sampling costs CPU: take figures from a run without it)",
    )
    parser.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_engine:
        asyncio.run(_serve_engine())
        return

    scale = 0.2 if args.quick else 1.0
    # concurrency -> (requests per client, query). One stream alone: short answers, many
    # samples. Many streams: answers paced like an engine at 50 tokens/s per stream (16
    # events 20 ms apart), so 64 streams offer ~3,400 events/s, a busy GPU's worth.
    levels = {
        1: (int(400 * scale), "events=2"),
        8: (max(2, int(50 * scale)), "events=16&interval_ms=20"),
        16: (max(2, int(25 * scale)), "events=16&interval_ms=20"),
        64: (max(2, int(10 * scale)), "events=16&interval_ms=20"),
    }
    # concurrency -> waves; each wave is `concurrency` fresh connections sent together, the
    # engine's first token 50 ms after the request (the set-up).
    wave_query = "events=4&first_ms=50&interval_ms=20"
    wave_levels = {
        1: max(20, int(200 * scale)),
        8: max(10, int(60 * scale)),
        16: max(6, int(40 * scale)),
        64: max(4, int(20 * scale)),
    }
    # one answer's length (16 events 20 ms apart): the window the workers' starts spread over
    stagger_s = 0.0 if args.in_step else 0.3
    use_haproxy = not args.no_haproxy and shutil.which("haproxy") is not None
    global PINS
    PINS = split_cpus(not args.no_pin)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} (1 min)")
    if PINS is None:
        print("placement: unpinned (every process shares every core)")
    else:
        print(
            f"placement: proxy on CPU {sorted(PINS[0])}, engine and client on CPU {sorted(PINS[1])}"
        )
        pin(os.getpid(), proxy=False)

    with ExitStack() as stack:
        engine_port = stack.enter_context(engine_process())
        gw_port, gw_proc = stack.enter_context(gateway_process(engine_port))
        proxies: dict[str, tuple[int, psutil.Process | None]] = {
            "direct": (engine_port, None),
            "gateway": (gw_port, gw_proc),
        }
        if args.before is not None:
            proxies["before"] = stack.enter_context(
                gateway_process(engine_port, source=args.before)
            )
        if use_haproxy:
            proxies["haproxy"] = stack.enter_context(haproxy_process(engine_port))
        samplers: dict[str, subprocess.Popen[bytes]] = {}
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            for name in ("gateway", "before"):
                if name in proxies and proxies[name][1] is not None:
                    samplers[name] = start_sampler(proxies[name][1], args.profile / f"{name}.txt")
        if args.pattern in ("both", "staggered"):
            print(
                "\narrivals: keep-alive workers, "
                + ("in step (every worker at once)" if stagger_s == 0 else "staggered")
            )
            report_ttft(proxies, levels, stagger_s)
        if args.pattern in ("both", "waves"):
            print("\narrivals: waves of fresh connections sent together, first token at 50 ms")
            report_waves(proxies, wave_levels, wave_query)
        report_relay(proxies, scale)
        for name, sampler in samplers.items():
            sampler.send_signal(signal.SIGINT)
            sampler.wait(30)
            assert args.profile is not None
            print(f"\nWhere {name}'s CPU time goes (py-spy samples, {args.profile}/{name}.txt)")
            summarize_profile(args.profile / f"{name}.txt")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def report_ttft(
    proxies: dict[str, tuple[int, psutil.Process | None]],
    levels: dict[int, tuple[int, str]],
    stagger_s: float,
) -> None:
    print("TTFT, client side (request written -> first body chunk), milliseconds;")
    print("cpu us/req: the proxy process's CPU time (user+sys) per request in that run")
    print(
        f"{'streams':>7} {'path':>8} {'n':>5} {'p50':>7} {'p99':>7} {'+p50':>7} {'+p99':>7} "
        f"{'cpu us/req':>10}"
    )
    for concurrency, (per_worker, query) in levels.items():
        base: tuple[float, float] | None = None
        for name, (port, proc) in proxies.items():
            before = cpu_s(proc) if proc else 0.0
            ttfts = asyncio.run(ttft_run(port, concurrency, per_worker, query, stagger_s))
            cpu = f"{(cpu_s(proc) - before) / len(ttfts) * 1e6:.0f}" if proc else ""
            p50, p99 = pct(ttfts, 0.50) * 1000, pct(ttfts, 0.99) * 1000
            if base is None:
                base = (p50, p99)
                added = ("", "")
            else:
                added = (f"{p50 - base[0]:+.3f}", f"{p99 - base[1]:+.3f}")
            print(
                f"{concurrency:>7} {name:>8} {len(ttfts):>5} {p50:>7.3f} {p99:>7.3f} "
                f"{added[0]:>7} {added[1]:>7} {cpu:>10}"
            )


def report_waves(
    proxies: dict[str, tuple[int, psutil.Process | None]],
    levels: dict[int, int],
    query: str,
) -> None:
    print("TTFT, client side (connect -> first body chunk), milliseconds; x: added / HAProxy's")
    print(
        f"{'streams':>7} {'path':>8} {'n':>5} {'p50':>7} {'p99':>7} {'+p50':>7} {'+p99':>7} "
        f"{'x p50':>6} {'x p99':>6} {'cpu us/req':>10}"
    )
    # HAProxy runs right after the direct path, so each proxy's row can show the ratio.
    order = sorted(proxies, key=lambda n: {"direct": 0, "haproxy": 1}.get(n, 2))
    for concurrency, waves in levels.items():
        rows: dict[str, tuple[float, float]] = {}
        for name in order:
            port, proc = proxies[name]
            before = cpu_s(proc) if proc else 0.0
            ttfts = asyncio.run(wave_run(port, concurrency, waves, query))
            cpu = f"{(cpu_s(proc) - before) / len(ttfts) * 1e6:.0f}" if proc else ""
            rows[name] = (pct(ttfts, 0.50) * 1000, pct(ttfts, 0.99) * 1000)
            base = rows["direct"]
            added = (rows[name][0] - base[0], rows[name][1] - base[1])
            ha = rows.get("haproxy")
            ratio = ("", "")
            if ha is not None and name != "haproxy":
                ha_added = (ha[0] - base[0], ha[1] - base[1])
                ratio = tuple(  # type: ignore[assignment]
                    f"{a / h:.2f}" if h > 0 else "-" for a, h in zip(added, ha_added, strict=True)
                )
            shown = ("", "") if name == "direct" else (f"{added[0]:+.3f}", f"{added[1]:+.3f}")
            print(
                f"{concurrency:>7} {name:>8} {len(ttfts):>5} {rows[name][0]:>7.3f} "
                f"{rows[name][1]:>7.3f} {shown[0]:>7} {shown[1]:>7} {ratio[0]:>6} {ratio[1]:>6} "
                f"{cpu:>10}"
            )


def report_relay(proxies: dict[str, tuple[int, psutil.Process | None]], scale: float) -> None:
    print("\nRelay, 64 streams; events per CPU-second of the proxy process (one event loop)")
    print(f"{'mode':>10} {'path':>8} {'events':>7} {'wall/s':>8} {'cpu s':>6} {'per cpu-s':>9}")
    events = int(400 * scale)
    for mode, interval_ms in (("paced 5ms", 5.0), ("saturated", 0.0)):
        for name, (port, proc) in proxies.items():
            if proc is None:
                continue
            before = cpu_s(proc)
            n, wall = asyncio.run(relay_run(port, 64, events, interval_ms))
            used = cpu_s(proc) - before
            print(
                f"{mode:>10} {name:>8} {n:>7} {n / wall:>8.0f} {used:>6.2f} "
                f"{n / used if used else float('nan'):>9.0f}"
            )

    print("\nMemory per open stream (RSS growth with the streams held open)")
    n_open = 256
    for name, (port, proc) in proxies.items():
        if proc is None:
            continue
        per = asyncio.run(hold_open(port, n_open, 2.0, proc))
        print(f"{name:>8}: {per / 1024:.1f} KiB per stream ({n_open} open)")
    print(f"(one SSE event is {len(EVENT)} bytes on the wire)")


if __name__ == "__main__":
    main()
