"""`llm-watchdog report`: one self-contained HTML page or PNG of a span of time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from llm_watchdog.cli.group import Fail, cli, open_store, settings_from, window_args
from llm_watchdog.cli.headroom import TargetMs, chosen_target, judging, stored_map
from llm_watchdog.cli.output import emit
from llm_watchdog.cli.urlargs import PROMETHEUS_URL
from llm_watchdog.control.headroom import AUTO, rule_words, share_for
from llm_watchdog.report.data import Report, from_rows
from llm_watchdog.report.prometheus import FLEET_QUERIES, PrometheusError, fleet, from_prometheus
from llm_watchdog.store.control import actions as control_actions
from llm_watchdog.store.db import Store, StoreError
from llm_watchdog.store.records import events


@cli.command()
@click.option("--since", default="24h", show_default=True, help="Start: 24h back, or a date.")
@click.option("--until", default=None, help="End (default: now).")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="report.html (one self-contained page) or report.png (one picture).",
)
@click.option(
    "--db", type=click.Path(dir_okay=False), help="Database file (default: the config's)."
)
@click.option(
    "--prometheus",
    "prometheus_url",
    type=PROMETHEUS_URL,
    help="Read a Prometheus server instead of the database.",
)
@click.option("--instance", help="With --prometheus: the box (instance label) to show.")
@click.option("--gpu", "gpu_index", type=int, help="GPU index (default: the first).")
@click.option(
    "--target",
    "target",
    type=TargetMs(),
    help="Chat TTFT p95 target: 400ms, 1.5s, or a plain number of ms (default: the one the "
    "daemon steered by, else the config's).",
)
@click.pass_context
def report(
    ctx: click.Context,
    since: str,
    until: str | None,
    out: Path,
    db: str | None,
    prometheus_url: str | None,
    instance: str | None,
    gpu_index: int | None,
    target: float | None,
) -> None:
    """Chat TTFT, GPU heat and clocks, batch allowance, drift and control actions as pictures."""
    if out.suffix.lower() not in (".html", ".htm", ".png"):
        raise click.BadParameter("end the file name in .html or .png", param_hint="--out")
    if instance is not None and not prometheus_url:
        # A box is chosen among Prometheus's; the local database is one box already.
        raise click.UsageError("--instance picks a box from Prometheus: add --prometheus URL")
    now = time.time()
    since_ts, until_at = window_args(since, until, now)
    until_ts = until_at if until_at is not None else now
    given_ms, config_ms = target, _config_target_ms(ctx)
    if prometheus_url:
        try:
            rep = from_prometheus(
                prometheus_url,
                since_ts,
                until_ts,
                instance=instance,
                target_p95_ms=given_ms if given_ms is not None else config_ms,
            )
        except PrometheusError as exc:
            raise Fail(str(exc)) from None
    else:
        per_minute = _chat_per_minute(ctx)
        rep = _from_store(ctx, db, since_ts, until_ts, gpu_index, given_ms, config_ms, per_minute)
    # Here, not at the top: matplotlib is loaded only by the command that draws.
    from llm_watchdog.report.charts import report_png
    from llm_watchdog.report.page import report_html

    data = report_png(rep) if out.suffix.lower() == ".png" else report_html(rep).encode()
    try:
        out.write_bytes(data)
    except OSError as exc:
        raise Fail(f"cannot write {out}: {exc.strerror or exc}") from None
    s = rep.summary()
    click.echo(
        f"wrote {out} ({len(data) // 1024} KiB): {s['windows']} windows, "
        f"{s['drift_events']} drift events, {s['control_actions']} control actions"
    )


def _config_target_ms(ctx: click.Context) -> float | None:
    try:
        return settings_from(ctx).control.target_p95_s * 1000.0
    except click.ClickException:
        return None


# The columns of `llm-watchdog headroom` a report shows, per thermal state of the card.
HEADROOM_COLUMNS = ("state", "allowance", "bound", "confidence", "n", "unit", "settle")


def _chat_per_minute(ctx: click.Context) -> int | str:
    """The config's rule for a headroom group (`control.chat_per_minute`); its default,
    "auto", where no config loads."""
    try:
        return settings_from(ctx).control.chat_per_minute
    except click.ClickException:
        return AUTO


def _headroom(
    store: Store, since_ts: float, until_ts: float, target_ms: float | None, share: float
) -> list[dict[str, Any]]:
    """The headroom map over the span's probes, as `llm-watchdog headroom` prints it."""
    if target_ms is None:
        return []
    rows = stored_map(store, since_ts, target_ms, until_ts, share)
    return [{k: r.to_dict()[k] for k in HEADROOM_COLUMNS} for r in rows]


def _from_store(
    ctx: click.Context,
    db: str | None,
    since_ts: float,
    until_ts: float,
    gpu_index: int | None,
    given_ms: float | None,
    config_ms: float | None,
    per_minute: int | str = AUTO,
) -> Report:
    """The report of a span of the daemon's database (`db`, else the config's); its headroom
    table judged with `per_minute` chat answers a minute (`control.chat_per_minute`)."""
    if db is not None:
        if not Path(db).exists():
            raise Fail(f"no database at {db}: give the daemon's database file")
        try:
            store = Store(db)
        except StoreError as exc:
            raise Fail(str(exc)) from None
        source = f"database {db}"
    else:
        settings = settings_from(ctx)
        store = open_store(settings)
        source = f"database {settings.storage.path}"
    with store:
        # Without --target, the target the daemon steered by (`chosen_target`): a demo's or
        # another box's database is judged by its own promise, not this config's.
        target_ms, _ = chosen_target(store, given_ms, config_ms)
        judged, _ = judging(store, per_minute, since_ts, until_ts)
        share = share_for(judged)
        gpu = store.gpu_samples(since_ts, until_ts)
        have = sorted({g["gpu_index"] for g in gpu})
        if gpu_index is not None and have and gpu_index not in have:
            raise click.BadParameter(
                f"no samples of GPU {gpu_index} in this span; it has GPU "
                f"{', '.join(map(str, have))}",
                param_hint="--gpu",
            )
        return from_rows(
            source=source,
            since_ts=since_ts,
            until_ts=until_ts,
            probes=store.probes(since_ts, until_ts),
            gpu=gpu,
            actions=control_actions(store, since_ts, until_ts),
            events=events(store, since_ts, until_ts),
            headroom=_headroom(store, since_ts, until_ts, target_ms, share),
            headroom_rule=rule_words(judged),
            target_p95_ms=target_ms,
            gpu_index=gpu_index,
        )


def fleet_listing(url: str, at: float | None, fmt: str) -> None:
    """`history --prometheus URL`: one row per instance Prometheus knows."""
    try:
        rows = fleet(url, at)
    except PrometheusError as exc:
        raise Fail(str(exc)) from None
    if not rows:
        raise Fail(
            f"Prometheus at {url} has no llm-watchdog series: is it scraping the daemons "
            "(api.listen, default :9108) and the gateways?"
        )
    emit(rows, ["instance", *FLEET_QUERIES], fmt)
