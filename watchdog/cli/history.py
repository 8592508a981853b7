"""CLI commands that read what the daemon recorded: `status`, `history`."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from llm_watchdog.cli.group import (
    cli,
    db_option,
    open_store,
    settings_from,
    when_arg,
    window_args,
)
from llm_watchdog.cli.headroom import TargetMs, status_line
from llm_watchdog.cli.judge import export_trace_to
from llm_watchdog.cli.output import emit, listing_options, one_of_flags, stamp
from llm_watchdog.cli.report import fleet_listing
from llm_watchdog.cli.urlargs import PROMETHEUS_URL
from llm_watchdog.durations import human_duration
from llm_watchdog.logs import printable
from llm_watchdog.nvml.throttle import reason_names
from llm_watchdog.store.control import actions as control_actions
from llm_watchdog.store.control import last_action
from llm_watchdog.store.db import AUTO_1M_MAX_S, AUTO_RAW_MAX_S, GPU_HISTORY_COLUMNS, Store
from llm_watchdog.store.records import active_baseline, events

# ---- status / history -----------------------------------------------------------------------


@cli.command()
@db_option
@click.option(
    "--target",
    "target_ms",
    type=TargetMs(),
    default=None,
    help="Chat p95 TTFT target for the headroom row: 400ms, 1.5s (default: the one the "
    "daemon steered by, else control.target_p95).",
)
@click.option("--json", "as_json", is_flag=True, help="Print as one JSON object.")
@click.pass_context
def status(ctx: click.Context, target_ms: float | None, as_json: bool) -> None:
    """Last probe, last GPU sample per GPU, the fingerprint, the control loop's last decision,
    and the database path."""
    settings = settings_from(ctx)
    now = time.time()
    with open_store(settings, read_only=True) as store:
        last = store.last_probe()
        gpus = store.last_gpu_samples()
        fp = (
            store.fingerprint(last["fingerprint_id"])
            if last and last.get("fingerprint_id")
            else store.latest_fingerprint()
        )

        stored = active_baseline(store, fp["id"]) if fp else None
        baseline = stored.to_dict() if stored else None
        open_events = [e for e in events(store) if e["end_ts"] is None]
        room_line, room = status_line(
            store,
            settings.control.target_p95_s * 1000.0,
            now,
            given_ms=target_ms,
            per_minute=settings.control.chat_per_minute,
        )
        control = control_state(store)
    data = {
        "database": settings.storage.path,
        "last_probe": last,
        "gpus": gpus,
        "fingerprint": fp,
        "baseline": baseline,
        "open_events": open_events,
        "headroom": room,
        "control": control,
    }
    if as_json:
        click.echo(json.dumps(data, default=str, indent=2))
        return
    _say(f"database     {settings.storage.path}")
    if last:
        verdict = "ok" if last["ok"] else f"FAILED ({last['error_class']})"
        ttft = f"{last['ttft_ms']:.1f} ms" if last.get("ttft_ms") is not None else "-"
        _say(
            f"last probe   {stamp(last['ts'])}  {last['prompt_id']}  {verdict}  "
            f"TTFT {ttft}{'  (cold)' if last.get('cold') else ''}"
        )
    else:
        _say("last probe   none yet")
    if not gpus:
        _say("gpu          no samples (latency-only mode or no GPU)")
    for g in gpus:
        reasons = ",".join(reason_names(g.get("throttle_reasons") or 0)) or "none"
        _say(
            f"gpu {g['gpu_index']}        {stamp(g['ts'])}  {_f(g.get('temp_c'), '°C')}  "
            f"SM {_f(g.get('sm_clock_mhz'))}/{_f(g.get('sm_clock_max_mhz'))} MHz  "
            f"{_f(g.get('power_w'), 'W')}/{_f(g.get('power_limit_w'), 'W')}  "
            f"reasons {reasons}"
        )
    if fp:
        _say(
            f"fingerprint  {fp['id']}: {fp['engine']} {fp['engine_version']}, model "
            f"{fp['model']}, driver {fp['driver_version']}, GPU {fp['gpu_name']}"
        )
        _say(f"launch       {fp['launch_command']}")
    if baseline:
        _say(
            f"baseline     TTFT p50 {baseline['ttft_p50_ms']:.0f} ms, p95 "
            f"{baseline['ttft_p95_ms']:.0f} ms from {baseline['n']} probes "
            f"({baseline['source']}, {stamp(baseline['created_ts'])})"
        )
    else:
        _say("baseline     none yet (learned from the first warm probes)")
    _say(f"headroom     {room_line}")
    for line in control_lines(control, now):
        _say(line)
    for e in open_events:
        _say(f"OPEN {e['kind']:<8} since {stamp(e['start_ts'])}: {e['message']}")


# ---- the control loop in status ------------------------------------------------------------

# What the steering loop stores as `apply_detail` when `control.dry_run` holds it back
# (llm_watchdog.daemon.steer: "dry run: not written").
DRY_RUN_DETAIL = "dry run"
STATUS_WIDTH = 120  # a status line's length before a reason or an error is cut short
LABEL = " " * 13  # the width of "headroom     ", so a second line lines up under the first

ACTION_FIELDS = (
    "ts",
    "cls",
    "kind",
    "allowance_before",
    "allowance_after",
    "reason",
    "p95_est_ms",
    "actuator",
    "applied",
    "apply_detail",
    "verify_kind",
    "verify_detail",
)


def control_state(store: Store) -> dict[str, Any]:
    """The newest control decision (`last`, a hold included) and the newest one that wrote a
    new allowance (`last_change`); each None when the store has none.

    A dry run's decisions write nothing, and a failed write leaves the old allowance in
    force, so neither counts as a change. Holds are stored once a minute at most
    (daemon.steer.HOLD_RECORD_EVERY_S): `last` may be up to a minute older than the loop.
    """
    last, change = last_action(store), last_action(store, changed=True)
    return {
        "last": _action(last) if last else None,
        "last_change": _action(change) if change else None,
    }


def _action(row: dict[str, Any]) -> dict[str, Any]:
    # The row without its inputs: a JSON blob of samples that status has no use for.
    out = {k: row.get(k) for k in ACTION_FIELDS}
    out["dry_run"] = str(row.get("apply_detail") or "").startswith(DRY_RUN_DETAIL)
    return out


def control_lines(control: dict[str, Any], now_ts: float) -> list[str]:
    """`status`'s control lines: the last decision, then when the allowance last changed."""
    last, change = control["last"], control["last_change"]
    if last is None:
        return [
            "control      no decisions recorded (control off, or the daemon has not steered yet)"
        ]
    if last["dry_run"]:
        outcome = ", dry run (not written)"
    elif last["applied"] == 0:
        outcome = f", write FAILED ({_clip(last['apply_detail'] or '?', 60)})"
    elif last["applied"] == 1:
        outcome = ", written"
    else:
        outcome = ""  # a hold: nothing to write
    head = f"control      {stamp(last['ts'])}  {_move(last)}{outcome}: "
    lines = [head + _clip(_why(last), max(40, STATUS_WIDTH - len(head)))]
    if change is None:
        never = "; a dry run writes nothing" if last["dry_run"] else ""
        lines.append(f"{LABEL}allowance not changed in the stored decisions{never}")
    else:
        # verify_kind stays NULL until the read-back a drain time after the write.
        check = (
            f"read back: {change['verify_kind']}" if change["verify_kind"] else "not read back yet"
        )
        lines.append(
            f"{LABEL}allowance last changed {stamp(change['ts'])} "
            f"({human_duration(now_ts - change['ts'])} ago): {_move(change)}, {check}"
        )
    return lines


