"""CLI commands that run things: `bench`, `demo`, and the `sim` and `gateway` groups."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from llm_watchdog.bench.run import run_bench
from llm_watchdog.cli.group import Fail, cli, reach_server, settings_from
from llm_watchdog.cli.output import emit, listing_options
from llm_watchdog.daemon.service import probe_options
from llm_watchdog.demo import DemoOptions, run_demo, summary
from llm_watchdog.durations import parse_duration
from llm_watchdog.gateway.cli import gateway
from llm_watchdog.probe.client import Prober
from llm_watchdog.sim.cli import sim
from llm_watchdog.sim.scenario import ScenarioError

cli.add_command(sim)
cli.add_command(gateway)

BENCH_COLUMNS = [
    "batch_streams",
    "chat_probes",
    "chat_failed",
    "chat_p50_ms",
    "chat_p95_ms",
    "chat_max_ms",
    "batch_requests_ok",
    "batch_chars_per_s",
]


@cli.command()
@click.option("--url", help="Server (or gateway) base URL (default: server.url).")
@click.option("--model", help="Model name (default: server.model; 'auto' asks the server).")
@click.option(
    "--batch-streams",
    default="0,2,4,7",
    show_default=True,
    help="Comma-separated batch concurrency levels to measure.",
)
@click.option("--duration", default="60s", show_default=True, help="Measuring time per level.")
@click.option(
    "--document-words",
    default=700,
    show_default=True,
    type=click.IntRange(10),
    help="Size of each batch request's document.",
)
@listing_options
@click.pass_context
def bench(
    ctx: click.Context,
    url: str | None,
    model: str | None,
    batch_streams: str,
    duration: str,
    document_words: int,
    fmt: str,
) -> None:
    """Chat TTFT p50/p95 and batch throughput at each batch concurrency, on your server.

    The curve to choose a batch allowance from: sends real extraction-style batch requests
    (long documents, X-Traffic-Class: batch) while canary chat probes measure TTFT.
    """

    settings = settings_from(ctx)
    try:
        levels = [int(x) for x in batch_streams.split(",") if x.strip()]
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; e.g. --batch-streams 0,2,4 --duration 60s") from None
    if not levels or min(levels) < 0:
        raise click.BadParameter("--batch-streams needs levels >= 0, e.g. 0,2,4,7")
    server = replace(
        settings.server, url=url or settings.server.url, model=model or settings.server.model
    )
    settings = replace(settings, server=server)
    target = reach_server(settings)
    pset, api_key, chosen = target.probe_set, target.api_key, target.model

    def progress(row: Any) -> None:
        if fmt == "table":
            p95 = f"{row.chat_p95_ms:.0f} ms" if row.chat_p95_ms is not None else "-"
            click.echo(
                f"# batch {row.batch_streams}: chat p95 {p95}, batch "
                f"{row.batch_chars_per_s:.0f} chars/s",
                err=True,
            )

    opts = probe_options(settings, target.engine)
    with Prober(server.url, chosen, opts, api_key=api_key) as prober:
        rows = run_bench(
            prober,
            pset,
            server.url,
            chosen,
            levels,
            seconds,
            words=document_words,
            api_key=api_key,
            progress=progress,
        )
    emit([r.as_dict() for r in rows], BENCH_COLUMNS, fmt)


@cli.command()
@click.option("--duration", default="210s", show_default=True, help="How long to run.")
@click.option(
    "--scenario",
    default="demo",
    show_default=True,
    help="Heat-lab scenario (`llm-watchdog sim run --help` lists them).",
)
@click.option(
    "--time-scale",
    default=20.0,
    show_default=True,
    type=click.FloatRange(1, 200),
    help="How much faster than real time the card heats and cools.",
)
@click.option(
    "--no-control", is_flag=True, help="Watch only: leave the batch allowance at its static value."
)
@click.option("--db", type=click.Path(dir_okay=False), help="Database file (default: a temp dir).")
def demo(duration: str, scenario: str, time_scale: float, no_control: bool, db: str | None) -> None:
    """The whole loop on a simulated GPU in a few minutes: heat, slow chat, cut, recover.

    Runs the heat lab, the gateway, a batch job and the daemon in this process over real
    HTTP, prints a line per canary probe and a summary. Ctrl-C stops everything.
    """
    import threading


    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--duration") from None
    opts = DemoOptions(
        scenario=scenario,
        duration_s=seconds,
        time_scale=time_scale,
        db_path=Path(db) if db else None,
        control=not no_control,
    )
    stop = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = run_demo(opts, say=lambda s: click.echo(s), stop=stop)
        except BaseException as exc:
            box["error"] = exc

    # The demo runs on a worker thread so Ctrl-C reaches this one and sets `stop`.
    worker = threading.Thread(target=work, name="demo")
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except KeyboardInterrupt:
        click.echo("\nstopping …", err=True)
        stop.set()
        worker.join()
    if "error" in box:
        err = box["error"]
        if isinstance(err, ScenarioError):
            raise Fail(str(err)) from None
        raise err
    for line in summary(box["result"]):
        click.echo(line)
