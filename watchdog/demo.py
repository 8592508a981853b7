"""`llm-watchdog demo`: the whole loop on a simulated card, in a few minutes.

Starts the heat lab (a simulated GPU and engine over real sockets), the gateway in front of
it, an extraction batch job that sends its requests through the gateway, and the daemon with
its canaries, NVML reader (on the simulated card), drift judge and control loop, all in this
process on real HTTP. A heat scenario compressed in time makes the card throttle; the demo
prints a line per probe and ends with a summary and where the database is. Ctrl-C stops it
cleanly: every server and thread it started is stopped before it returns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import os
import secrets
import shlex
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llm_watchdog.alerts import AlertEvent, AlertManager
from llm_watchdog.bench.loadgen import BatchLoad
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.logs import setup_logging
from llm_watchdog.models import GpuSample, ProbeResult
from llm_watchdog.nvml.throttle import is_idle, is_power, is_thermal, reason_names
from llm_watchdog.probe.engine import resolve_model
from llm_watchdog.report.data import nearest_rank
from llm_watchdog.sim.scenario import load_scenario
from llm_watchdog.sim.server import SimLab
from llm_watchdog.store.db import Store

BATCH_SETTLE_S = 5.0  # the batch job runs this long before the daemon starts


@dataclass
class DemoOptions:
    scenario: str = "demo"
    duration_s: float = 210.0
    time_scale: float = 20.0
    # Two canaries a second: the baseline then has 50 probes before the fans stop, and the
    # detector's margin for a baseline's own uncertainty (1.25/sqrt(n)) is small enough to
    # confirm the heat's slowdown while it lasts. Under the batch a third of the canaries land
    # on a prefill chunk at the power cap; they are in the baseline, which makes it noisier.
    probe_interval_s: float = 0.5
    batch_streams: int = 16  # what the batch job would like in flight
    # The static allowance a user would have set: chat meets its target with it on the cool
    # card and misses it on the hot one (docs/drift.md, "The demo").
    default_allowance: int = 4
    # No higher than the static one: the allowance that grows back after the heat is the one
    # chat was fine with, not more load than the baseline was learned under.
    ceiling: int = 4
    target_p95_ms: float | None = None  # None: the scenario's chat SLO
    baseline_probes: int = 50
    document_words: int = 700
    answer_tokens: int = 200
    db_path: Path | None = None
    control: bool = True


@dataclass
class DemoResult:
    db_path: Path
    probes: list[tuple[float, ProbeResult, GpuSample | None, int | None]] = field(
        default_factory=list
    )
    alerts: list[AlertEvent] = field(default_factory=list)
    allowances: list[tuple[float, int]] = field(default_factory=list)
    batch: dict[str, Any] = field(default_factory=dict)
    # (label, start s, end s) of the scenario's phases, in the demo's real seconds.
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    started_at: float = 0.0  # unix time of demo second 0 (alerts carry unix times)
    control: bool = True
    static_allowance: int | None = None
    time_scale: float = 1.0  # the card's seconds per demo second
    log_path: Path | None = None  # the daemon's log, beside the database or in the temp dir
    target_p95_ms: float | None = None  # chat's TTFT p95 target the control loop held to


class _ScreenSink:
    """An alert sink that prints to the demo's screen."""

    name = "screen"

    def __init__(self, say: Callable[[str], None], result: DemoResult) -> None:
        self.say = say
        self.result = result

    def accepts(self, alert: AlertEvent) -> bool:
        return True

    def send(self, alert: AlertEvent) -> None:
        self.result.alerts.append(alert)
        # A firing alert says its severity: a chat slowdown warns within the target and pages
        # past it, under its own key, and the screen shows both.
        mark = "RESOLVED" if alert.state == "resolved" else f"ALERT ({alert.level})"
        message = alert.message
        if alert.state == "resolved":
            # The page's resolution carries the warning's, resolved a line above, after its
            # own words: on screen, its own words alone, or it reads as the same line twice.
            told = [a.message for a in self.result.alerts[:-1] if a.state == "resolved"]
            said = next((m for m in told if message.endswith(": " + m)), None)
            if said is not None:
                message = message[: -len(said) - 2] + " (as above)"
        self.say(f"  >> {mark} {alert.kind}: {message}")

    def close(self) -> None:
        pass