def _move(action: dict[str, Any]) -> str:
    """The move as the law heads its reasons: "cut 8 → 4", or "hold 4" where it stayed."""
    before, after = action["allowance_before"], action["allowance_after"]
    return (
        f"{action['kind']} {before} → {after}" if after != before else f"{action['kind']} {after}"
    )


def _why(action: dict[str, Any]) -> str:
    """The reason without the head that `_move` already shows (the law writes "cut 8 → 4:
    why"); the whole reason where it is worded otherwise."""
    reason = str(action["reason"] or "")
    head = _move(action) + ": "
    return reason[len(head) :] if reason.startswith(head) else reason


def _clip(text: str, width: int) -> str:
    """One line of at most `width` characters; an ellipsis says where it was cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _say(line: str) -> None:
    # Stored fields come from engines (error text, launch command): no escape reaches the tty.
    click.echo(printable(line))


def _f(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.0f}{' ' + unit if unit else ''}"


HISTORY_COLUMNS = [
    "time",
    "prompt_id",
    "ok",
    "cold",
    "ttft_ms",
    "total_ms",
    "output_tokens",
    # What the batch job had in flight, and its allowance, when the canary ran: a slow probe
    # beside a full allowance reads differently from one beside none.
    "batch_inflight",
    "batch_allowance",
    "quality_pass",
    "error_class",
]
GPU_COLUMNS = [
    "time",
    "gpu_index",
    "temp_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "power_w",
    "power_limit_w",
    "util_gpu_pct",
    "throttle_reasons",
    "reasons",
]
CONTROL_COLUMNS = [
    "time",
    "kind",
    "allowance_before",
    "allowance_after",
    "p95_est_ms",
    "applied",
    "verify_kind",
    "reason",
]
BUCKET_COLUMNS = [
    "time",
    "span_s",
    "n",
    "ok_n",
    "cold_n",
    "quality_fail_n",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_max_ms",
    "errors",
]


@cli.command()
@db_option
@click.option(
    "--since",
    default="24h",
    show_default=True,
    help="Start: a duration back (30m, 24h, 7d) or an ISO date.",
)
@click.option("--until", help="End (default now): a duration back or an ISO date.")
@click.option("--gpu", "gpu", is_flag=True, help="GPU samples instead of probes.")
@click.option(
    "--control",
    "control",
    is_flag=True,
    help="Batch-allowance decisions (with reason and verification) instead.",
)
@click.option(
    "--resolution",
    type=click.Choice(["auto", "raw", "1m", "1h"]),
    default="auto",
    show_default=True,
    help="raw rows, or 1-minute / 1-hour buckets; auto: raw up to 2 days, then "
    "1m up to 60 days, then 1h.",
)
@click.option("--limit", type=click.IntRange(1), help="At most this many rows (newest).")
@click.option(
    "--export-trace",
    "export_to",
    metavar="FILE",
    help="Write the probes as a replay trace CSV (- for stdout) instead of listing them.",
)
@click.option(
    "--prometheus",
    "prometheus_url",
    type=PROMETHEUS_URL,
    help="The fleet from a Prometheus server: one row per box, as at --until (default now).",
)
@listing_options
@click.pass_context
def history(
    ctx: click.Context,
    since: str,
    until: str | None,
    gpu: bool,
    control: bool,
    resolution: str,
    limit: int | None,
    export_to: str | None,
    prometheus_url: str | None,
    fmt: str,
) -> None:
    """Probe results (or GPU samples) over a time range, oldest first."""
    one_of_flags("probes", gpu=gpu, control=control)
    if prometheus_url:
        fleet_listing(prometheus_url, when_arg(until, time.time(), "--until"), fmt)
        return

    settings = settings_from(ctx)
    now = time.time()
    since_ts, until_ts = window_args(since, until, now)
    if control:
        with open_store(settings, read_only=True) as store:
            rows = control_actions(store, since_ts, until_ts)
        for r in rows[-limit:] if limit else rows:
            r["time"] = stamp(r["ts"]) if fmt == "table" else r["ts"]
        emit(rows[-limit:] if limit else rows, CONTROL_COLUMNS, fmt)
        return
    if export_to:
        export_trace_to(settings, export_to, since_ts, until_ts)
        return
    if resolution == "auto":
        length = (until_ts or now) - since_ts
        resolution = (
            "raw" if length <= AUTO_RAW_MAX_S else "1m" if length <= AUTO_1M_MAX_S else "1h"
        )
    with open_store(settings, read_only=True) as store:
        if resolution == "raw":
            rows = (
                store.gpu_samples(since_ts, until_ts) if gpu else store.probes(since_ts, until_ts)
            )
            columns = GPU_COLUMNS if gpu else HISTORY_COLUMNS
        else:
            rows = store.history(since_ts, until_ts, resolution, series="gpu" if gpu else "probes")
            columns = ["time", *GPU_HISTORY_COLUMNS[1:], "reasons"] if gpu else BUCKET_COLUMNS
    if limit:
        rows = rows[-limit:]
    if columns is BUCKET_COLUMNS and len({r.get("fingerprint_id") for r in rows}) > 1:
        # A runtime change mid-minute (a restart, another model) splits the minute in two
        # buckets, one per runtime: the column tells them apart (the start of the id
        # `llm-watchdog status` shows).
        columns = [*BUCKET_COLUMNS[:1], "fingerprint", *BUCKET_COLUMNS[1:]]
        for r in rows:
            r["fingerprint"] = (r.get("fingerprint_id") or "-")[:12]
    for r in rows:
        r["time"] = stamp(r["ts"]) if fmt == "table" else r["ts"]
        if gpu:
            r["reasons"] = ",".join(reason_names(r.get("throttle_reasons") or 0))
    emit(rows, columns, fmt)
