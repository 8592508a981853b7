"""Soak: the daemon as `llm-watchdog run` wires it, through a real gateway to a real
streaming server, with RSS, open descriptors and threads sampled. Growth is judged after the
warm-up (targets: RSS <= 5 MB, descriptors and threads none).

Real minutes (default): APScheduler runs the jobs, probing every second with the control
loop on, over two heat-lab cards (the engine's process on card 0); samples every 10 s. With
--trace, tracemalloc compares the heap at the end of the warm-up with the end and prints the
lines that grew most: where a leak lives.

Simulated days (--days N): the same job table (`Daemon.jobs()`, each job guarded as the
scheduler runs it) stepped in due order on a virtual clock, so a week of the daemon's work
takes minutes: probes every 10 s, GPU samples every 1 s, control every 10 s, rollups and
pruning (raw rows kept --retention). The heat lab's card lives through each day: the air
follows a day/night cycle, a batch job loads the card from 08:00 to 20:00, and at 13:00 the
room heats by 22 °C for 40 minutes, so the clocks fall and the engine (whose first-token
delay follows the card's clock) slows: every day has a heat warning, a drift event, control
cuts and a recovery. Samples every simulated hour; day 1 is the warm-up.

    .venv/bin/python tests/benchmarks/bench_soak.py [--minutes 10] [--warmup 60] [--trace]
    .venv/bin/python tests/benchmarks/bench_soak.py --days 7 [--retention 2d]
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from bench_gateway import gateway_process  # noqa: E402

from llm_watchdog.alerts import AlertManager, LogSink  # noqa: E402
from llm_watchdog.config import settings_from_dict  # noqa: E402
from llm_watchdog.daemon.service import Daemon  # noqa: E402
from llm_watchdog.durations import parse_duration  # noqa: E402
from llm_watchdog.sim.fakenvml import FakeNvml, StandaloneDevice  # noqa: E402
from llm_watchdog.sim.scenario import GpuParams  # noqa: E402
from llm_watchdog.store.db import Store  # noqa: E402

DAY_S = 86400.0
BASE_DELAY_S = 0.008  # the engine's first-token delay on a cool, idle card


def rss_mb(field: str = "VmRSS") -> float:
    """Resident memory, MB. RssAnon is the heap and stacks; RSS also counts pages of mapped
    files (code, libraries), which grow as code paths first run and are no leak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def heap() -> tuple[int, float, float]:
    """Python's allocated blocks, and the C heap's bytes in use and free (glibc's mallinfo2,
    NaN elsewhere): whether RSS grows from objects kept, from C allocations kept, or from
    free memory the allocator holds on to."""
    blocks = sys.getallocatedblocks()
    try:
        info = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return blocks, float("nan"), float("nan")
    info.restype = _Mallinfo2
    m = info()
    return blocks, (m.uordblks + m.hblkhd) / 2**20, m.fordblks / 2**20


def db_size_mb(settings: Any) -> float:
    return Path(settings.storage.path).stat().st_size / 2**20


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Engine:
    """tests/helpers/streamserver.py in its own process; its first-token delay is set over
    its stdin."""

    def __init__(self, delay_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "helpers" / "streamserver.py"),
             "--first-token-delay-s", str(delay_s), "--answer", "Paris"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        self.delay_s = delay_s

    def set_delay(self, delay_s: float) -> None:
        if abs(delay_s - self.delay_s) <= 0.02 * self.delay_s:
            return
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"first_token_delay_s={delay_s}\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()  # "ok"
        self.delay_s = delay_s

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=10)


@contextmanager
def rig(tmp: str, engine: Engine, **overrides: dict[str, Any]) -> Iterator[tuple[dict, str]]:
    """A gateway process before the engine; the daemon's settings (dict) and the gateway URL."""
    with ExitStack() as stack:
        token = Path(tmp) / "token"
        token.write_text("soak-token\n")
        token.chmod(0o600)
        port, _ = stack.enter_context(
            gateway_process(urlsplit(engine.url).port or 80, "--token-file", str(token))
        )
        gw_url = f"http://127.0.0.1:{port}"
        raw: dict[str, Any] = {
            "server": {"url": gw_url},
            "storage": {"path": f"{tmp}/wd.db"},
            "control": {"enabled": True, "gateway_url": gw_url, "token_file": str(token),
                        "target_p95": "1s"},
        }  # fmt: skip
        for section, values in overrides.items():
            raw.setdefault(section, {}).update(values)
        yield raw, gw_url


def report(samples: list[tuple[float, float, int, int]], base: tuple, unit: str, per: float):
    last = samples[-1]
    span = (last[0] - base[0]) / per
    print(
        f"after warm-up     RSS {base[1]:.1f} -> {last[1]:.1f} MB ({last[1] - base[1]:+.1f} MB, "
        f"{(last[1] - base[1]) / max(span, 1e-9):+.2f} MB/{unit} over {span:.1f} {unit}); "
        f"peak {max(s[1] for s in samples):.1f} MB"
    )
    print(f"                  fds {base[2]} -> {last[2]}, threads {base[3]} -> {last[3]}")


