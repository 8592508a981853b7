"""CLI commands that run things: `demo`, and the `sim` and `gateway` groups."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from llm_watchdog.cli.group import Fail, cli
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
    import signal
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
    done = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = run_demo(opts, say=lambda s: click.echo(s), stop=stop)
        except BaseException as exc:  # handed to the main thread, which reports it
            box["error"] = exc
        finally:
            done.set()

    # The demo runs on a worker thread; Ctrl-C, caught here by a handler that only sets
    # `stop`, ends it, and the worker stops every server and thread it started before it
    # sets `done`. No KeyboardInterrupt is raised on the first Ctrl-C: one that cuts a
    # Thread.join short marks the worker as finished while it is still running (the join
    # then returns at once), and the summary would be read before the worker wrote it. A
    # second Ctrl-C quits at once; the worker is a daemon thread, so nothing waits for it.
    def on_sigint(signum: int, frame: Any) -> None:
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        click.echo("\nstopping … (Ctrl-C again quits at once)", err=True)
        stop.set()

    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGINT, on_sigint) if main else None
    worker = threading.Thread(target=work, name="demo", daemon=True)
    worker.start()
    try:
        while not done.wait(0.5):
            pass
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if "error" in box:
        err = box["error"]
        if isinstance(err, ScenarioError):
            raise Fail(str(err)) from None
        raise err
    for line in summary(box["result"], command=invoked_as()):
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
