"""The `bench` command group: run the protocol, list and show stored runs, compare two."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import httpx

from llm_watchdog.bench.batchset import BatchSetError, load_batch_set, synthetic_batch_set
from llm_watchdog.bench.compare import VIA_DIRECT, VIA_GATEWAY, compare_runs, target_label
from llm_watchdog.bench.observe import answers, metrics_source, unreachable_line
from llm_watchdog.bench.run import (
    COLD_AUTO,
    BenchError,
    BenchPlan,
    BenchResult,
    Progress,
    parse_levels,
    run_bench,
)
from llm_watchdog.bench.summary import (
    NO_TIMINGS_NOTE,
    cold_summary,
    per_class_line,
    stored_interval_note,
)
from llm_watchdog.cli.group import Fail, cli, reach_server, settings_from
from llm_watchdog.cli.output import emit, listing_options, percent, stamp
from llm_watchdog.cli.urlargs import LAB_URL, SERVER_URL
from llm_watchdog.cli.worker import run_stoppable
from llm_watchdog.daemon.service import probe_options, server_port
from llm_watchdog.durations import parse_duration
from llm_watchdog.nvml.reader import NvmlReader
from llm_watchdog.probe.client import Prober
from llm_watchdog.probe.engine import gateway_identity
from llm_watchdog.probe.fingerprint import build_fingerprint
from llm_watchdog.probe.procinfo import listening_process_cmdline, on_this_machine
from llm_watchdog.store import bench as stored
from llm_watchdog.store.db import Store, StoreError

LEVEL_COLUMNS = [
    "batch_streams",
    "chat_probes",
    "quality_pass_rate",
    "chat_failed",
    "chat_wrong",
    "chat_p50_ms",
    "chat_p95_ms",
    "chat_p95_low_ms",
    "chat_p95_high_ms",
    "chat_p99_ms",
    "batch_requests_ok",
    "batch_output_per_s",
    "batch_output_unit",
    "batch_rejected",
    "batch_queue_cap_hits",
    "batch_wait_p95_ms",
    "engine_waiting_mean",
    "engine_queue_ms_mean",
    "engine_prefill_ms_mean",
    "temp_c_max",
    "sm_clock_mhz_min",
    "throttled_share",
    "complete",
]
LEVEL_HEADERS = {
    "batch_streams": "batch",
    "chat_probes": "probes",
    "quality_pass_rate": "quality",
    "chat_failed": "failed",
    "chat_wrong": "wrong",
    "chat_p50_ms": "p50_ms",
    "chat_p95_ms": "p95_ms",
    "chat_p95_low_ms": "p95_lo",
    "chat_p95_high_ms": "p95_hi",
    "chat_p99_ms": "p99_ms",
    "batch_requests_ok": "batch_ok",
    "batch_output_per_s": "batch_per_s",
    "batch_output_unit": "unit",
    "batch_rejected": "rejected",
    "batch_queue_cap_hits": "cap_hits",
    "batch_wait_p95_ms": "wait_p95_ms",
    "engine_waiting_mean": "eng_wait",
    "engine_queue_ms_mean": "eng_q_ms",
    "engine_prefill_ms_mean": "eng_pf_ms",
    "temp_c_max": "temp_max_c",
    "sm_clock_mhz_min": "clk_min_mhz",
    "throttled_share": "throttled",
}
# Shares of 1 in JSON and CSV; percentages on a table, as the live line prints quality.
PERCENT_COLUMNS = ("quality_pass_rate", "throttled_share", "quality_a", "quality_b")
# The per-class view (engine timings per request): in JSON and CSV as columns, under the
# table as one line a level, with the counts behind each figure.
PER_CLASS_COLUMNS = [
    "chat_timed",
    "chat_engine_wait_p50_ms",
    "chat_engine_wait_p95_ms",
    "chat_prefill_p50_ms",
    "batch_timed",
    "batch_engine_wait_p50_ms",
    "batch_engine_wait_p95_ms",
    "batch_prefill_p50_ms",
    "per_class_note",
]
# In JSON and CSV: the right answers behind the percentiles, and why a level has no p95
# interval (too few of them); on a table, a line under it.
INTERVAL_COLUMNS = ["chat_right", "chat_interval_note"]
LIST_COLUMNS = [
    "id",
    "started",
    "complete",
    "engine",
    "engine_version",
    "model",
    "levels",
    "probe_set",
    "launch_command",
]
COMPARE_COLUMNS = [
    "batch_streams",
    "quality_a",
    "quality_b",
    "chat_p95_a_ms",
    "chat_p95_b_ms",
    "chat_p95_diff_ms",
    "chat_p95_diff_low_ms",
    "chat_p95_diff_high_ms",
    "verdict",
    "batch_output_a_per_s",
    "batch_output_b_per_s",
    "batch_output_unit",
    "engine_queue_a_ms",
    "engine_queue_b_ms",
    "chat_engine_wait_a_ms",
    "chat_engine_wait_b_ms",
    "probes_a",
    "probes_b",
]


def _db_option(fn: Any) -> Any:
    return click.option(
        "--db",
        type=click.Path(dir_okay=False),
        help="Database file (default: storage.path of the config).",
    )(fn)


def _store(ctx: click.Context, db: str | None, must_exist: bool) -> Store:
    path = Path(db) if db else Path(settings_from(ctx).storage.path)
    if must_exist and not path.exists():
        raise Fail(f"no database at {path}: run `llm-watchdog bench --url …` first, or pass --db")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return Store(path)
    except OSError as exc:
        raise Fail(f"cannot create {path.parent} ({exc.strerror}): pass --db PATH") from None
    except StoreError as exc:
        raise Fail(str(exc)) from None


@cli.group(invoke_without_command=True)
@click.option("--url", type=SERVER_URL, help="Server (or gateway) base URL (default: server.url).")
@click.option("--model", help="Model name (default: server.model; 'auto' asks the server).")
@click.option(
    "--chat-set", help="Probe set for chat: a name or a .toml path (default: probe.probe_set)."
)
@click.option("--batch-set", type=str, help="Batch set .toml (default: synthetic documents).")
@click.option(
    "--batch-streams",
    default="0,2,4,8",
    show_default=True,
    help="Comma-separated batch concurrency levels to measure.",
)
@click.option("--duration", default="60s", show_default=True, help="Measuring time per level.")
@click.option("--warmup", default="5s", show_default=True, help="Batch fill time before a level.")
@click.option("--queue-cap", help="Give a batch request up if its response has not begun in this.")
@click.option(
    "--cold-start",
    default=COLD_AUTO,
    show_default=True,
    help="auto (the engine's own unload: Ollama), none, or a COMMAND that restarts the server.",
)
@click.option(
    "--document-words",
    default=700,
    show_default=True,
    type=click.IntRange(10),
    help="Size of each synthetic batch document.",
)
@click.option(
    "--batch-max-tokens",
    type=click.IntRange(1),
    help="Answer length of each batch request (default: the batch set's, 64).",
)
@click.option(
    "--launch-command",
    help="How the server was started (default: the gateway's /control/identity behind an "
    "llm-watchdog gateway, else read from /proc).",
)
@click.option(
    "--sim-gpu",
    type=LAB_URL,
    help="Read the GPU of a heat lab (`llm-watchdog sim serve`) at URL instead of NVML.",
)
@click.option(
    "--metrics-url",
    type=SERVER_URL,
    help="Where the engine's /metrics (and llama.cpp's /slots) are read (default: the server; "
    "behind an llm-watchdog gateway, the engine it names in /control/identity).",
)
@_db_option
@click.option("--no-store", is_flag=True, help="Print only; do not store the run.")
@listing_options
@click.pass_context
def bench(ctx: click.Context, fmt: str, **opts: Any) -> None:
    """Chat TTFT p50/p95/p99 and batch throughput at each batch concurrency, on your server.

    A cold start apart, then each level: a batch job of that many streams while the fixed
    chat prompts measure TTFT and answer quality, with the engine's queue and the GPU read
    beside it. Every run is stored: `bench list`, `bench show ID`, `bench compare A B`.
    """
    if ctx.invoked_subcommand is not None:
        return
    _run(ctx, fmt, **opts)


def _run(
    ctx: click.Context,
    fmt: str,
    url: str | None,
    model: str | None,
    chat_set: str | None,
    batch_set: str | None,
    batch_streams: str,
    duration: str,
    warmup: str,
    queue_cap: str | None,
    cold_start: str,
    document_words: int,
    batch_max_tokens: int | None,
    launch_command: str | None,
    sim_gpu: str | None,
    metrics_url: str | None,
    db: str | None,
    no_store: bool,
) -> None:
    settings = settings_from(ctx)
    try:
        levels = parse_levels(batch_streams)
        seconds = parse_duration(duration)
        warmup_s = parse_duration(warmup)
        cap_s = parse_duration(queue_cap) if queue_cap else None
    except ValueError as exc:
        raise click.BadParameter(
            f"{exc}; e.g. --batch-streams 0,2,4 --duration 60s --queue-cap 2s"
        ) from None
    try:
        bset = load_batch_set(batch_set) if batch_set else synthetic_batch_set(document_words)
    except BatchSetError as exc:
        raise Fail(str(exc)) from None
    if batch_max_tokens is not None:
        bset = replace(bset, max_tokens=batch_max_tokens)
    server = replace(
        settings.server, url=url or settings.server.url, model=model or settings.server.model
    )
    probe = replace(settings.probe, probe_set=chat_set or settings.probe.probe_set)
    settings = replace(settings, server=server, probe=probe)
    store = None if no_store else _store(ctx, db, must_exist=False)
    target = reach_server(settings)
    pset, api_key, chosen, engine = target.probe_set, target.api_key, target.model, target.engine
    plan = BenchPlan(tuple(levels), seconds, warmup_s, cap_s, cold_start)
    opts = probe_options(settings, engine)
    # Behind an llm-watchdog gateway: the run is through it (a different path to the engine
    # than straight at it, which `bench compare` names) and the engine's queue figures are
    # read on the engine it names, not on the gateway.
    identity = gateway_identity(server.url)
    engine_url = identity.get("upstream") if identity else None
    metrics_at, metrics_line = metrics_source(server.url, identity, metrics_url)
    if identity and metrics_url is None and metrics_at != server.url:
        if not answers(metrics_at, api_key):
            metrics_line = unreachable_line(metrics_at, server.url, engine_url)
    config = {
        "levels": list(levels),
        "duration_s": seconds,
        "warmup_s": warmup_s,
        "queue_cap_s": cap_s,
        "cold_start": cold_start,
        "chat_gap_s": plan.chat_gap_s,
        "batch_max_tokens": bset.max_tokens,
        "cache_mode": opts.cache_mode,
        "api": opts.api,
        "first_token_timeout_s": opts.first_token_timeout_s,
        # The path to the engine (compare.TARGET_CONFIG_KEYS: the "target" variable).
        "via": VIA_GATEWAY if identity else VIA_DIRECT,
        "engine_url": engine_url if isinstance(engine_url, str) else None,
        "metrics_url": metrics_at,
    }
    reader = NvmlReader(nvml=_sim_nvml(sim_gpu) if sim_gpu else None)
    gpu_ok = reader.start()
    infos = reader.infos() if gpu_ok else []
    fp = build_fingerprint(
        engine=engine,
        engine_version=target.info.version,
        model=chosen,
        launch_command=launch_command
        or _launch_command(server.url, server.launch_command, identity),
        driver_version=reader.driver_version() if gpu_ok else None,
        gpu_name=infos[0].name if infos else None,
        gpu_uuid=infos[0].uuid if infos else None,
        probe_set_hash=pset.sha256,
        config_hash=None,
    )
    say = _Display(sys.stderr.isatty())
    if metrics_line:
        click.echo(f"# {metrics_line}", err=True)
    lab_line = lab_batch_line(sim_gpu) if sim_gpu else None
    if lab_line:
        click.echo(f"# warning: {lab_line}", err=True)
    stop = threading.Event()
    result = BenchResult()
    started = time.time()

    def work() -> None:
        with Prober(server.url, chosen, opts, api_key=api_key) as prober:
            run_bench(
                prober,
                pset,
                bset,
                server.url,
                chosen,
                engine,
                plan,
                api_key=api_key,
                reader=reader if gpu_ok else None,
                stop=stop,
                progress=say.progress,
                level_done=say.level_done,
                result=result,
                metrics_url=metrics_at,
            )

    # Ctrl-C ends the run between two requests, and what was measured is stored.
    try:
        _, error = run_stoppable(work, stop, "bench", "stopping: keeping what was measured …")
    finally:
        reader.stop()
    if error is not None:
        result.complete = False
        result.stop_reason = str(error) if isinstance(error, BenchError) else repr(error)
    elif stop.is_set():
        result.complete, result.stop_reason = False, "interrupted (Ctrl-C)"
    say.clear()
    run_id = None
    if store is not None:
        key = fp.key_fields()
        run = {
            "started_ts": started,
            "ended_ts": time.time(),
            "complete": result.complete,
            "stop_reason": result.stop_reason,
            "url": server.url,
            **{
                k: key[k]
                for k in (
                    "engine",
                    "engine_version",
                    "model",
                    "launch_command",
                    "driver_version",
                    "gpu_name",
                    "gpu_uuid",
                    "probe_set_hash",
                )
            },
            "probe_set": pset.name,
            "batch_set": bset.name,
            "batch_set_hash": bset.sha256,
            "fingerprint_id": fp.id,
            "config": config,
            "cold_start": result.cold_start,
            "levels": result.levels,
        }
        with store:
            run_id = stored.save_run(
                store, run, result.chat_rows, result.batch_rows, result.gpu_rows
            )
    if fmt == "table":
        click.echo(cold_summary(result.cold_start) if result.cold_start else "cold start: -")
    else:
        click.echo(cold_summary(result.cold_start) if result.cold_start else "", err=True)
    _levels(result.levels, fmt)
    for line in _interval_lines(result.levels):
        click.echo(f"# {line}", err=True)
    for line in unloaded_levels(result.levels):
        click.echo(f"# {line}", err=True)
    for lv in result.levels:
        if lv.get("engine_note"):
            click.echo(f"# batch {lv['batch_streams']}: {lv['engine_note']}", err=True)
            break
    for line in _per_class_lines(result.levels):
        click.echo(f"# per class, {line}", err=True)
    if run_id is not None:
        state = "" if result.complete else " (incomplete)"
        click.echo(f"# stored as bench run #{run_id}{state}", err=True)
    if isinstance(error, BenchError):
        raise Fail(str(error))
    if error is not None:
        raise error
    if not result.complete:
        raise Fail(f"interrupted: what was measured is stored as run #{run_id}, marked incomplete")


def unloaded_levels(levels: list[dict[str, Any]]) -> list[str]:
    """A warning for each level that asked for batch streams and finished no batch request:
    its chat figures were measured without the load its row names (behind a gateway whose
    allowance a watchdog cut to 0, every batch request waits out --queue-cap)."""
    out = []
    for lv in levels:
        streams = lv.get("batch_streams") or 0
        if streams > 0 and not lv.get("batch_requests_ok"):
            held = lv.get("batch_queue_cap_hits") or 0
            refused = lv.get("batch_rejected") or 0
            why = (
                f"{held} waited past --queue-cap, {refused} rejected"
                if held or refused
                else "none came back"
            )
            out.append(
                f"batch {streams}: no batch request finished ({why}): its chat figures are "
                "without that load; behind a gateway, see its batch allowance (GET /control)"
            )
    return out


def _sim_nvml(url: str) -> Any:
    # Imported here: the lab's remote NVML loads pynvml's constants, which only this option
    # needs.
    from llm_watchdog.sim.remote import remote_nvml

    try:
        return remote_nvml(url)
    except Exception as exc:  # any failure to read the lab is the same advice
        raise Fail(
            f"cannot read the heat lab's GPU at {url}/sim/gpu ({type(exc).__name__}): "
            "is `llm-watchdog sim serve` running there?"
        ) from None


def lab_batch_line(url: str, transport: httpx.BaseTransport | None = None) -> str | None:
    """A warning where the heat lab at `url` runs a batch job of its own: its streams load
    the engine at every level besides bench's, so "batch 0" is not batch-free. None where it
    runs none, or its /sim/state cannot be read (the GPU read at /sim/gpu says so already)."""
    from llm_watchdog.sim.remote import lab_batch_streams

    streams = lab_batch_streams(url, transport)
    if streams is None or streams <= 0:
        return None
    return (
        f"the heat lab at {url} runs {streams} batch streams of its own besides bench's, so "
        f"each level has {streams} more than its row says (batch 0 has {streams}); for "
        "bench's levels alone, start it with `llm-watchdog sim serve --batch-streams 0`"
    )


_UNREAD: Any = object()


def _launch_command(url: str, configured: str, identity: Any = _UNREAD) -> str | list[str] | None:
    """The server's launch command; `identity` is the gateway's /control/identity where it
    was read already (None: not a gateway), else it is read here."""
    if configured != "auto":
        return configured
    # Behind an llm-watchdog gateway the listening process is the gateway: its identity
    # names the engine's command line, which `bench compare` diffs flag by flag.
    ident = gateway_identity(url) if identity is _UNREAD else identity
    if ident is not None:
        command = ident.get("launch_command")
        return command if isinstance(command, str) else None
    port = server_port(url)
    host = urlsplit(url).hostname or ""
    if port is None or not on_this_machine(host):
        return None
    return listening_process_cmdline(port, host=host)


class _Display:
    """Progress while a level runs: one line rewritten in place on a terminal, a plain line
    every 10 s otherwise (a log file gets no carriage returns)."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self._last = 0.0
        self._shown = False

    def progress(self, p: Progress) -> None:
        p95 = f"{p.p95_ms:.0f} ms" if p.p95_ms is not None else "-"
        line = f"batch {p.batch_streams}: {p.left_s:.0f} s left, {p.probes} probes, p95 {p95}"
        if self.tty:
            click.echo("\r" + line.ljust(72), nl=False, err=True)
            self._shown = True
        elif time.monotonic() - self._last >= 10:
            self._last = time.monotonic()
            click.echo(f"# {line}", err=True)

    def level_done(self, lv: dict[str, Any]) -> None:
        self.clear()
        p95 = lv.get("chat_p95_ms")
        q = lv.get("quality_pass_rate")
        out = lv.get("batch_output_per_s")
        right = lv.get("chat_right")
        click.echo(
            f"# batch {lv['batch_streams']}: chat p95 "
            + (f"{p95:.0f} ms" if p95 is not None else "-")
            + (" (too few probes for an interval)" if lv.get("chat_interval_note") else "")
            + (f", {right} right answers" if right is not None else "")
            + (f", quality {percent(q)}" if q is not None else "")
            + (
                f", batch {out:.0f} {lv['batch_output_unit']}/s"
                if out is not None and lv.get("batch_output_unit")
                else ""
            ),
            err=True,
        )

    def clear(self) -> None:
        if self._shown:
            click.echo("\r" + " " * 72 + "\r", nl=False, err=True)
            self._shown = False