# ---- real minutes ----------------------------------------------------------------------------


def lab_cards(engine: Engine, clock: Any) -> tuple[FakeNvml, list[StandaloneDevice]]:
    """Two heat-lab cards behind the fake NVML: the engine on card 0, another job on card 1."""
    cards = [
        StandaloneDevice(GpuParams(uuid=f"GPU-50a50a50-0000-4000-8000-00000000000{i}"))
        for i in range(2)
    ]
    nvml = FakeNvml(cards, clock=clock)
    nvml.set_compute_pids(0, [engine.proc.pid])
    cards[1].set_load(0.5, 0.0)
    return nvml, cards


def soak_minutes(args: argparse.Namespace) -> None:
    if args.trace:
        tracemalloc.start(args.trace_frames)
    engine = Engine(0.02)
    with tempfile.TemporaryDirectory() as tmp, rig(
        tmp, engine,
        probe={"interval": "1s", "jitter": "0s"},
        storage={"rollup_interval": "30s"},
    ) as (raw, _):  # fmt: skip
        settings = settings_from_dict(raw, "soak")
        store = Store(settings.storage.path, exclusive=True)
        alerts = AlertManager([LogSink()], store)
        t_lab = time.monotonic()
        nvml, cards = lab_cards(engine, lambda: time.monotonic() - t_lab)
        cards[0].set_load(0.6, 0.0)
        daemon = Daemon(settings, store, nvml=nvml, alerts=alerts)
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
            engine.close()
    assert base is not None
    print(f"probes            {probes}")
    report(samples, base, "min", 60.0)
    if args.trace and snap0 is not None and snap1 is not None:
        print("grew most (tracemalloc, since the end of the warm-up):")
        for stat in snap1.compare_to(snap0, "traceback")[:8]:
            print(f"  {stat.size_diff / 1024:+8.1f} KiB  {stat.count_diff:+6d} blocks")
            for line in stat.traceback.format()[-2 * args.trace_frames :]:
                print("     ", line)


# ---- simulated days --------------------------------------------------------------------------


class VirtualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Week:
    """The card's world at a time of day: the air, the batch job, the daily hot room."""

    HEAT_START_H, HEAT_HOURS, HEAT_C = 13.0, 40 / 60, 22.0

    def __init__(self, device: StandaloneDevice, start: float) -> None:
        self.device = device
        self.start = start

    def hour(self, now: float) -> float:
        return ((now - self.start) % DAY_S) / 3600

    def hot(self, now: float) -> bool:
        h = self.hour(now)
        return self.HEAT_START_H <= h < self.HEAT_START_H + self.HEAT_HOURS

    def load(self, now: float) -> float:
        return 0.85 if 8 <= self.hour(now) < 20 else 0.25

    def apply(self, now: float) -> None:
        h = self.hour(now)
        air = (
            22.0
            + 4.0 * math.sin(2 * math.pi * (h - 9) / 24)
            + (self.HEAT_C if self.hot(now) else 0)
        )
        self.device.set_load(self.load(now), now - self.start)
        self.device.gpu.ambient_c = air

    def engine_delay_s(self, now: float) -> float:
        snap = self.device.read(now - self.start)
        clock = max(snap.sm_clock_active_mhz, 1.0)
        return (
            BASE_DELAY_S
            * (self.device.params.sm_clock_max_mhz / clock)
            * (1 + 0.6 * self.load(now))
        )


