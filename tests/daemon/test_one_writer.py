"""`llm-watchdog run` as real processes on one database: the second exits 1 naming the
first's pid; the database deleted under a running daemon makes it exit 1 (systemd restarts
it onto a new file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from llm_watchdog.store.db import Store
from tests.helpers.streamserver import StreamServer

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (e.get("PYTHONPATH"), str(ROOT)) if p)
    e.pop("LLM_WATCHDOG_CONFIG", None)
    return e


def write_config(path: Path, url: str, db: Path) -> Path:
    path.write_text(
        f'[server]\nurl = "{url}"\n'
        '[probe]\ninterval = "0.3s"\njitter = "0s"\n'
        f'[storage]\npath = "{db}"\n'
        "[gpu]\nenabled = false\n"
        '[logging]\nformat = "text"\n'
    )
    return path


@contextmanager
def daemon(config: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_watchdog", "--config", str(config), "run"],
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for_rows(db: Path, n: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with Store(db, read_only=True) as s:
                    if len(s.probes()) >= n:
                        return
            except Exception:
                pass
        time.sleep(0.1)
    pytest.fail(f"fewer than {n} probe rows within {timeout_s} s")


@pytest.mark.slow
def test_a_second_daemon_on_one_database_exits_1_naming_the_first(
    tmp_path: Path, db_path: Path
) -> None:
    with StreamServer(answer="Paris") as srv:
        config = write_config(tmp_path / "c.toml", srv.url, db_path)
        with daemon(config) as first:
            wait_for_rows(db_path, 2)
            second = subprocess.run(
                [sys.executable, "-m", "llm_watchdog", "--config", str(config), "run"],
                capture_output=True,
                text=True,
                env=env(),
                timeout=30,
            )
            assert first.poll() is None  # the first runs on
            first.send_signal(signal.SIGTERM)
            _, first_err = first.communicate(timeout=15)
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr
    assert f"pid {first.pid}" in lines[0] and str(db_path) in lines[0]
    assert first.returncode == 0, first_err


@pytest.mark.slow
def test_a_database_deleted_under_the_daemon_makes_it_exit_1(tmp_path: Path, db_path: Path) -> None:
    with StreamServer(answer="Paris") as srv:
        config = write_config(tmp_path / "c.toml", srv.url, db_path)
        with daemon(config) as proc:
            wait_for_rows(db_path, 2)
            db_path.unlink()
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("still running 30 s after its database was deleted")
    assert proc.returncode == 1, err
    assert "was deleted while in use" in err and "Traceback" not in err
