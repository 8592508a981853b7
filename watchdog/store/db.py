"""SQLite storage: `Store`, the one way to the database.

One file, opened through sqlite-utils, in WAL mode (readers such as the CLI never block the
daemon's writes), with a busy timeout for the moments two processes write at once. Schema
changes are numbered migrations (`llm_watchdog.store.migrations`), applied on open. The
queries on raw rows are in `llm_watchdog.store.rows`; the minute and hour rollups, retention
and `history()` in `llm_watchdog.store.rollups`. Both are functions over the database that
only `Store` calls.

Exceptions: everything the database can throw leaves this module as

    StoreError  one line: what happened, and what to do

raised `from` the sqlite3 error. A failed write rolls back its whole transaction, so it
never takes earlier rows with it.

Modes: `Store(path)` opens for writing (and migrates); `exclusive=True` also takes the
database's writer lock (`llm_watchdog.store.lock`), which the daemon does so that a second
daemon on the same file stops at start-up. `read_only=True` (the CLI's reading commands) opens
the file with SQLite's `mode=ro`: no migration, no WAL switch, nothing written; a database
without the watchdog's `_migrations` table is refused by name, in either mode, so another
application's file is never changed. `file_changed()` says when the file was deleted or
replaced under a running process (its device and inode are remembered at open).

Threads: the daemon's scheduler calls in from worker threads. One connection
(`check_same_thread=False`) is shared, and a lock serialises every use of it; SQLite would
serialise the writes anyway.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from llm_watchdog.errors import StorageError
from llm_watchdog.models import Fingerprint, GpuEvent, GpuSample, ProbeResult
from llm_watchdog.store import rollups
from llm_watchdog.store import rows as store_rows
from llm_watchdog.store.lock import WriterLock
from llm_watchdog.store.migrations import MIGRATIONS_TABLE, MigrationError, discover, migrate
from llm_watchdog.store.rollups import (
    AUTO_1M_MAX_S,
    AUTO_RAW_MAX_S,
    GPU_BUCKET_COLUMNS,
    GPU_HISTORY_COLUMNS,
    PROBE_BUCKET_COLUMNS,
    PROBE_HISTORY_COLUMNS,
    RESOLUTIONS,
    _BitOr,
)
from llm_watchdog.store.rows import (
    GPU_FIELDS,
    PROBE_FIELDS,
    _insert_sql,
    probe_from_row,
    sample_from_row,
)

__all__ = [
    "AUTO_1M_MAX_S",
    "AUTO_RAW_MAX_S",
    "GPU_BUCKET_COLUMNS",
    "GPU_FIELDS",
    "GPU_HISTORY_COLUMNS",
    "PROBE_BUCKET_COLUMNS",
    "PROBE_FIELDS",
    "PROBE_HISTORY_COLUMNS",
    "RESOLUTIONS",
    "Store",
    "StoreError",
    "probe_from_row",
    "sample_from_row",
]

_FP_FIELDS = tuple(Fingerprint().key_fields())
_PROBE_COLUMNS = ("fingerprint_id", *PROBE_FIELDS)


class StoreError(StorageError):
    """The database could not do what was asked. str(err) is one line."""


class Store:
    """The watchdog's database. `Store(path)` opens (creating if needed) and migrates it."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
        exclusive: bool = False,
    ) -> None:
        self.path = str(path)
        self.busy_timeout_s = busy_timeout_s
        self.read_only = read_only
        self._clock = clock
        self._lock = threading.RLock()
        self._db: sqlite_utils.Database | None = None
        self._writer: WriterLock | None = None
        if exclusive and self.path != ":memory:" and not read_only:
            if not Path(self.path).parent.is_dir():
                raise StoreError(
                    f"cannot open database {self.path}: directory does not exist; "
                    "create it or set storage.path"
                )
            self._writer = WriterLock(self.path).acquire()
        try:
            conn = _connect(self.path, busy_timeout_s, read_only=read_only)
        except BaseException:
            self._release_writer()
            raise
        try:
            db = sqlite_utils.Database(conn)
            db.conn.create_aggregate("bit_or", 1, _BitOr)  # type: ignore[arg-type]
            _refuse_foreign(db, self.path)
            if read_only:
                _check_current(db, self.path)
            elif self.path != ":memory:":
                # WAL: readers and one writer at once; synchronous=NORMAL is durable across
                # an application crash and only risks the last commits on power loss
                # (https://www.sqlite.org/wal.html, pragma.html#pragma_synchronous).
                db.enable_wal()
                db.execute("PRAGMA synchronous=NORMAL")
                # A big first rollup can grow the WAL file; without a limit it stays that size
                # (https://www.sqlite.org/pragma.html#pragma_journal_size_limit).
                db.execute("PRAGMA journal_size_limit = 33554432")
            if not read_only:
                db.execute("PRAGMA foreign_keys=ON")
                migrate(db, where=f"database {self.path}", now=clock)
            _check_columns(db, self.path)
        except MigrationError as exc:
            conn.close()
            self._release_writer()
            raise StoreError(str(exc)) from None
        except sqlite3.Error as exc:
            conn.close()
            self._release_writer()
            raise StoreError(_describe(exc, self.path, busy_timeout_s, opening=True)) from exc
        except BaseException:
            conn.close()
            self._release_writer()
            raise
        self._db = db
        self._identity = _identity(self.path)

    @classmethod
    def memory(cls, *, clock: Callable[[], float] = time.time) -> Store:
        """A private in-memory database, for tests and `replay`."""
        return cls(":memory:", clock=clock)

    @property
    def db(self) -> sqlite_utils.Database:
        """The sqlite_utils.Database, for migrations. Other code goes through the methods,
        which hold the lock; use `transaction()` for several writes at once."""
        if self._db is None:
            raise StoreError(f"database {self.path} is closed")
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._release_writer()

    def _release_writer(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def file_changed(self) -> str | None:
        """None while the path still names the file opened; else one line saying what
        happened to it (deleted, or replaced by another file) and what to do."""
        if self._identity is None:
            return None
        now = _identity(self.path)
        if now is None:
            return (
                f"database {self.path} was deleted while in use: new rows would go to a "
                "deleted file; restart the watchdog to start a new database"
            )
        if now != self._identity:
            return (
                f"database {self.path} was replaced by another file while in use; restart "
                "the watchdog to open the new one"
            )
        return None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.path!r})"

    # ---- transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """Hold the lock and a write transaction; commit on success, roll back on error.

        `BEGIN IMMEDIATE` takes SQLite's write lock up front: a deferred transaction that
        reads first can fail with SQLITE_BUSY when it upgrades, without waiting for the busy
        timeout (https://www.sqlite.org/lang_transaction.html). Nested calls use savepoints.
        """
        with self._lock:
            db = self.db
            nested = db.conn.in_transaction
            try:
                db.execute("SAVEPOINT store_nested" if nested else "BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc
            try:
                yield db
            except BaseException as exc:
                if db.conn.in_transaction:
                    if nested:
                        db.execute("ROLLBACK TO store_nested")
                        db.execute("RELEASE store_nested")
                    else:
                        db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc
                raise
            try:
                db.execute("RELEASE store_nested" if nested else "COMMIT")
            except sqlite3.Error as exc:
                if not nested and db.conn.in_transaction:
                    db.execute("ROLLBACK")
                raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc

    @contextmanager
    def _reading(self) -> Iterator[sqlite_utils.Database]:
        with self._lock:
            try:
                yield self.db
            except sqlite3.Error as exc:
                raise StoreError(_describe(exc, self.path, self.busy_timeout_s)) from exc

    # ---- generic helpers for other modules' tables ----------------------------------------

    def insert(self, table: str, row: dict[str, Any]) -> int:
        """Insert one row; dict and list values are stored as JSON. Returns the rowid."""
        values = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values()]
        cols = ", ".join(_quote(c) for c in row)
        sql = f"INSERT INTO {_quote(table)} ({cols}) VALUES ({', '.join('?' * len(row))})"
        with self.transaction() as db:
            return int(db.execute(sql, values).lastrowid or 0)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one writing statement (UPDATE, DELETE, ...) in a transaction; rows changed."""
        with self.transaction() as db:
            return int(db.execute(sql, params).rowcount)

    def rows(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read-only query. A statement that would write raises StoreError."""
        with self._reading() as db:
            db.execute("PRAGMA query_only=ON")
            try:
                return list(db.query(sql, params))
            except ValueError as exc:  # sqlite-utils: not a statement that returns rows
                raise StoreError(f"rows() needs a query that returns rows ({exc})") from exc
            except sqlite3.OperationalError as exc:
                if "readonly" in str(exc):
                    raise StoreError(
                        f"rows() only reads, and this statement writes: {sql.strip()[:60]!r}; "
                        "use Store.execute() or Store.insert()"
                    ) from exc
                raise
            finally:
                db.execute("PRAGMA query_only=OFF")

    # ---- writes ---------------------------------------------------------------------------

    def record_fingerprint(self, fp: Fingerprint, now_ts: float | None = None) -> str:
        """Insert the fingerprint or, if known, move its last_seen forward. Returns its id."""
        now_ts = self._clock() if now_ts is None else now_ts
        key = fp.key_fields()
        cols = ("id", *_FP_FIELDS, "extra", "first_seen", "last_seen")
        values = (fp.id, *(key[f] for f in _FP_FIELDS), json.dumps(fp.extra), now_ts, now_ts)
        sql = (
            f"INSERT INTO fingerprints ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
            "ON CONFLICT(id) DO UPDATE SET last_seen = MAX(last_seen, excluded.last_seen), "
            "extra = excluded.extra"
        )
        with self.transaction() as db:
            db.execute(sql, values)
        return fp.id

    def record_probe(self, result: ProbeResult, fingerprint_id: str | None) -> int:
        """Store one probe result; returns its row id."""
        row = result.to_dict()
        row["fingerprint_id"] = fingerprint_id
        values = [row[c] for c in _PROBE_COLUMNS]
        with self.transaction() as db:
            return int(db.execute(_insert_sql("probes", _PROBE_COLUMNS), values).lastrowid or 0)

    def record_gpu_samples(self, samples: Sequence[GpuSample]) -> None:
        """Store one reading of every GPU, all or nothing."""
        if not samples:
            return
        rows = [[getattr(s, c) for c in GPU_FIELDS] for s in samples]
        with self.transaction() as db:
            db.conn.executemany(_insert_sql("gpu_samples", GPU_FIELDS), rows)

    def record_gpu_event(self, ev: GpuEvent) -> int:
        cols = ("ts", "kind", "gpu_index", "detail")
        with self.transaction() as db:
            cursor = db.execute(_insert_sql("gpu_events", cols), [getattr(ev, c) for c in cols])
            return int(cursor.lastrowid or 0)

    # ---- reads (llm_watchdog.store.rows) ------------------------------------------------------

    def probes(
        self, since_ts: float | None = None, until_ts: float | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Raw probe rows with since_ts <= ts < until_ts, oldest first; with `limit`, the newest
        `limit` of them. Booleans come back as bool (quality_pass may be None)."""
        with self._reading() as db:
            return store_rows.probes(db, since_ts, until_ts, limit)

    def gpu_samples(
        self,
        since_ts: float | None = None,
        until_ts: float | None = None,
        gpu_index: int | None = None,
    ) -> list[dict[str, Any]]:
        """Raw GPU samples with since_ts <= ts < until_ts, oldest first."""
        with self._reading() as db:
            return store_rows.gpu_samples(db, since_ts, until_ts, gpu_index)

    def gpu_events(
        self, since_ts: float | None = None, until_ts: float | None = None
    ) -> list[dict[str, Any]]:
        with self._reading() as db:
            return store_rows.gpu_events(db, since_ts, until_ts)

    def last_probe(self) -> dict[str, Any] | None:
        rows = self.probes(limit=1)
        return rows[0] if rows else None

    def last_gpu_samples(self) -> list[dict[str, Any]]:
        """The newest sample of each GPU, by index."""
        with self._reading() as db:
            return store_rows.last_gpu_samples(db)

    def fingerprint(self, fingerprint_id: str) -> dict[str, Any] | None:
        with self._reading() as db:
            return store_rows.fingerprint(db, fingerprint_id)

    def latest_fingerprint(self) -> dict[str, Any] | None:
        """The fingerprint seen most recently."""
        with self._reading() as db:
            return store_rows.latest_fingerprint(db)

    # ---- rollup and history (llm_watchdog.store.rollups) ---------------------------------

    def rollup(self, now_ts: float, raw_retention_s: float) -> int:
        """Fold finished minutes and hours of raw rows into the rollup tables, then delete raw
        rows older than the retention. Returns how many raw rows were newly rolled up (into
        the minute tables).

        Idempotent: a second call with nothing new changes nothing and returns 0. New rows are
        found by id (the last id rolled up is remembered per table), so a probe stored late,
        after its minute was rolled up, gets that minute and hour recomputed from all their
        raw rows. Raw rows go whole minutes at a time, and never before their hour is rolled
        up, so every bucket is computed from complete raw data.
        """
        if raw_retention_s < 0:
            raise ValueError(f"raw_retention_s must be >= 0, not {raw_retention_s}")
        with self.transaction() as db:
            return rollups.rollup(db, now_ts, raw_retention_s)

    def history(
        self,
        since_ts: float,
        until_ts: float | None = None,
        resolution: str = "auto",
        *,
        series: str = "probes",
        gpu_index: int | None = None,
    ) -> list[dict[str, Any]]:
        """Probe results (series="probes") or GPU telemetry (series="gpu") from since_ts to
        until_ts, oldest first, every row in one shape (PROBE_HISTORY_COLUMNS or
        GPU_HISTORY_COLUMNS): a raw row is a bucket of one, with `span_s` 0.

        resolution "raw": raw rows where they still exist, 1-minute rollups before that.
        "1m" / "1h": buckets throughout (rollups, and raw rows not rolled up yet, bucketed
        here the same way); they start on a whole minute or hour, so the first may begin
        before since_ts. "auto": "raw" up to AUTO_RAW_MAX_S, "1m" up to AUTO_1M_MAX_S, else
        "1h", which keeps a listing to some thousands of rows per series and GPU.
        """
        if resolution not in RESOLUTIONS:
            raise ValueError(f"resolution must be one of {RESOLUTIONS}, not {resolution!r}")
        if series not in ("probes", "gpu"):
            raise ValueError(f"series must be 'probes' or 'gpu', not {series!r}")
        if resolution == "auto":
            length = (self._clock() if until_ts is None else until_ts) - since_ts
            resolution = (
                "raw" if length <= AUTO_RAW_MAX_S else "1m" if length <= AUTO_1M_MAX_S else "1h"
            )
        with self._reading() as db:
            return rollups.history(db, since_ts, until_ts, resolution, series, gpu_index)


def _identity(path: str) -> tuple[int, int] | None:
    if path == ":memory:":
        return None
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _refuse_foreign(db: sqlite_utils.Database, path: str) -> None:
    """Another application's database has tables but not ours: leave it as it is."""
    tables = db.table_names()
    if tables and MIGRATIONS_TABLE not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", …" if len(tables) > 5 else "")
        raise StoreError(
            f"{path} is not an llm-watchdog database (it holds tables {shown}, and no "
            f"{MIGRATIONS_TABLE}); it is left unchanged: set storage.path to the watchdog's file"
        )


def _check_current(db: sqlite_utils.Database, path: str) -> None:
    """A read-only open cannot migrate: an empty or older database is said so."""
    if MIGRATIONS_TABLE not in db.table_names():
        raise StoreError(
            f"database {path} is empty: start the daemon (`llm-watchdog run`) to create it"
        )
    have = {r["number"] for r in db.query(f"SELECT number FROM {MIGRATIONS_TABLE}")}
    missing = [m.name for m in discover() if m.number not in have]
    if missing:
        raise StoreError(
            f"database {path} predates this llm-watchdog (migration {', '.join(missing)} not "
            "applied); restart the daemon once so it migrates the file, then read it"
        )
    newer = sorted(n for n in have if n not in {m.number for m in discover()})
    if newer:
        raise StoreError(
            f"database {path} was written by a newer llm-watchdog (unknown migration "
            f"{newer[0]:03d}); upgrade llm-watchdog"
        )


def _connect(path: str, busy_timeout_s: float, read_only: bool = False) -> sqlite3.Connection:
    if path != ":memory:":
        p = Path(path)
        if not p.parent.is_dir():
            raise StoreError(
                f"cannot open database {path}: directory does not exist; "
                "create it or set storage.path"
            )
        if p.is_dir():
            raise StoreError(
                f"cannot open database {path}: it is a directory; set storage.path to a file"
            )
    try:
        # isolation_level=None: the sqlite3 module opens no transaction on its own; they are
        # explicit (Store.transaction, sqlite-utils' atomic()).
        if read_only and path != ":memory:":
            if not Path(path).is_file():
                raise StoreError(f"cannot open database {path}: no such file")
            conn = _connect_read_only(path, busy_timeout_s)
        else:
            conn = sqlite3.connect(
                path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
    except sqlite3.Error as exc:
        raise StoreError(_describe(exc, path, busy_timeout_s, opening=True)) from exc
    return conn


def _connect_read_only(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    """`mode=ro`, and where that cannot read a WAL database, `immutable=1`.

    A reader of a WAL database needs its `-shm` index, and SQLite creates one beside the file
    when none is there: a database the daemon closed cleanly (no `-wal`, no `-shm`) on a
    read-only mount, or in a folder this user may not write (the service's, read with
    `--db` by another user), cannot be read with `mode=ro` at all. With no `-wal` left, the
    file holds every commit, and `immutable=1` reads it without the index. A `-wal` with
    commits in it and no index this user can open means the newest rows are in the `-wal`,
    which only a writer may fold back in: that is said rather than read around.
    """
    resolved = Path(path).resolve()
    uri = resolved.as_uri()

    def connect(query: str) -> sqlite3.Connection:
        return sqlite3.connect(
            f"{uri}?{query}", timeout=busy_timeout_s, check_same_thread=False,
            isolation_level=None, uri=True,
        )  # fmt: skip

    conn = connect("mode=ro")
    try:
        # The first read is where the WAL index is opened or created.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.DatabaseError as exc:
        msg = str(exc)
        if "unable to open" not in msg and "readonly" not in msg:
            # Not this case (a file that is no database, a damaged one): the caller's own
            # first read says so, and closes the connection as it does for any other.
            return conn
        conn.close()
        wal = resolved.with_name(resolved.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreError(
                f"cannot read database {path}: its newest commits are in {wal.name}, and "
                f"reading them needs write access to {resolved.parent} ({msg}); run as a "
                "user who may write there (the service's database: sudo llm-watchdog ...), "
                f"or copy the database with its {wal.name} to a folder you can write and "
                "read the copy"
            ) from None
        return connect("mode=ro&immutable=1")


def _describe(exc: sqlite3.Error, path: str, busy_timeout_s: float, opening: bool = False) -> str:
    """One line for a sqlite3 error: what happened to which file, and what to try."""
    msg = str(exc)
    if "file is not a database" in msg:
        return (
            f"cannot open database {path}: not an SQLite database; move it away or set storage.path"
        )
    if "unable to open" in msg or "readonly" in msg or "read-only" in msg:
        what = "open" if opening else "write to"
        return (
            f"cannot {what} database {path}: permission denied or read-only file system "
            f"({msg}); check the owner and mode of the file and its directory"
        )
    if "locked" in msg or "busy" in msg:
        return (
            f"database {path} is locked: another process held it for more than "
            f"{busy_timeout_s:g} s ({msg}); is a second watchdog writing to it?"
        )
    if "malformed" in msg or "corrupt" in msg:
        return (
            f"database {path} is damaged ({msg}): move it away (the daemon starts a new one), "
            f"restore a copy, or try `sqlite3 {path} .recover > recovered.sql`"
        )
    if "full" in msg:
        return f"database {path}: disk full ({msg}); free space or set storage.path"
    return f"database {path}: {msg}"


def _check_columns(db: sqlite_utils.Database, path: str) -> None:
    """Refuse to start when a model field has no column: every insert would fail later."""
    for table, wanted in (("probes", _PROBE_COLUMNS), ("gpu_samples", GPU_FIELDS)):
        have = {r["name"] for r in db.query(f"PRAGMA table_info({table})")}
        missing = [c for c in wanted if c not in have]
        if missing:
            raise StoreError(
                f"database {path}: table {table} has no column {', '.join(missing)}; "
                "a migration that adds it is missing from llm_watchdog/migrations"
            )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
