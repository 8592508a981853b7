"""CLI commands that run things: `demo`, and the `sim` and `gateway` groups."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import click

from llm_watchdog.cli.group import Fail, cli
from llm_watchdog.cli.worker import run_stoppable
from llm_watchdog.demo import BATCH_SETTLE_S, DemoOptions, run_demo, summary
from llm_watchdog.durations import parse_duration
from llm_watchdog.gateway.cli import gateway
from llm_watchdog.sim.cli import sim
from llm_watchdog.sim.scenario import ScenarioError

MIN_DEMO_S = 2 * BATCH_SETTLE_S

cli.add_command(sim)
cli.add_command(gateway)


@cli.command()
@click.option(
    "--duration", default="210s", show_default=True, help="How long to run (at least 10s)."
)
@click.option(
    "--scenario",
    default="demo",
    show_default=True,
    help="Heat-lab scenario (`llm-watchdog sim --help` lists them).",
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
    if seconds < MIN_DEMO_S:
        # The batch job settles for BATCH_SETTLE_S before the daemon's first probe round:
        # a shorter run measures nothing and still prints a summary.
        raise click.BadParameter(
            f"at least {MIN_DEMO_S:g}s (the default, 210s, shows the whole heat story)",
            param_hint="--duration",
        )
    opts = DemoOptions(
        scenario=scenario,
        duration_s=seconds,
        time_scale=time_scale,
        db_path=Path(db) if db else None,
        control=not no_control,
    )
    stop = threading.Event()
    result, err = run_stoppable(
        lambda: run_demo(opts, say=lambda s: click.echo(s), stop=stop), stop, "demo", "stopping …"
    )
    if err is not None:
        if isinstance(err, ScenarioError):
            raise Fail(str(err)) from None
        raise err
    if result is None:  # run_demo returns its result or raises
        raise RuntimeError("the demo ended without a result")
    for line in summary(result, command=invoked_as()):
        click.echo(line)


def invoked_as() -> str:
    """How a shell runs this llm-watchdog again: the bare name where PATH finds this same
    executable, else its absolute path. After the quick start (`.venv/bin/llm-watchdog
    demo`) the venv is not activated, and a bare `llm-watchdog` is not found."""
    argv0 = sys.argv[0]
    if os.path.basename(argv0) == "__main__.py":  # python -m llm_watchdog
        return f"{shlex.quote(sys.executable)} -m llm_watchdog"
    if not argv0 or not os.path.isfile(argv0):
        return "llm-watchdog"
    found = shutil.which("llm-watchdog")
    if found and os.path.samefile(found, argv0):
        return "llm-watchdog"
    return shlex.quote(os.path.abspath(argv0))
