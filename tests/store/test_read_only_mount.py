"""A WAL database read where this user may not write: a read-only mount, or the service's
folder read with `--db` by another user. SQLite's `mode=ro` cannot read such a file at all
(it would create the `-shm` index beside it); the store reads a file whose commits are all
in it, and says what to do where the newest are still in its `-wal`.

The folder is made read-only with a bind mount in a user namespace, which binds root too."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result

ROOT = Path(__file__).resolve().parents[2]


def read_only_folder(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Runs argv with `folder` bound read-only over itself; skips where user namespaces are
    not allowed (the check cannot be made there, and is not reported as passing)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare(1) is not installed: cannot make a read-only mount")
    script = 'mount --bind -o ro "$0" "$0" && touch "$0/.w" 2>/dev/null && exit 97; exec "$@"'
    cmd = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script, str(folder)]
    done = subprocess.run(
        [*cmd, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    if done.returncode == 97:
        pytest.fail("the bind mount did not make the folder read-only")
    if (
        "mount" in done.stderr
        and "unshare" in done.stderr
        or "Operation not permitted" in (done.stderr)
    ):
        pytest.skip(f"user namespaces are not allowed here: {done.stderr.strip()}")
    return done


def count_probes(db: Path) -> list[str]:
    code = (
        "import sys\n"
        "from llm_watchdog.store.db import Store, StoreError\n"
        "try:\n"
        "    with Store(sys.argv[1], read_only=True) as s: print(len(s.probes()))\n"
        "except StoreError as e: print('StoreError:', e); sys.exit(3)\n"
    )
    return [sys.executable, "-c", code, str(db)]


def test_a_closed_wal_database_on_a_read_only_mount_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "watchdog.db"
    with Store(db) as store:
        for i in range(5):
            store.record_probe(probe_result(ts=1000.0 + i), None)
    assert not (folder / "watchdog.db-wal").exists()  # closed cleanly: every commit is in it
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
    before = db.read_bytes()
    done = read_only_folder(folder, *count_probes(db))
    assert (done.returncode, done.stdout.strip()) == (0, "5"), done.stderr
    status = read_only_folder(
        folder, sys.executable, "-m", "llm_watchdog", "status", "--db", str(db)
    )
    assert status.returncode == 0, status.stderr
    assert "cannot" not in status.stdout + status.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["watchdog.db"]


def test_commits_left_in_the_wal_are_not_read_around(tmp_path: Path) -> None:
    # A writer that died (or a copy taken while it ran) leaves commits in the -wal with no
    # index beside them: reading the main file alone would lose them without a word.
    live = tmp_path / "live.db"
    folder = tmp_path / "ro"
    folder.mkdir()
    with Store(live) as store:
        store.record_probe(probe_result(ts=1000.0), None)
        hold = sqlite3.connect(live)
        hold.execute("PRAGMA wal_autocheckpoint=0")
        store.record_probe(probe_result(ts=1001.0), None)
        shutil.copy(live, folder / "watchdog.db")
        shutil.copy(live.with_name("live.db-wal"), folder / "watchdog.db-wal")
        hold.close()
    assert (folder / "watchdog.db-wal").stat().st_size > 0
    done = read_only_folder(folder, *count_probes(folder / "watchdog.db"))
    assert done.returncode == 3, done.stdout + done.stderr
    said = done.stdout.strip()
    assert "watchdog.db-wal" in said and "sudo llm-watchdog" in said and "\n" not in said
    # Where the folder can be written, the same files read in full.
    with Store(folder / "watchdog.db", read_only=True) as reader:
        assert len(reader.probes()) == 2
