"""CLI commands of the judging side: `drift`, `baseline`, `alerts`, `replay`, and the trace
export of `history`. Registered on the group by importing `llm_watchdog.cli`."""

from __future__ import annotations

import bisect
import csv
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import click

from llm_watchdog.alerts import AlertConfigError, LogSink, load_alerts, send_test
from llm_watchdog.cli.group import (
    ConfigFail,
    Fail,
    cli,
    db_option,
    make_folder,
    open_store,
    reach_server,
    settings_from,
    when_arg,
    window_args,
)
from llm_watchdog.cli.output import emit, listing_options, stamp
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.drift import (
    DriftMonitor,
    ReplayError,
    baseline_from_observations,
    observation_from,
    replay_file,
)
from llm_watchdog.drift.replay import CONTRACT_COLUMNS, THRESHOLD_COLUMNS, WAIT_COLUMNS
from llm_watchdog.drift.values import ttft_over_ms
from llm_watchdog.durations import parse_duration
from llm_watchdog.logs import printable
from llm_watchdog.nvml.serving import worst_gpu
from llm_watchdog.nvml.thresholds import throttle_onset
from llm_watchdog.store.db import probe_from_row, sample_from_row
from llm_watchdog.store.records import baselines, deliveries, events, reset_baselines, save_baseline
from llm_watchdog.store.thresholds import learned_thresholds

# ---- drift ----------------------------------------------------------------------------------

DRIFT_COLUMNS = ["start", "end", "kind", "cause", "baseline_p95_ms", "peak_p95_ms", "message"]


@cli.command()
@db_option
@click.option("--since", default="7d", show_default=True, help="A duration back or an ISO date.")
@click.option("--until", help="End (default now).")
@click.option("--open", "only_open", is_flag=True, help="Only events still open.")
@listing_options
@click.pass_context
def drift(ctx: click.Context, since: str, until: str | None, only_open: bool, fmt: str) -> None:
    """Drift events (chat slowed, heat warning, quality, cold starts …) with cause and evidence."""

    settings = settings_from(ctx)
    now = time.time()
    since_ts, until_ts = window_args(since, until, now)
    with open_store(settings, read_only=True) as store:
        rows = events(store, since_ts, until_ts)
    if only_open:
        rows = [r for r in rows if r["end_ts"] is None]
    for r in rows:
        r["start"] = stamp(r["start_ts"]) if fmt == "table" else r["start_ts"]
        r["end"] = (
            (stamp(r["end_ts"]) if r["end_ts"] else "open") if fmt == "table" else r["end_ts"]
        )
    columns = (
        DRIFT_COLUMNS
        if fmt == "table"
        else [
            "id",
            "start_ts",
            "end_ts",
            "kind",
            "cause",
            "baseline_p95_ms",
            "peak_p95_ms",
            "evidence",
            "message",
            "fingerprint_id",
        ]
    )
    emit(rows, columns, fmt)


# ---- baseline -------------------------------------------------------------------------------


@cli.group()
def baseline() -> None:
    """Show, capture or reset the latency baseline drift is judged against."""


BASELINE_COLUMNS = [
    "fingerprint_id",
    "source",
    "created",
    "n",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "temp_c",
    "sm_clock_mhz",
    "throttled",
    "retired",
]


@baseline.command("show")
@db_option
@click.option("--all", "show_all", is_flag=True, help="Include retired baselines.")
@listing_options
@click.pass_context
def baseline_show(ctx: click.Context, show_all: bool, fmt: str) -> None:
    """The baseline in use for each fingerprint (what 'normal' is)."""

    settings = settings_from(ctx)
    with open_store(settings, read_only=True) as store:
        rows = baselines(store, include_retired=show_all)
    for r in rows:
        r["created"] = stamp(r["created_ts"]) if fmt == "table" else r["created_ts"]
        r["retired"] = stamp(r["reset_ts"]) if r.get("reset_ts") else ""
    emit(rows, BASELINE_COLUMNS, fmt)


