"""One writer per database, read-only opens that change nothing, foreign files refused, and
a file deleted or replaced under a running process noticed."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_watchdog.errors import StorageError
from llm_watchdog.store.db import Store, StoreError
from llm_watchdog.store.lock import DatabaseInUse, WriterLock, lock_path
from tests.helpers.builders import probe_result


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def foreign_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
    conn.execute("CREATE TABLE moz_bookmarks (id INTEGER PRIMARY KEY, title TEXT)")
    conn.execute("INSERT INTO moz_places (url) VALUES ('https://example.org')")
    conn.commit()
    conn.close()
    return path


# ---- the writer lock ----------------------------------------------------------------------


def test_a_second_exclusive_store_is_refused_naming_the_holder(db_path: Path) -> None:
    with Store(db_path, exclusive=True):
        with pytest.raises(DatabaseInUse) as info:
            Store(db_path, exclusive=True)
    assert info.value.holder_pid == os.getpid()
    msg = str(info.value)
    assert f"pid {os.getpid()}" in msg and str(db_path) in msg and "\n" not in msg
    assert isinstance(info.value, StorageError)


def test_the_lock_is_released_on_close(db_path: Path) -> None:
    Store(db_path, exclusive=True).close()
    with Store(db_path, exclusive=True) as again:
        again.record_probe(probe_result(), None)
    assert lock_path(db_path).exists()


def test_readers_and_plain_writers_do_not_need_the_lock(db_path: Path) -> None:
    with Store(db_path, exclusive=True) as daemon:
        daemon.record_probe(probe_result(), None)
        with Store(db_path, read_only=True) as reader:
            assert len(reader.probes()) == 1
        with Store(db_path) as cli_writer:  # `baseline reset` writes beside the daemon
            cli_writer.record_probe(probe_result(ts=2.0), None)


def test_a_lock_held_by_another_process_names_its_pid_and_dies_with_it(db_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from llm_watchdog.store.lock import WriterLock; "
            f"WriterLock({str(db_path)!r}).acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DatabaseInUse) as info:
            WriterLock(db_path).acquire()
        assert info.value.holder_pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        # The kernel dropped the lock with the process: no stale lock after a crash.
        deadline = time.monotonic() + 5
        while True:
            try:
                WriterLock(db_path).acquire().release()
                break
            except DatabaseInUse:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


# ---- read-only opens ----------------------------------------------------------------------


def test_a_read_only_open_changes_nothing(db_path: Path) -> None:
    with Store(db_path) as s:
        s.record_probe(probe_result(), None)
    before = digest(db_path)
    with Store(db_path, read_only=True) as r:
        assert len(r.probes()) == 1
        r.history(0, 10)
        r.last_gpu_samples()
        with pytest.raises(StoreError):
            r.record_probe(probe_result(ts=5.0), None)
    assert digest(db_path) == before


def test_a_foreign_database_is_refused_by_name_and_left_unchanged(tmp_path: Path) -> None:
    path = foreign_db(tmp_path / "places.sqlite")
    before = digest(path)
    for kw in ({"read_only": True}, {}, {"exclusive": True}):
        with pytest.raises(StoreError) as info:
            Store(path, **kw)  # type: ignore[arg-type]
        msg = str(info.value)
        assert "not an llm-watchdog database" in msg and "moz_bookmarks, moz_places" in msg
        assert str(path) in msg and "\n" not in msg
    assert digest(path) == before
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    assert tables == {"moz_places", "moz_bookmarks"}


def test_a_read_only_open_of_an_empty_or_missing_file_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StoreError, match="is empty: start the daemon"):
        Store(empty, read_only=True)
    assert empty.read_bytes() == b""
    with pytest.raises(StoreError, match="no such file"):
        Store(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()


def test_a_read_only_open_of_an_older_schema_asks_for_a_migration(db_path: Path) -> None:
    with Store(db_path) as s:
        s.execute("DELETE FROM _migrations WHERE number = (SELECT MAX(number) FROM _migrations)")
    before = digest(db_path)
    with pytest.raises(StoreError, match="predates this llm-watchdog"):
        Store(db_path, read_only=True)
    assert digest(db_path) == before


# ---- the file under a running process ----------------------------------------------------


def test_a_deleted_database_is_noticed(db_path: Path) -> None:
    with Store(db_path, exclusive=True) as s:
        assert s.file_changed() is None
        db_path.unlink()
        s.record_probe(probe_result(), None)  # SQLite writes on into the deleted inode
        msg = s.file_changed()
    assert msg is not None and "was deleted while in use" in msg


def test_a_replaced_database_is_noticed(db_path: Path, tmp_path: Path) -> None:
    with Store(db_path) as s:
        other = tmp_path / "other.db"
        Store(other).close()
        os.replace(other, db_path)
        msg = s.file_changed()
    assert msg is not None and "was replaced by another file" in msg


def test_an_in_memory_store_never_reports_a_file_change() -> None:
    with Store.memory() as s:
        assert s.file_changed() is None