def _line(t: float, r: ProbeResult, g: GpuSample | None, allowance: int | None) -> str:
    ttft = f"{r.ttft_ms:7.0f} ms" if r.ok and r.ttft_ms is not None else f"{'FAILED':>10}"
    cold = " cold" if r.cold else ""
    if g is None:
        gpu = "GPU -"
    else:
        # "idle" says why a clock reads 210 MHz under a thermal bit: the card had nothing to run.
        names = reason_names(g.throttle_reasons)
        reasons = ",".join("idle" if n == "gpu_idle" else n for n in names)
        gpu = (
            f"GPU {g.temp_c:3.0f} °C  SM {g.sm_clock_mhz:4.0f}/{g.sm_clock_max_mhz:4.0f} MHz"
            f"  {g.power_w:3.0f} W  {reasons or '-'}"
        )
    allow = "-" if allowance is None else str(allowance)
    return f"{t:6.0f}s  TTFT {ttft}{cold:5}  {gpu:<62} batch allowance {allow}"


def run_demo(
    opts: DemoOptions, say: Callable[[str], None] = print, stop: threading.Event | None = None
) -> DemoResult:
    stop = stop or threading.Event()
    scenario = load_scenario(opts.scenario)
    target = opts.target_p95_ms or scenario.slo_chat_ttft_p95_ms or 1000.0
    workdir = Path(tempfile.mkdtemp(prefix="llm-watchdog-demo-"))
    db_path = opts.db_path or workdir / "demo.db"
    result = DemoResult(
        db_path=db_path,
        control=opts.control,
        static_allowance=opts.default_allowance,
        time_scale=opts.time_scale,
        target_p95_ms=target,
    )
    log_file = workdir / "demo.log"
    result.log_path = log_file
    log_stream = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - closed in finally
    setup_logging("info", "text", stream=log_stream)
    token_file = workdir / "control-token"
    token_file.write_text(secrets.token_hex(16))
    token_file.chmod(0o600)

    started: list[Any] = []  # everything to stop, in reverse order
    try:
        lab = SimLab(scenario, time_scale=opts.time_scale, batch_streams=0)
        lab.start()
        started.append(lab.stop)
        gw = GatewayServer(
            GatewayConfig(
                upstream_url=lab.url,
                listen_port=0,
                batch_default_allowance=opts.default_allowance,
                batch_ceiling=opts.ceiling,
                max_queue_wait_s=5.0,
                control_token=token_file.read_text(),
                # The lab's engine says how many sequences it runs at once, as llama.cpp's
                # --parallel does: batch is held off the slots chat needs.
                engine_slots=scenario.engine.max_running_seqs,
            )
        ).start()
        started.append(gw.stop)
        model = resolve_model(lab.url)
        _warm_up(gw.url, model)
        result.phases = _phases(scenario, opts)
        say(f"heat lab: {scenario.name} ({scenario.description})")
        say(_time_note(opts.time_scale))
        say(f"engine {lab.url}  gateway {gw.url}  database {db_path}")
        say(
            f"chat SLO: TTFT p95 {target:.0f} ms; batch job wants {opts.batch_streams} streams "
            f"of {opts.document_words}-word documents, static allowance "
            f"{opts.default_allowance}"
        )
        settings = settings_from_dict(
            {
                "server": {"url": gw.url, "model": model},
                "probe": {
                    "interval": opts.probe_interval_s,
                    "jitter": 0,
                    "first_token_timeout": "20s",
                },
                "gpu": {"interval": "1s"},
                "storage": {"path": str(db_path)},
                "drift": {"baseline_probes": opts.baseline_probes},
                "api": {"listen": ""},
                "control": {
                    "enabled": opts.control,
                    "gateway_url": gw.url,
                    "token_file": str(token_file),
                    "target_p95": target / 1000.0,
                    "default_allowance": opts.default_allowance,
                    "ceiling": opts.ceiling,
                    "interval": "2s",
                    "lease": "1m",
                    "drain_time": "10s",
                    # The card's minutes pass time_scale times faster than the controller's.
                    # After heat the allowance holds until the clocks have been steady for
                    # ten of the card's minutes: a card that has just cooled heats again
                    # quickly, and chat's slowdown is still being judged over.
                    "freeze_release": 600.0 / opts.time_scale,
                    # The lab's engine says how many sequences it runs at once.
                    "engine_slots": scenario.engine.max_running_seqs,
                },
            },
            "demo",
        )
        store = Store(db_path)
        started.append(store.close)
        alerts = AlertManager([_ScreenSink(say, result)], store)
        started.append(alerts.close)
        # The batch job was running before the watchdog came: its first requests, let in
        # together, would otherwise be the control loop's first reading and the baseline's.
        load = BatchLoad(
            gw.url, model, opts.batch_streams, words=opts.document_words, max_tokens=120
        ).start()
        started.append(load.stop)
        stop.wait(BATCH_SETTLE_S)
        # Demo second 0 is the lab's: the scenario's schedule counts from there.
        t0 = time.monotonic() - lab.now()
        result.started_at = time.time() - lab.now()

        def on_probe(r: ProbeResult, g: GpuSample | None) -> None:
            # The allowance the probe was sent under, as its row keeps it: the control loop
            # runs on its own thread and may have moved it since.
            allowance = r.batch_allowance
            if allowance is None and not opts.control:  # nothing steers: the gateway's own
                allowance = opts.default_allowance
            t = time.monotonic() - t0
            result.probes.append((t, r, g, allowance))
            if (
                opts.control
                and allowance is not None
                and (not result.allowances or result.allowances[-1][1] != allowance)
            ):
                result.allowances.append((t, allowance))
            say(_line(t, r, g, allowance))

        # The engine runs in this process: NVML lists it as the card's compute process.
        lab.nvml.set_compute_pids(0, [os.getpid()])
        daemon = Daemon(settings, store, nvml=lab.nvml, alerts=alerts, on_probe=on_probe)
        if daemon.judge is not None:
            # The card's minutes pass time_scale times faster: so does the heat trend's window.
            cfg = daemon.judge.drift_config
            daemon.judge.drift_config = dataclasses.replace(
                cfg,
                heat_window_s=cfg.heat_window_s / opts.time_scale,
                heat_horizon_s=cfg.heat_horizon_s / opts.time_scale,
                heat_min_span_s=cfg.heat_min_span_s / opts.time_scale,
            )
        daemon.startup()
        daemon.start_jobs()
        started.append(lambda: daemon.shutdown(timeout_s=5))
        stop.wait(max(0.0, opts.duration_s - lab.now()))
        # Ctrl-C may end the run before the scenario's later phases: the summary tells only
        # the phases the run reached (the fans do not come back in a run stopped before).
        ended = lab.now()
        result.phases = [p for p in result.phases if p[1] <= ended]
        result.batch = load.stats.as_dict()
    finally:
        for fn in reversed(started):
            try:
                fn()
            except Exception as exc:  # keep stopping the rest
                say(f"(while stopping: {exc})")
        logging.getLogger().handlers.clear()
        log_stream.close()
    return result