@baseline.command("reset")
@db_option
@click.option("--fingerprint", help="Only this fingerprint's baseline (default: all).")
@click.pass_context
def baseline_reset(ctx: click.Context, fingerprint: str | None) -> None:
    """Retire the baseline; the daemon learns a new one from the next warm probes."""

    settings = settings_from(ctx)
    with open_store(settings) as store:
        n = reset_baselines(store, time.time(), fingerprint)
    click.echo(f"retired {n} baseline(s); a running daemon re-learns within a minute")


@baseline.command("capture")
@db_option
@click.option(
    "--for",
    "duration",
    default="30m",
    show_default=True,
    help="Probe for this long now (at probe.interval) and take the baseline from it.",
)
@click.option(
    "--from-history",
    "from_history",
    metavar="DURATION",
    help="Instead of probing, use the probes recorded in the last DURATION.",
)
@click.pass_context
def baseline_capture(ctx: click.Context, duration: str, from_history: str | None) -> None:
    """Take a baseline explicitly, e.g. right after a known-good deploy."""

    settings = settings_from(ctx)
    try:
        seconds = parse_duration(from_history or duration)
    except ValueError as exc:
        option = "--from-history" if from_history else "--for"
        raise click.BadParameter(str(exc), param_hint=option) from None
    make_folder(settings)
    if not from_history:
        # A server that is not up would be probed, and fail, for the whole --for (30 min by
        # default), and its failures and fingerprint left in the database.
        reach_server(settings)
    with open_store(settings, must_exist=bool(from_history)) as store:
        if from_history:
            fingerprint_id, observations = _history_observations(store, time.time() - seconds)
        else:
            fingerprint_id, observations = _probe_for(settings, store, seconds)

        try:
            b = baseline_from_observations(
                observations,
                fingerprint_id=fingerprint_id,
                created_ts=time.time(),
                source="capture",
                config=settings.drift_config(),
            )
        except ValueError as exc:
            raise Fail(f"{exc}: capture for longer, or check `llm-watchdog history`") from None
        save_baseline(store, b)
    click.echo(
        f"baseline for {fingerprint_id}: TTFT p50 {b.ttft_p50_ms:.0f} ms, "
        f"p95 {b.ttft_p95_ms:.0f} ms from {b.n} probes"
        + (" (all throttled: judged against a hot card)" if b.throttled else "")
    )


def _history_observations(store: Any, since_ts: float) -> tuple[str, list[Any]]:
    fp = store.latest_fingerprint()
    if fp is None:
        raise Fail("no probes recorded yet: run the daemon first, or capture with --for")
    rows = [r for r in store.probes(since_ts) if r["fingerprint_id"] == fp["id"]]
    samples = [sample_from_row(r) for r in store.gpu_samples(since_ts)]
    nearest = _nearest_sampler(samples)
    return fp["id"], [
        observation_from(probe_from_row(r), nearest(r["ts"]), cold=bool(r["cold"])) for r in rows
    ]


def _probe_for(settings: Any, store: Any, seconds: float) -> tuple[str, list[Any]]:
    quiet = replace(settings, drift=replace(settings.drift, enabled=False))
    daemon = Daemon(quiet, store)
    daemon.startup()
    observations = []
    said: str | None = None
    deadline = time.monotonic() + seconds
    click.echo(
        f"probing {settings.server.url} every {settings.probe.interval_s:g}s for {seconds:g}s …",
        err=True,
    )
    try:
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            if daemon.reader.available:
                daemon.sample_gpu()
            result = daemon.probe_once()
            observations.append(observation_from(result, daemon.serving_gpu(), cold=result.cold))
            if not result.ok and result.error_detail != said:
                said = result.error_detail  # each new failure once, not one a probe
                why = said or result.error_class or "no detail"
                click.echo(f"probe failed: {printable(why)}", err=True)
            time.sleep(max(0.0, settings.probe.interval_s - (time.monotonic() - t0)))
    finally:
        daemon.shutdown(timeout_s=2)
    assert daemon.fingerprint_id is not None
    return daemon.fingerprint_id, observations


