"""The `llm-watchdog` command line: a thin click layer over the library.

`group` holds the click group and what commands share; each other module adds one family of
commands to it when imported, so importing this package builds the whole command line.
"""

# Each import registers its commands on the group.
from llm_watchdog.cli import (  # noqa: F401
    bench,
    headroom,
    history,
    judge,
    lab,
    probe,
    report,
    service,
)
from llm_watchdog.cli.group import cli


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="llm-watchdog", obj={})


__all__ = ["cli", "main"]