def _warm_up(url: str, model: str) -> None:
    """One chat request through the gateway before anything is measured: the first request of
    a fresh process pays for connection pools and imports (2 s here), and the control loop
    would halve the allowance on it before the card has done anything."""
    try:
        httpx.post(
            url.rstrip("/") + "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            timeout=30,
        )
    except httpx.HTTPError:
        pass  # the demo goes on; its first probe is then the cold one


def _phases(scenario: Any, opts: DemoOptions) -> list[tuple[str, float, float]]:
    """Cut the run where the scenario's ambient temperature changes."""
    marks = [
        (e.at_s / opts.time_scale, e.ambient_c)
        for e in scenario.schedule
        if e.ambient_c is not None
    ]
    out, start, ambient = [], 0.0, scenario.gpu.ambient_c
    for at, new in marks:
        if at >= opts.duration_s:
            break
        out.append((f"air {ambient:.0f} °C", start, at))
        start, ambient = at, new
    out.append((f"air {ambient:.0f} °C", start, opts.duration_s + 60))
    return out


def story(result: DemoResult) -> list[tuple[float, str, str]]:
    """The heat story in the order it happened: (demo seconds, step, detail).

    Steps: heat_warning, throttled (the first probe with a thermal bit), chat_slowed (with its
    cause), over_target (where the slowdown passed chat's target and paged), cut (the first
    allowance cut after the warning or the slowdown, and each change after it before the
    regrowth), fans_back (the scenario's ambient returns), resolved (the
    slowdown's event ends), regrown (the first raise of the allowance after the fans return).
    The last two are judged apart: the event ends when chat is back at its baseline, the
    allowance grows when chat's p95 is well under its target and the clocks have settled, so
    either may come first.
    """
    t0 = result.started_at
    steps: list[tuple[float, str, str]] = []

    def at(ts: float) -> float:
        return ts - t0

    def first_alert(kind: str, state: str) -> AlertEvent | None:
        return next((a for a in result.alerts if a.kind == kind and a.state == state), None)

    warn = first_alert("heat_warning", "firing")
    if warn is not None:
        steps.append((at(warn.ts), "heat_warning", warn.message))
    hot = next(
        (
            (t, g)
            for t, _, g, _ in result.probes
            if g is not None and is_thermal(g.throttle_reasons)
        ),
        None,
    )
    if hot is not None:
        steps.append(
            (hot[0], "throttled", f"{hot[1].temp_c:.0f} °C, SM {hot[1].sm_clock_mhz:.0f} MHz")
        )
    slow = first_alert("chat_slowed", "firing")
    if slow is not None:
        steps.append((at(slow.ts), "chat_slowed", f"({slow.cause}) {slow.message}"))
    # The page, where chat passed its target: the one moment a user of the chat felt it.
    page = next(
        (
            a
            for a in result.alerts
            if a.kind == "chat_slowed" and a.state == "firing" and a.severity == "critical"
        ),
        None,
    )
    if page is not None and page is not slow:
        steps.append((at(page.ts), "over_target", f"({page.cause}) {page.message}"))
    begin = min(
        (t for t, step, _ in steps if step in ("heat_warning", "chat_slowed")), default=None
    )
    cut = None  # (demo s, before, after) of the first cut after the warning or the slowdown
    if begin is not None:
        prev = None
        for t, a in result.allowances:
            if prev is not None and a < prev and t >= begin:
                cut = (t, prev, a)
                break
            prev = a
    back = None
    for label, start, _ in result.phases[2:3]:
        steps.append((start, "fans_back", label))
        back = start
    if slow is not None:
        done = next((a for a in result.alerts if a.key == slow.key and a.state == "resolved"), None)
        if done is not None:
            steps.append((at(done.ts), "resolved", done.message))
    regrown_at = None
    if back is not None:
        prev = None
        for i, (t, a) in enumerate(result.allowances):
            if prev is not None and a > prev and t >= back:
                detail = f"batch allowance {prev} → {a}"
                # Where the regrowth got to: a step of one, then the rest of the way, reads
                # as a gap in "4 → 1 → 0 → 1 → 4" without it.
                top_t, top = max(result.allowances[i:], key=lambda x: (x[1], -x[0]))
                if top > a:
                    detail += f", up to {top} at {top_t:.0f}s"
                steps.append((t, "regrown", detail))
                regrown_at = t
                break
            prev = a
    if cut is not None:
        # The lowest level before the regrowth too: the allowance may go up and down again
        # while the card is hot, and "cut 4 → 3" then "regrown 1 → 4" reads as a gap.
        t_cut, before, after = cut
        end = regrown_at if regrown_at is not None and regrown_at > t_cut else float("inf")
        later = [(t, a) for t, a in result.allowances if t_cut < t < end]
        detail = f"batch allowance {before} → {after}"
        if 0 < len(later) <= 4:
            # Each change while hot: a probe upward on the hot card is why chat may miss
            # its target after the cut, and "4 → 1, down to 0" would hide it.
            detail += ", then " + ", ".join(f"{a} at {t:.0f}s" for t, a in later)
        elif later:
            low_t, low = min(later, key=lambda x: (x[1], x[0]))
            detail += f", then {len(later)} changes" + (
                f", down to {low} at {low_t:.0f}s" if low < after else ""
            )
        steps.append((t_cut, "cut", detail))
    return sorted(steps, key=lambda s: s[0])


