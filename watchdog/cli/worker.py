"""A long command's work on a worker thread that the first Ctrl-C stops cleanly.

`bench` and `demo` both run for minutes and must keep what they measured when the user
stops them: the first Ctrl-C only sets `stop`, the work ends what it started and returns
what it has, and the command reports it. No KeyboardInterrupt is raised on the first
Ctrl-C: one that lands inside Event.wait can leave the event's lock held, and one that cuts
a Thread.join short (Python 3.11) marks the worker as finished while it still runs, so
the join returns at once and the result is read before it is written
(tests/cli/test_bench_interrupt.py, tests/cli/test_demo_interrupt.py). The wait is on an
Event the worker sets last. A second Ctrl-C quits at once; the worker is a daemon thread,
so nothing waits for it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

T = TypeVar("T")


def run_stoppable(
    work: Callable[[], T], stop: threading.Event, name: str, stopping: str
) -> tuple[T | None, BaseException | None]:
    """Run `work` on a thread named `name` until it returns; the first Ctrl-C prints
    `stopping` and sets `stop`. Returns (what it returned, what it raised): one is None."""
    done = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller, which reports it
            box["error"] = exc
        finally:
            done.set()

    def on_sigint(signum: int, frame: Any) -> None:
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        click.echo(f"\n{stopping} (Ctrl-C again quits at once)", err=True)
        stop.set()

    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGINT, on_sigint) if main else None
    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        while not done.wait(0.5):
            pass
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    return box.get("value"), box.get("error")
