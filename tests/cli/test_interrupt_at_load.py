"""A Ctrl-C while the command line is still loading is one line, as one once it runs is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tomllib

INTERRUPTED_AT_LOAD = """
import sys

class Interrupt:  # the Ctrl-C arrives while the command line's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "llm_watchdog.cli":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
from llm_watchdog.entry import main
main()
"""


def test_an_interrupt_while_loading_is_one_line_and_exit_1() -> None:
    out = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AT_LOAD, "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout, out.stderr) == (1, "", "llm-watchdog: interrupted\n")


def test_the_console_script_and_python_m_start_at_the_entry() -> None:
    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"llm-watchdog": "llm_watchdog.entry:main"}
    out = subprocess.run(
        [sys.executable, "-m", "llm_watchdog", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "0." in out.stdout
