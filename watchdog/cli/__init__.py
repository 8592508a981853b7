"""The `llm-watchdog` command line: the group and its helpers, one module per command family."""

from llm_watchdog.cli.main import main

__all__ = ["main"]
