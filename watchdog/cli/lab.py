"""CLI commands that run things: `demo`, and the `sim` and `gateway` groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llm_watchdog.cli.group import Fail, cli
from llm_watchdog.demo import DemoOptions, run_demo, summary
from llm_watchdog.durations import parse_duration
from llm_watchdog.gateway.cli import gateway
from llm_watchdog.sim.cli import sim
from llm_watchdog.sim.scenario import ScenarioError

cli.add_command(sim)
cli.add_command(gateway)


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