@bench.command("list")
@_db_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1))
@listing_options
@click.pass_context
def list_cmd(ctx: click.Context, db: str | None, limit: int, fmt: str) -> None:
    """Stored bench runs, newest first."""
    with _store(ctx, db, must_exist=True) as store:
        runs = stored.list_runs(store, limit)
    rows = [
        dict(
            r,
            started=stamp(r["started_ts"]),
            levels=",".join(str(lv["batch_streams"]) for lv in r["levels"]),
        )
        for r in runs
    ]
    emit(rows, LIST_COLUMNS, fmt)


def _get(store: Store, run_id: int) -> dict[str, Any]:
    run = stored.get_run(store, run_id)
    if run is None:
        raise Fail(f"no bench run #{run_id}: `llm-watchdog bench list` shows the stored ones")
    return run


@bench.command("show")
@click.argument("run_id", type=int)
@_db_option
@click.option("--requests", is_flag=True, help="The raw per-request rows instead.")
@listing_options
@click.pass_context
def show_cmd(ctx: click.Context, run_id: int, db: str | None, requests: bool, fmt: str) -> None:
    """One stored run: what produced it, its cold start and its levels."""
    with _store(ctx, db, must_exist=True) as store:
        run = with_interval_rule(_get(store, run_id))
        rows = stored.run_requests(store, run_id) if requests else []
    if requests:
        emit(rows, stored.REQUEST_LISTING_COLUMNS, fmt)
        return
    if fmt == "json":
        click.echo(json.dumps(run, sort_keys=True, default=str))
        return
    if fmt == "table":
        state = "complete" if run["complete"] else f"INCOMPLETE ({run.get('stop_reason')})"
        for line in (
            f"bench run #{run['id']}  {stamp(run['started_ts'])}  {state}",
            f"server   {target_label(run)}: {run['engine']} {run['engine_version']}, "
            f"model {run['model']}",
            f"launch   {run['launch_command']}",
            f"gpu      {run['gpu_name']}, driver {run['driver_version']}",
            f"chat set {run['probe_set']} ({run['probe_set_hash'][:12]}), "
            f"batch set {run['batch_set']} ({run['batch_set_hash'][:12]})",
            f"config   {json.dumps(run['config'], sort_keys=True)}",
            cold_summary(run["cold_start"]) if run["cold_start"] else "cold start: -",
        ):
            click.echo(line)
    _levels(run["levels"], fmt)
    if fmt == "table":
        for line in _interval_lines(run["levels"]):
            click.echo(line)
        for line in _per_class_lines(run["levels"]):
            click.echo(f"per class, {line}")