def summary(result: DemoResult, command: str = "llm-watchdog") -> list[str]:
    """The closing lines: what the run showed, and commands that look closer at its database.
    `command` is how this llm-watchdog runs from a shell (a path where it is not on PATH)."""
    warm = [(t, r, g, a) for t, r, g, a in result.probes if r.ok and not r.cold and r.ttft_ms]
    lines = ["", "summary"]
    if result.time_scale != 1:
        lines.append(f"  time             {_time_note(result.time_scale)}")
    if warm:
        ttfts = [t for _, r, _, _ in warm if (t := r.ttft_ms) is not None]
        lines.append(
            f"  probes           {len(result.probes)}; warm TTFT p50 "
            f"{statistics.median(ttfts):.0f} ms, p95 {_p95(ttfts):.0f} ms"
        )
    temps = [g.temp_c for _, _, g, _ in result.probes if g is not None and g.temp_c]
    masks = [g.throttle_reasons for _, _, g, _ in result.probes if g is not None]
    heat = sum(1 for m in masks if is_thermal(m))
    # The power cap alone: a cool card at full load touches it too, and it is not heat.
    power = sum(1 for m in masks if is_power(m) and not is_thermal(m))
    if temps:
        lines.append(
            f"  GPU              peak {max(temps):.0f} °C; slowed by heat in {heat} of "
            f"{len(result.probes)} probes"
            + (f", at its power cap (not hot) in {power}" if power else "")
        )
    if result.allowances:
        path = " → ".join(str(a) for _, a in result.allowances)
        lines.append(f"  batch allowance  {path}")
    elif not result.control:
        lines.append(
            f"  batch allowance  {result.static_allowance} throughout (--no-control: "
            "watched, not steered)"
        )
    for label, start, end in result.phases:
        rows = [(r, g, a) for t, r, g, a in result.probes if start <= t < end]
        ttfts = [t for r, _, _ in rows if r.ok and not r.cold and (t := r.ttft_ms)]
        timed = [
            (t, ms)
            for t, r, _, _ in result.probes
            if start <= t < end and r.ok and not r.cold and (ms := r.ttft_ms)
        ]
        allow = [a for _, _, a in rows if a is not None]
        # The clock chat ran at: an idle card's clock is its floor, whatever the heat.
        clocks = [
            g.sm_clock_mhz
            for _, g, _ in rows
            if g is not None and g.sm_clock_mhz and not is_idle(g.throttle_reasons)
        ]
        if not ttfts:
            continue
        lines.append(
            f"  {start:4.0f}-{min(end, result.probes[-1][0]):4.0f}s {label:<9} chat p50 "
            f"{statistics.median(ttfts):4.0f} ms, p95 {_p95(ttfts):4.0f} ms (worst "
            f"{WORST_WINDOW_S:.0f} s {_worst_p95(timed):4.0f} ms), "
            f"SM clock median {f'{statistics.median(clocks):5.0f}' if clocks else '    -'} MHz, "
            f"allowance {min(allow) if allow else '-'}..{max(allow) if allow else '-'}"
        )
    fired = [a for a in result.alerts if a.state == "firing"]
    for a in fired:
        lines.append(f"  alert            {a.kind} ({a.cause}, {a.level}): {a.message}")
    told = story(result)
    if told:
        lines.append("  what happened, in order")
        for t, step, detail in told:
            lines.append(f"    {t:5.0f}s {step:<13} {detail}")
    if result.batch:
        lines.append(
            f"  batch job        {result.batch['ok']} documents done, "
            f"{result.batch['chars_per_s']:.0f} chars/s, {result.batch['rejected']} "
            "told to retry later (429)"
        )
    db = result.db_path
    log = f"  (daemon log: {result.log_path})" if result.log_path else ""
    lines.append(f"  database         {db}{log}")
    lines.extend(follow_ups(result, command))
    return lines