def soak_days(args: argparse.Namespace) -> None:
    if args.trace:
        tracemalloc.start(args.trace_frames)
    snap0 = None
    start = float(int(time.time() // DAY_S) * DAY_S)  # midnight UTC today: hours read plainly
    clock = VirtualClock(start)
    engine = Engine(BASE_DELAY_S)
    nvml, cards = lab_cards(engine, lambda: clock.now - start)
    week = Week(cards[0], start)
    retention = args.retention
    with tempfile.TemporaryDirectory() as tmp, rig(
        tmp, engine,
        probe={"jitter": "0s"},
        control={"interval": "10s"},
        storage={"raw_retention": retention},
    ) as (raw, _):  # fmt: skip
        settings = settings_from_dict(raw, "soak")
        store = Store(settings.storage.path, exclusive=True, clock=clock)
        alerts = AlertManager([LogSink()], store, clock=clock)
        daemon = Daemon(settings, store, nvml=nvml, alerts=alerts, clock=clock, monotonic=clock)
        daemon.startup()
        jobs = daemon.jobs()
        due = [
            (start + (j.first_after_s if j.first_after_s is not None else j.interval_s), i)
            for i, j in enumerate(jobs)
        ]
        heapq.heapify(due)
        end = start + args.days * DAY_S
        samples: list[tuple[float, float, int, int]] = []
        anon: list[tuple[float, float]] = []
        next_sample = start
        t_real = time.monotonic()
        cpu0 = time.process_time()
        runs = dict.fromkeys((j.id for j in jobs), 0)
        try:
            while due[0][0] < end:
                at, i = heapq.heappop(due)
                clock.now = at
                week.apply(at)
                job = jobs[i]
                if job.id == "probe":
                    engine.set_delay(week.engine_delay_s(at))
                job.run()
                runs[job.id] += 1
                heapq.heappush(due, (at + job.interval_s, i))
                if at >= next_sample:
                    next_sample += 3600
                    if (
                        args.trace
                        and snap0 is None
                        and at - start >= min(DAY_S, args.days * DAY_S / 3)
                    ):
                        snap0 = tracemalloc.take_snapshot()
                    samples.append((at - start, rss_mb(), fds(), threading.active_count()))
                    anon.append((at - start, rss_mb("RssAnon")))
                    if len(samples) % 24 == 1 or args.hourly:
                        day = (at - start) / DAY_S
                        blocks, c_used, c_free = heap()
                        print(
                            f"day {day:4.1f}  RSS {samples[-1][1]:6.1f} MB"
                            f" (anon {anon[-1][1]:5.1f})  fds {samples[-1][2]:3d}"
                            f"  threads {samples[-1][3]:2d}  db {db_size_mb(settings):6.1f} MB"
                            f"  py blocks {blocks:8d}  C heap used {c_used:6.1f} free"
                            f" {c_free:5.1f} MB  ({time.monotonic() - t_real:5.0f} s real)",
                            flush=True,
                        )
            samples.append((clock.now - start, rss_mb(), fds(), threading.active_count()))
            anon.append((clock.now - start, rss_mb("RssAnon")))
            snap1 = tracemalloc.take_snapshot() if args.trace else None
            alerts.flush(timeout_s=5.0)
            counts = {
                "probes (kept raw)": store.rows("SELECT count(*) AS n FROM probes")[0]["n"],
                "drift events": store.rows("SELECT count(*) AS n FROM drift_events")[0]["n"],
                "control actions": store.rows("SELECT count(*) AS n FROM control_actions")[0]["n"],
                "alerts": store.rows("SELECT count(*) AS n FROM alerts")[0]["n"],
            }
            kinds = store.rows("SELECT kind, count(*) AS n FROM alerts GROUP BY kind ORDER BY kind")
            db_mb = db_size_mb(settings)
        finally:
            daemon.shutdown(timeout_s=5)
            alerts.close()
            store.close()
            engine.close()
    real_s = time.monotonic() - t_real
    print(
        f"simulated         {args.days:g} days in {real_s:.0f} s real, "
        f"{time.process_time() - cpu0:.0f} s CPU ({args.days * DAY_S / real_s:.0f}x real time)"
    )
    print("jobs run          " + ", ".join(f"{k} {v}" for k, v in runs.items()))
    print(
        "stored            "
        + ", ".join(f"{k} {v}" for k, v in counts.items())
        + f"; database {db_mb:.1f} MB"
    )
    print("alerts by kind    " + ", ".join(f"{r['kind']} {r['n']}" for r in kinds))
    warm = [s for s in samples if s[0] >= min(DAY_S, samples[-1][0] / 2)]
    print(
        "RSS at each day's end   "
        + "  ".join(f"{s[1]:.1f}" for s in samples if s[0] > 0 and abs(s[0] % DAY_S) < 1)
        + " MB"
    )
    report(samples, warm[0], "day", DAY_S)
    a0 = next(a for a in anon if a[0] >= warm[0][0])
    print(
        f"                  of it anonymous (heap): {a0[1]:.1f} -> {anon[-1][1]:.1f} MB "
        f"({anon[-1][1] - a0[1]:+.1f} MB)"
    )
    if snap0 is not None and snap1 is not None:
        print("grew most (tracemalloc, since the end of the warm-up):")
        for stat in snap1.compare_to(snap0, "traceback")[:8]:
            print(f"  {stat.size_diff / 1024:+8.1f} KiB  {stat.count_diff:+6d} blocks")
            for line in stat.traceback.format()[-2 * args.trace_frames :]:
                print("     ", line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--trace", action="store_true", help="tracemalloc: what grew")
    ap.add_argument(
        "--trace-frames", type=int, default=1,
        help="--trace: frames kept per allocation (1 is the line; more is slower)",
    )  # fmt: skip
    ap.add_argument("--days", type=float, default=0.0, help="simulated days instead of minutes")
    ap.add_argument("--hourly", action="store_true", help="--days: print every simulated hour")
    ap.add_argument(
        "--no-trim", action="store_true",
        help="leave the C heap's free memory with malloc (daemon/memory.py off): the A/B",
    )  # fmt: skip
    ap.add_argument("--retention", default="2d", help="raw rows kept (storage.raw_retention)")
    args = ap.parse_args()
    parse_duration(args.retention)
    if args.no_trim:
        import llm_watchdog.daemon.service as service

        service.release_free_memory = lambda: False  # type: ignore[assignment]
    if args.days:
        soak_days(args)
    else:
        soak_minutes(args)


if __name__ == "__main__":
    main()