def _levels(levels: list[dict[str, Any]], fmt: str) -> None:
    columns = (
        LEVEL_COLUMNS if fmt == "table" else LEVEL_COLUMNS + PER_CLASS_COLUMNS + INTERVAL_COLUMNS
    )
    emit(as_shown(levels, fmt), columns, fmt, headers=LEVEL_HEADERS)


def as_shown(rows: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
    """Rows for `fmt`: on a table, shares as percentages; JSON and CSV keep the numbers."""
    if fmt != "table":
        return rows
    return [
        dict(r, **{c: percent(r[c]) for c in PERCENT_COLUMNS if r.get(c) is not None}) for r in rows
    ]


def _interval_lines(levels: list[dict[str, Any]]) -> list[str]:
    """One line for each level whose p95 has no interval: too few right answers."""
    out = []
    for lv in levels:
        note = lv.get("chat_interval_note") or stored_interval_note(lv)
        if note:
            out.append(f"batch {lv.get('batch_streams')}: {note}")
    return out


def with_interval_rule(run: dict[str, Any]) -> dict[str, Any]:
    """A stored run as it is shown: a level stored before levels with too few right answers
    lost their p95 interval loses it here too, and says why, as a new run's level does."""
    levels = []
    for lv in run.get("levels") or []:
        note = lv.get("chat_interval_note") or stored_interval_note(lv)
        if note and "chat_interval_note" not in lv:
            lv = dict(lv, chat_interval_note=note, chat_p95_low_ms=None, chat_p95_high_ms=None)
        levels.append(lv)
    return dict(run, levels=levels)


def _per_class_lines(levels: list[dict[str, Any]]) -> list[str]:
    """One line a level; where no level had timed requests, the note once (it is the engine's
    doing, the same at every level). A run stored before the per-class view gets the note."""
    if levels and not any(lv.get("chat_timed") or lv.get("batch_timed") for lv in levels):
        return [NO_TIMINGS_NOTE]
    return [per_class_line(lv) for lv in levels]


@bench.command("compare")
@click.argument("a", type=int)
@click.argument("b", type=int)
@_db_option
@listing_options
@click.pass_context
def compare_cmd(ctx: click.Context, a: int, b: int, db: str | None, fmt: str) -> None:
    """What differs between runs A and B, and B's chat p95 against A's per level."""
    if a == b:
        # Every difference would be 0 and every verdict "same": a table that reads as a
        # result, not as the mistyped id it is.
        raise click.UsageError(
            f"#{a} against itself: the same run, nothing to compare; give two run ids"
            ": `llm-watchdog bench list` shows them",
            ctx=ctx,
        )
    with _store(ctx, db, must_exist=True) as store:
        run_a, run_b = _get(store, a), _get(store, b)
        chat_a = stored.run_requests(store, a, "chat")
        chat_b = stored.run_requests(store, b, "chat")
    result = compare_runs(run_a, run_b, chat_a, chat_b)
    if fmt == "json":
        click.echo(json.dumps(result, sort_keys=True, default=str))
        return
    if fmt == "table":
        for line in result["quality_drops"]:
            click.echo(f"QUALITY: {line}")
        click.echo(f"B (#{b}) against A (#{a}): what differs")
        for d in result["differences"]:
            click.echo(f"  {d['variable']}: {d['a']} -> {d['b']}")
        if not result["differences"]:
            click.echo("  nothing")
        for w in result["warnings"]:
            click.echo(f"warning: {w}")
        for line in result["scheduler"]:
            click.echo(f"scheduler: {line}")
    emit(as_shown(result["levels"], fmt), COMPARE_COLUMNS, fmt)