def follow_ups(result: DemoResult, command: str = "llm-watchdog") -> list[str]:
    """Commands to paste that read the run's database. Those that judge chat name the run's
    target: without it they judge against the config's default (2 s), under which the
    demo's slow windows (about 500 ms against a 400 ms SLO) count as met."""
    db = shlex.quote(str(result.db_path))
    lines = [f"  look closer      {command} drift --db {db}"]
    if not result.probes or result.started_at <= 0:
        return lines
    # From the run's second 0, in local time: the command reads the same run however long
    # after it is pasted (a `--since 10m` would miss it).
    since = dt.datetime.fromtimestamp(int(result.started_at)).isoformat()
    # ... to its last probe's second: a report reaching on to now would draw the run in the
    # first part of its charts, and count the empty windows after it.
    last = max(p[1].ts for p in result.probes)
    until = dt.datetime.fromtimestamp(math.ceil(last + 1)).isoformat()
    target = f" --target {duration_arg(result.target_p95_ms)}" if result.target_p95_ms else ""
    lines.append(
        f"  draw it          {command} report --db {db} --since {since} --until {until}"
        f"{target} --out demo.html"
    )
    lines.append(f"  headroom         {command} headroom --db {db} --since {since}{target}")
    return lines


def duration_arg(ms: float) -> str:
    """A target in milliseconds as `report --target` and `headroom --target` read it."""
    return f"{ms:.0f}ms" if ms == int(ms) else f"{ms:g}ms"


