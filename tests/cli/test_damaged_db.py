"""A database whose header is whole but whose pages are damaged: the reading commands say
so in one line, with what to do, rather than calling it a bug."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    path = tmp_path / "watchdog.db"
    store = Store(path)
    now = time.time()
    for i in range(3000):
        store.record_probe(probe_result(now - 3000 + i, prompt_id=f"p{i % 7}"), None)
    store.close()
    size = path.stat().st_size
    assert size > 64 * 4096
    with path.open("r+b") as f:
        for page in range(3, size // 4096, 5):  # every fifth page past the schema
            f.seek(page * 4096)
            f.write(b"\xde\xad" * 2048)
    return path


@pytest.mark.parametrize("command", [["history", "--since", "2h"], ["status"]])
def test_a_damaged_database_is_one_line_that_says_what_to_do(
    damaged: Path, command: list[str]
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "llm_watchdog", *command, "--db", str(damaged)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "a bug" not in lines[0] and "Traceback" not in out.stderr
    assert f"database {damaged} is damaged" in lines[0]
    assert "move it away" in lines[0] and ".recover" in lines[0]


def test_config_after_the_command_says_where_it_goes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "llm_watchdog", "check-config", "--config", "x.toml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert "--config goes before the command: llm-watchdog --config FILE ..." in out.stderr
