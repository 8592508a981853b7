"""The `llm-watchdog` console script and `python -m llm_watchdog`.

Loading the command line takes about half a second (click, httpx, sqlite-utils, numpy): a
Ctrl-C in that time is told as one once it runs is, in one line, not as a traceback through
whichever library was loading.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from llm_watchdog.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("llm-watchdog: interrupted\n")
        sys.exit(1)
    run()