def _nearest_sampler(samples: list[Any], learned: dict[str, float] | None = None) -> Any:
    """The GPU state a probe at `ts` was judged on: of each GPU's latest sample at or before it
    (within 60 s), the worst one (llm_watchdog.nvml.serving.worst_gpu), as the daemon chose."""
    by_gpu: dict[int, list[Any]] = {}
    for s in sorted(samples, key=lambda s: s.ts):
        by_gpu.setdefault(s.gpu_index, []).append(s)
    stamps = {i: [s.ts for s in rows] for i, rows in by_gpu.items()}
    learned = learned or {}

    def onset(s: Any) -> Any:
        return throttle_onset(
            target_c=s.temp_target_c,
            gpu_max_c=None,
            slowdown_c=s.temp_slowdown_c,
            learned_c=learned.get(s.uuid),
        )

    def nearest(ts: float) -> Any:
        found = []
        for i, rows in by_gpu.items():
            k = bisect.bisect_right(stamps[i], ts) - 1
            if k >= 0 and ts - stamps[i][k] <= 60:
                found.append(rows[k])
        if len(found) <= 1:
            return found[0] if found else None
        return worst_gpu(found, {s.gpu_index: onset(s) for s in found})

    return nearest


# ---- trace export / replay ------------------------------------------------------------------


def _trace_columns() -> tuple[str, ...]:
    return (*CONTRACT_COLUMNS, *THRESHOLD_COLUMNS, *WAIT_COLUMNS)


def export_trace(store: Any, since_ts: float | None, until_ts: float | None, out: TextIO) -> int:
    """Write recorded probes as a replay trace (the CSV contract in the README, "Replay traces")."""

    samples = [sample_from_row(r) for r in store.gpu_samples(since_ts, until_ts)]
    learned = learned_thresholds(store)
    nearest = _nearest_sampler(samples, learned)

    def target_c(g: Any) -> float | None:
        # The card's target temperature, else the one it was first seen to throttle at.
        if g is None:
            return None
        return g.temp_target_c if g.temp_target_c is not None else learned.get(g.uuid)

    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_trace_columns())
    n = 0

    def cell(v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, bool):
            return int(v)
        return v

    for r in store.probes(since_ts, until_ts):
        g = nearest(r["ts"])
        writer.writerow(
            [
                cell(v)
                for v in (
                    r["ts"],
                    r["ttft_ms"] if r["ok"] else None,
                    r["ok"],
                    r["cold"],
                    r["quality_pass"],
                    g.temp_c if g else None,
                    g.sm_clock_mhz if g else None,
                    g.sm_clock_max_mhz if g else None,
                    g.power_w if g else None,
                    g.power_limit_w if g else None,
                    g.throttle_reasons if g else None,
                    r.get("batch_inflight"),
                    r.get("batch_allowance"),
                    target_c(g),
                    g.temp_slowdown_c if g else None,
                    ttft_over_ms(bool(r["ok"]), r["error_class"], r["total_ms"]),
                )
            ]
        )
        n += 1
    return n


@cli.command()
@click.argument("trace", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per event per line (the replay contract).",
)
@click.pass_context
def replay(ctx: click.Context, trace: str, as_json: bool) -> None:
    """Run the daemon's detector over a recorded trace (CSV) and print the drift events.

    TRACE is a CSV file (`-`: standard input) with a header row: `ts` (unix seconds) and
    `ttft_ms` are required; `ok`, `cold`, `quality_pass` and the GPU columns
    (`gpu_temp_c`, `sm_clock_mhz`, `sm_clock_max_mhz`, `power_w`, `throttle_reasons`, ...)
    are read where present. `llm-watchdog history --since 7d --export-trace week.csv`
    writes one from the daemon's database. Events are judged with this config's [drift]
    settings.
    """

    settings = settings_from(ctx)
    if trace != "-" and not Path(trace).exists():
        raise Fail(
            f"{trace}: no such file; export one with "
            "`llm-watchdog history --since 7d --export-trace week.csv`"
        )
    path: Any = trace
    if trace == "-":
        import shutil
        import tempfile

        with tempfile.NamedTemporaryFile("wb", suffix=".csv", delete=False) as tmp:
            shutil.copyfileobj(sys.stdin.buffer, tmp)  # streamed: a trace may be large
        path = tmp.name
    config = settings.drift_config()
    monitor = DriftMonitor(config, fingerprint_id="replay")
    try:
        found = replay_file(path, config, monitor)
    except ReplayError as exc:
        raise Fail(str(exc)) from None
    except OSError as exc:
        raise Fail(f"{trace}: cannot read ({exc.strerror})") from None
    finally:
        if trace == "-":
            Path(path).unlink()
    if monitor.baseline is None:
        # Latency events are judged against a baseline: without one, a trace whose daemon
        # learned its baseline sooner (a smaller baseline_probes) replays to fewer events.
        clean, needed = monitor.state().learning
        click.echo(
            f"note: no baseline learned: {clean} clean warm probes of the {needed} it takes "
            "([drift] baseline_probes), so no latency event could open; replay with the "
            "drift settings of the daemon that recorded it (e.g. "
            "LLM_WATCHDOG__DRIFT__BASELINE_PROBES=50 for the demo's)",
            err=True,
        )
    if as_json:
        for ev in found:
            click.echo(ev.to_json())
        return
    rows = [
        {"start": stamp(e.start_ts), "end": stamp(e.end_ts) if e.end_ts else "open", **e.to_dict()}
        for e in found
    ]
    emit(rows, DRIFT_COLUMNS, "table")