def _time_note(scale: float) -> str:
    """What a rate in the demo's messages means, when the card's heat runs faster than the
    clock on the wall: the trend is measured in demo seconds."""
    if scale == 1:
        return "the card's heat runs in real time"
    return (
        f"the card's heat runs {scale:g}x fast: one demo minute is {scale:g} of the card's, "
        f"so a °C/min in a message is per demo minute ({scale:g}x the card's own rate)"
    )


# A phase's p95 hides how it went within it: chat slowed by heat for the seconds before the
# cut, then fast with batch at 0, reads as one fast phase. The worst window says the first,
# and the median beside it what a slower clock does to every answer. The windows and the
# p95 are the report's (`llm-watchdog report` over the run: 10-s windows from its start,
# nearest rank), so the summary and the picture show the same figure.
WORST_WINDOW_S = 10.0


def _worst_p95(timed: list[tuple[float, float]]) -> float:
    """The highest chat TTFT p95 over the WORST_WINDOW_S windows from demo second 0 that
    the (demo second, TTFT ms) points fall in."""
    windows: dict[int, list[float]] = {}
    for t, ms in timed:
        windows.setdefault(int(t // WORST_WINDOW_S), []).append(ms)
    return max(_p95(w) for w in windows.values())


def _p95(values: list[float]) -> float:
    """Nearest rank, as the report takes it."""
    p = nearest_rank(values, 0.95)
    if p is None:
        raise ValueError("p95 of no values")
    return p