# ---- alerts ---------------------------------------------------------------------------------

ALERT_COLUMNS = [
    "time",
    "kind",
    "cause",
    "state",
    "severity",
    "sink",
    "ok",
    "attempts",
    "error",
    "message",
]


@cli.group(invoke_without_command=True)
@db_option
@click.option("--since", default="7d", show_default=True, help="A duration back or an ISO date.")
@click.option("--failed", is_flag=True, help="Only deliveries that failed.")
@listing_options
@click.pass_context
def alerts(ctx: click.Context, since: str, failed: bool, fmt: str) -> None:
    """What was sent to which sink, and what failed. `alerts test` sends a test alert."""
    if ctx.invoked_subcommand is not None:
        return
    settings = settings_from(ctx)
    since_ts = when_arg(since, time.time())
    assert since_ts is not None  # --since has a default
    with open_store(settings, read_only=True) as store:
        rows = deliveries(store, since_ts)
    if failed:
        rows = [r for r in rows if not r["ok"]]
    for r in rows:
        r["time"] = stamp(r["ts"]) if fmt == "table" else r["ts"]
        r["ok"] = bool(r["ok"])
    emit(rows, ALERT_COLUMNS, fmt)


@alerts.command("test")
@click.pass_context
def alerts_test(ctx: click.Context) -> None:
    """Send a test alert to every configured sink now; exit 1 if any failed."""

    settings = settings_from(ctx)
    try:
        _, sinks = load_alerts(settings.alerts, env=os.environ)
    except AlertConfigError as exc:
        raise ConfigFail(f"{settings.source}: {exc}") from None
    if not sinks:
        click.echo("no sinks configured in [alerts]; testing the log sink", err=True)
        sinks = [LogSink()]
    store = None
    if Path(settings.storage.path).exists():
        store = open_store(settings)
    try:
        results = send_test(sinks, recorder=store)
    finally:
        if store is not None:
            store.close()
        for sink in sinks:
            close = getattr(sink, "close", None)
            if close:
                close()
    for r in results:
        verdict = "ok" if r.ok else f"FAILED: {r.error}"
        click.echo(f"{r.sink}: {verdict} ({r.elapsed_ms:.0f} ms)")
    if not all(r.ok for r in results):
        sys.exit(1)


def export_trace_to(
    settings: Any, target: str, since_ts: float | None, until_ts: float | None
) -> None:
    with open_store(settings, read_only=True) as store:
        if target == "-":
            n = export_trace(store, since_ts, until_ts, sys.stdout)
        else:
            try:
                fh = open(target, "w", newline="")
            except OSError as exc:
                raise Fail(
                    f"cannot write the trace to {target}: {exc.strerror or exc}; "
                    "check that its folder exists and is writable"
                ) from None
            with fh:
                n = export_trace(store, since_ts, until_ts, fh)
    click.echo(f"wrote {n} probes to {'stdout' if target == '-' else target}", err=True)


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
