"""The store on real SQLite files: migrations, round trips, failures, threads, rollup, history."""

from __future__ import annotations

import dataclasses
import importlib
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlite_utils

from llm_watchdog.models import Fingerprint, GpuEvent, GpuSample, ProbeResult
from llm_watchdog.nvml.throttle import (
    GPU_IDLE,
    HW_POWER_BRAKE_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
)
from llm_watchdog.store.db import (
    GPU_FIELDS,
    GPU_HISTORY_COLUMNS,
    PROBE_FIELDS,
    PROBE_HISTORY_COLUMNS,
    Store,
    StoreError,
    probe_from_row,
    sample_from_row,
)
from llm_watchdog.store.migrations import MigrationError, discover, migrate
from tests.helpers.builders import probe_result

T0 = 1_700_000_040.0  # a whole minute (1_700_000_040 = 28_333_334 * 60)
H0 = 1_699_999_200  # a whole hour (472_222 * 3600)


def sample(ts: float, gpu: int = 0, **kw: Any) -> GpuSample:
    base: dict[str, Any] = dict(ts=ts, gpu_index=gpu, temp_c=60.0, sm_clock_mhz=1900.0)
    base.update(kw)
    return GpuSample(**base)


def raw_rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Read with a separate plain connection, as another process would."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# ---- opening and migrations -----------------------------------------------------------------


def test_new_database_is_migrated_once_in_wal_mode(db_path: Path) -> None:
    with Store(db_path, clock=lambda: 123.0):
        pass
    expected = [(m.number, m.name, 123.0) for m in discover()]
    assert expected[0] == (1, "m001_initial", 123.0)
    assert raw_rows(db_path, "SELECT * FROM _migrations ORDER BY number") == expected
    assert raw_rows(db_path, "PRAGMA journal_mode") == [("wal",)]
    tables = {r[0] for r in raw_rows(db_path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"fingerprints", "probes", "gpu_samples", "gpu_events", "probes_1m", "gpu_1m"} <= tables

    with Store(db_path, clock=lambda: 999.0) as again:  # reopening applies nothing
        again.record_probe(probe_result(T0), None)
    with Store(db_path) as third:
        assert len(third.probes()) == 1
    assert raw_rows(db_path, "SELECT * FROM _migrations ORDER BY number") == expected


def test_opening_an_up_to_date_database_takes_no_write_lock(db_path: Path) -> None:
    Store(db_path).close()
    writer = sqlite3.connect(db_path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # the daemon in the middle of a write
        with Store(db_path, busy_timeout_s=0.2) as reader:  # `llm-watchdog status`
            assert reader.last_probe() is None
        writer.execute("ROLLBACK")
    finally:
        writer.close()


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> str:
    name = f"migs_{uuid.uuid4().hex[:8]}"
    pkg = tmp_path / name
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    for fname, body in files.items():
        (pkg / fname).write_text(f"def up(db):\n    {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_runner_picks_up_new_files_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = _package(
        tmp_path,
        monkeypatch,
        {
            "m002_b.py": "db.execute('ALTER TABLE a ADD COLUMN y INTEGER')",
            "m001_a.py": "db.execute('CREATE TABLE a (x INTEGER)')",
            "notes.py": "raise RuntimeError('not a migration')",
        },
    )
    with sqlite_utils.Database(tmp_path / "t.db") as db:
        assert migrate(db, discover(pkg)) == ["m001_a", "m002_b"]
        assert migrate(db, discover(pkg)) == []
        # A colleague adds a file: the runner needs no change to apply it.
        (tmp_path / pkg / "m003_c.py").write_text(
            "def up(db):\n    db.execute('CREATE TABLE c (z TEXT)')\n"
        )
        importlib.invalidate_caches()
        assert migrate(db, discover(pkg)) == ["m003_c"]
        assert [r["name"] for r in db.query("SELECT name FROM _migrations ORDER BY number")] == [
            "m001_a",
            "m002_b",
            "m003_c",
        ]
        assert set(db["a"].columns_dict) == {"x", "y"}


def test_failed_migration_leaves_nothing_half_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = _package(
        tmp_path,
        monkeypatch,
        {
            "m001_a.py": "db.execute('CREATE TABLE a (x INTEGER)')",
            "m002_bad.py": "db.execute('CREATE TABLE b (x INTEGER)'); raise RuntimeError('boom')",
        },
    )
    with sqlite_utils.Database(tmp_path / "t.db") as db:
        with pytest.raises(RuntimeError, match="boom"):
            migrate(db, discover(pkg))
        assert db.table_names() == ["_migrations", "a"]  # m001 kept, m002's table rolled back
        assert [r["number"] for r in db.query("SELECT number FROM _migrations")] == [1]


def test_two_migrations_with_one_number_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = _package(tmp_path, monkeypatch, {"m001_a.py": "pass", "m001_b.py": "pass"})
    with pytest.raises(MigrationError, match="m001_a and m001_b share number 1; renumber"):
        discover(pkg)


def test_database_from_a_newer_version_is_refused(db_path: Path) -> None:
    Store(db_path).close()
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO _migrations VALUES (99, 'm099_future_things', 0)")
    conn.close()
    with pytest.raises(StoreError) as err:
        Store(db_path)
    assert str(err.value) == (
        f"database {db_path} was written by a newer llm-watchdog (unknown migration "
        "m099_future_things); upgrade llm-watchdog, or set storage.path to another file"
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda p: p / "missing" / "w.db",
            "cannot open database {}: directory does not exist; create it or set storage.path",
        ),
        (
            lambda p: p,
            "cannot open database {}: it is a directory; set storage.path to a file",
        ),
        (
            lambda p: (p / "junk.db").write_text("not sqlite at all" * 100) and p / "junk.db",
            "cannot open database {}: not an SQLite database; move it away or set storage.path",
        ),
    ],
    ids=["no-directory", "is-directory", "not-sqlite"],
)
def test_open_errors_are_one_line(tmp_path: Path, make: Any, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(StoreError) as err:
        Store(path)
    assert str(err.value) == message.format(path)


def test_closed_store_says_so(db_path: Path) -> None:
    s = Store(db_path)
    s.close()
    s.close()  # twice is fine
    with pytest.raises(StoreError, match=r"database .*watchdog.db is closed"):
        s.last_probe()


# ---- round trips ----------------------------------------------------------------------------


def test_every_probe_field_round_trips(store: Store) -> None:
    full = ProbeResult(
        ts=T0 + 0.125,
        prompt_id="p1",
        probe_set="default",
        url="http://127.0.0.1:1/v1",
        model="smollm2",
        ok=False,
        cache_mode="cached",
        cache_bust="none",
        connection="retried_stale",
        error_class="http_status",
        error_detail="HTTP 503: overloaded",
        http_status=503,
        ttft_ms=12.5,
        first_event_ms=3.25,
        total_ms=99.0,
        output_tokens=7,
        gap_p50_ms=4.0,
        gap_max_ms=9.5,
        answer="Paris ✓",
        quality_pass=False,
        load_duration_ms=1500.0,
        cold=True,
        batch_inflight=5,
        batch_allowance=6,
    )
    assert all(getattr(full, f.name) != f.default for f in dataclasses.fields(ProbeResult))
    sparse = probe_result(T0 + 1, ttft_ms=None, total_ms=None, quality_pass=None)
    fp = store.record_fingerprint(Fingerprint(model="smollm2"))
    store.record_probe(full, fp)
    store.record_probe(sparse, None)
    rows = store.probes()
    assert [probe_from_row(r) for r in rows] == [full, sparse]
    assert rows[0]["fingerprint_id"] == fp and rows[1]["fingerprint_id"] is None
    assert rows[1]["quality_pass"] is None and rows[1]["ttft_ms"] is None
    assert rows[0]["ok"] is False and rows[0]["cold"] is True
    assert set(PROBE_FIELDS) <= set(rows[0])


def test_every_gpu_sample_field_round_trips(store: Store) -> None:
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(GpuSample)):
        values[f.name] = {"ts": T0, "gpu_index": 3, "uuid": "GPU-1234", "pstate": 2}.get(
            f.name, 1.5 + i
        )
    values["throttle_reasons"] = SW_THERMAL_SLOWDOWN | GPU_IDLE
    full = GpuSample(**values)
    bare = GpuSample(ts=T0 + 1, gpu_index=0)
    store.record_gpu_samples([full, bare])
    store.record_gpu_samples([])  # nothing to do, no error
    rows = store.gpu_samples()
    assert [sample_from_row(r) for r in rows] == [full, bare]
    assert all(rows[1][k] is None for k in GPU_FIELDS if k not in ("ts", "gpu_index"))
    assert [sample_from_row(r) for r in store.gpu_samples(gpu_index=0)] == [bare]


def test_gpu_events_round_trip(store: Store) -> None:
    store.record_gpu_event(GpuEvent(ts=T0, kind="gpu_lost", gpu_index=1, detail="GpuIsLost"))
    store.record_gpu_event(GpuEvent(ts=T0 + 5, kind="nvml_unavailable"))
    rows = store.gpu_events(T0, T0 + 10)
    assert [GpuEvent(**{k: r[k] for k in ("ts", "kind", "gpu_index", "detail")}) for r in rows] == [
        GpuEvent(ts=T0, kind="gpu_lost", gpu_index=1, detail="GpuIsLost"),
        GpuEvent(ts=T0 + 5, kind="nvml_unavailable"),
    ]
    assert store.gpu_events(T0 + 1) == rows[1:]


def test_fingerprint_upsert_keeps_first_seen_and_moves_last_seen(store: Store) -> None:
    a = Fingerprint(engine="llamacpp", model="a", extra={"build": "b1"})
    b = Fingerprint(engine="llamacpp", model="b")
    assert store.record_fingerprint(a, now_ts=100.0) == a.id
    store.record_fingerprint(b, now_ts=150.0)
    store.record_fingerprint(a, now_ts=200.0)
    row = store.fingerprint(a.id)
    assert row is not None
    assert (row["first_seen"], row["last_seen"], row["model"]) == (100.0, 200.0, "a")
    assert row["extra"] == {"build": "b1"}
    assert Fingerprint(**{k: row[k] for k in a.key_fields()}).id == a.id
    latest = store.latest_fingerprint()
    assert latest is not None and latest["id"] == a.id
    assert store.fingerprint("nope") is None


def test_probes_range_limit_and_last(store: Store) -> None:
    assert store.last_probe() is None
    for i in range(10):
        store.record_probe(probe_result(T0 + i), None)
    assert [r["ts"] for r in store.probes(T0 + 2, T0 + 5)] == [T0 + 2, T0 + 3, T0 + 4]
    assert [r["ts"] for r in store.probes(limit=3)] == [T0 + 7, T0 + 8, T0 + 9]
    last = store.last_probe()
    assert last is not None and last["ts"] == T0 + 9


def test_last_gpu_samples_gives_the_newest_of_each_gpu(store: Store) -> None:
    assert store.last_gpu_samples() == []
    store.record_gpu_samples([sample(T0, 0), sample(T0, 1), sample(T0, 2)])
    store.record_gpu_samples([sample(T0 + 1, 0, temp_c=61.0), sample(T0 + 1, 2, temp_c=62.0)])
    last = store.last_gpu_samples()
    assert [(r["gpu_index"], r["ts"], r["temp_c"]) for r in last] == [
        (0, T0 + 1, 61.0),
        (1, T0, 60.0),
        (2, T0 + 1, 62.0),
    ]


# ---- failures never lose earlier data -------------------------------------------------------


def test_failed_writes_raise_store_error_and_keep_earlier_rows(store: Store) -> None:
    store.record_probe(probe_result(T0), None)
    store.record_gpu_samples([sample(T0)])
    with pytest.raises(StoreError, match=r"^database .*: FOREIGN KEY constraint failed$"):
        store.record_probe(probe_result(T0 + 1), "no-such-fingerprint")
    bad_batch = [sample(T0 + 1, 0), GpuSample(ts=T0 + 1, gpu_index=None)]  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="NOT NULL constraint failed: gpu_samples.gpu_index"):
        store.record_gpu_samples(bad_batch)
    assert [r["ts"] for r in store.probes()] == [T0]
    assert [r["ts"] for r in store.gpu_samples()] == [T0]  # none of the bad batch
    store.record_probe(probe_result(T0 + 2), None)  # and the store still writes
    assert len(store.probes()) == 2


def test_a_write_blocked_past_the_busy_timeout_is_a_store_error(db_path: Path) -> None:
    with Store(db_path, busy_timeout_s=0.2) as s:
        other = sqlite3.connect(db_path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with pytest.raises(StoreError, match=r"is locked: another process held it for more"):
                s.record_probe(probe_result(T0), None)
            other.execute("ROLLBACK")
        finally:
            other.close()
        s.record_probe(probe_result(T0), None)
        assert len(s.probes()) == 1


def test_generic_helpers_for_other_tables(store: Store) -> None:
    store.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, ts REAL, body TEXT, tags TEXT)")
    first = store.insert("notes", {"ts": 1.0, "body": "hello", "tags": ["a", "b"]})
    second = store.insert("notes", {"ts": 2.0, "body": "again"})
    assert (first, second) == (1, 2)
    assert store.execute("UPDATE notes SET body = ? WHERE id = ?", ["edited", first]) == 1
    assert store.rows("SELECT id, body, tags FROM notes ORDER BY id") == [
        {"id": 1, "body": "edited", "tags": '["a", "b"]'},
        {"id": 2, "body": "again", "tags": None},
    ]
    with pytest.raises(StoreError, match=r"^rows\(\) only reads, and this statement writes"):
        store.rows("DELETE FROM notes")
    with pytest.raises(StoreError, match=r"^rows\(\) needs a query that returns rows"):
        store.rows("BEGIN")
    assert store.execute("INSERT INTO notes (ts) VALUES (5.0)") == 1  # query_only is off again
    with pytest.raises(KeyError):
        with store.transaction() as db:
            db.execute("DELETE FROM notes")
            raise KeyError("changed my mind")
    assert len(store.rows("SELECT * FROM notes")) == 3  # rolled back
    with store.transaction():
        store.insert("notes", {"ts": 3.0})  # nested: a savepoint inside the transaction
        store.insert("notes", {"ts": 4.0})
    assert len(store.rows("SELECT * FROM notes")) == 5
    with pytest.raises(StoreError, match="no such table: nothing"):
        store.insert("nothing", {"a": 1})


def test_memory_store() -> None:
    with Store.memory() as s:
        s.record_probe(probe_result(T0), s.record_fingerprint(Fingerprint()))
        assert len(s.probes()) == 1


# ---- threads --------------------------------------------------------------------------------


def test_concurrent_writers_and_readers_lose_nothing(db_path: Path) -> None:
    n_threads, n_each = 6, 40
    errors: list[BaseException] = []
    with Store(db_path) as shared, Store(db_path) as second_process:
        fp = shared.record_fingerprint(Fingerprint(model="m"))

        def writer(k: int, s: Store) -> None:
            try:
                for i in range(n_each):
                    ts = T0 + k * 1000 + i
                    s.record_probe(probe_result(ts), fp)
                    s.record_gpu_samples([sample(ts, 0), sample(ts, 1)])
                    s.record_fingerprint(Fingerprint(model="m"), now_ts=ts)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def reader() -> None:
            try:
                for _ in range(30):
                    shared.last_probe()
                    shared.last_gpu_samples()
                    shared.history(T0, None, "1m")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=writer, args=(k, shared if k % 2 else second_process))
            for k in range(n_threads)
        ]
        threads.append(threading.Thread(target=reader))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert len(shared.probes()) == n_threads * n_each
        assert len(shared.gpu_samples()) == 2 * n_threads * n_each
        assert len({r["id"] for r in shared.probes()}) == n_threads * n_each


# ---- rollup ---------------------------------------------------------------------------------


def test_rollup_aggregates_a_minute_correctly(store: Store) -> None:
    fp = store.record_fingerprint(Fingerprint(model="m"))
    ttfts = [120.0, 80.0, 100.0, 300.0, 90.0, 110.0]
    for i, t in enumerate(ttfts):
        store.record_probe(probe_result(T0 + i * 5, ttft_ms=t, total_ms=t + 100), fp)
    store.record_probe(probe_result(T0 + 31, ttft_ms=900.0, cold=True), fp)  # kept apart
    store.record_probe(
        probe_result(T0 + 32, ok=False, ttft_ms=None, total_ms=None, quality_pass=None,
              error_class="connect_refused"),
        fp,
    )  # fmt: skip
    store.record_probe(probe_result(T0 + 33, quality_pass=False, ttft_ms=None), fp)
    reasons = [GPU_IDLE, SW_THERMAL_SLOWDOWN, SW_POWER_CAP, None, HW_POWER_BRAKE_SLOWDOWN]
    temps = [60.0, 70.0, 80.0, 90.0, 50.0]
    store.record_gpu_samples(
        [
            sample(T0 + i, 0, temp_c=temps[i], sm_clock_mhz=1900.0 - 100 * i, throttle_reasons=r,
                   thermal_violation_ms=10.0, power_w=200.0 + i, pstate=i % 3)
            for i, r in enumerate(reasons)
        ]
    )  # fmt: skip
    store.record_probe(probe_result(T0 + 60), fp)  # the next, unfinished minute

    assert store.rollup(T0 + 61, raw_retention_s=86400) == 9 + 5
    (p,) = store.rows("SELECT * FROM probes_1m")
    assert p["ts"] == T0 and p["fingerprint_id"] == fp
    assert (p["n"], p["ok_n"], p["cold_n"], p["quality_n"], p["quality_fail_n"]) == (9, 8, 1, 8, 1)
    assert p["ttft_n"] == 6
    assert p["ttft_p50_ms"] == pytest.approx(np.percentile(ttfts, 50))
    assert p["ttft_p95_ms"] == pytest.approx(np.percentile(ttfts, 95))
    assert p["ttft_mean_ms"] == pytest.approx(np.mean(ttfts))
    assert (p["ttft_min_ms"], p["ttft_max_ms"], p["cold_ttft_max_ms"]) == (80.0, 300.0, 900.0)
    assert p["errors"] == '{"connect_refused": 1}'

    (g,) = store.rows("SELECT * FROM gpu_1m")
    assert (g["ts"], g["gpu_index"], g["n"]) == (T0, 0, 5)
    assert g["temp_mean_c"] == pytest.approx(70.0) and g["temp_max_c"] == 90.0
    assert (g["sm_clock_min_mhz"], g["sm_clock_mean_mhz"]) == (1500.0, 1700.0)
    assert g["throttle_reasons"] == GPU_IDLE | SW_THERMAL_SLOWDOWN | SW_POWER_CAP | 0x80
    assert (g["thermal_n"], g["power_n"]) == (1, 2)
    assert (g["thermal_violation_ms"], g["power_violation_ms"]) == (50.0, None)
    assert (g["power_max_w"], g["pstate_max"], g["util_gpu_mean_pct"]) == (204.0, 2, None)


def test_rollup_is_idempotent_and_picks_up_late_rows(store: Store) -> None:
    for i in range(30):
        store.record_probe(probe_result(T0 + i * 10, ttft_ms=100.0 + i), None)
        store.record_gpu_samples([sample(T0 + i * 10, 0), sample(T0 + i * 10, 1)])
    now = T0 + 300
    assert store.rollup(now, 86400) == 30 + 60
    before = (store.rows("SELECT * FROM probes_1m"), store.rows("SELECT * FROM gpu_1m"))
    assert store.rollup(now, 86400) == 0
    assert store.rollup(now + 30, 86400) == 0  # same minute, nothing finished
    assert (store.rows("SELECT * FROM probes_1m"), store.rows("SELECT * FROM gpu_1m")) == before
    assert [r["n"] for r in before[0]] == [6, 6, 6, 6, 6]

    # A slow probe sent in the first minute is stored after that minute was rolled up.
    store.record_probe(probe_result(T0 + 59, ttft_ms=5000.0), None)
    assert store.rollup(now, 86400) == 1
    first = store.rows("SELECT n, ttft_max_ms FROM probes_1m ORDER BY ts LIMIT 1")
    assert first == [{"n": 7, "ttft_max_ms": 5000.0}]
    assert store.rows("SELECT COUNT(*) AS c FROM probes_1m") == [{"c": 5}]


def test_rollup_prunes_whole_old_minutes_once_their_hour_is_rolled_up(store: Store) -> None:
    samples = [sample(H0 + i, 0) for i in range(7200)]  # two hours at 1 Hz
    for i in range(0, 7200, 600):
        store.record_gpu_samples(samples[i : i + 600])
    # Retention 0 in the middle of the first hour: nothing of the unfinished hour goes.
    assert store.rollup(H0 + 1800, raw_retention_s=0) == 1800
    assert len(store.gpu_samples()) == 7200

    assert store.rollup(H0 + 7200 + 5, raw_retention_s=1800) == 5400
    # now - retention = H0 + 5405 -> raw rows before H0 + 5400 (a whole minute) are gone
    assert store.gpu_samples()[0]["ts"] == H0 + 5400
    assert len(store.gpu_samples()) == 1800
    assert store.rows("SELECT SUM(n) AS n, COUNT(*) AS c FROM gpu_1m") == [{"n": 7200, "c": 120}]
    assert store.rows("SELECT ts, n FROM gpu_1h") == [
        {"ts": H0, "n": 3600},
        {"ts": H0 + 3600, "n": 3600},
    ]
    # A late row for a pruned minute does not replace its rollups with a fragment.
    store.record_gpu_samples([sample(H0 + 1.5, 0, temp_c=99.0)])
    assert store.rollup(H0 + 7206, raw_retention_s=1800) == 1
    assert store.rows(f"SELECT n, temp_max_c FROM gpu_1m WHERE ts = {H0}") == [
        {"n": 60, "temp_max_c": 60.0}
    ]
    assert store.rows(f"SELECT n, temp_max_c FROM gpu_1h WHERE ts = {H0}") == [
        {"n": 3600, "temp_max_c": 60.0}
    ]


def test_rows_after_a_full_prune_are_still_rolled_up(store: Store) -> None:
    store.record_probe(probe_result(H0), None)
    assert store.rollup(H0 + 3660, raw_retention_s=0) == 1
    assert store.probes() == []
    # With every raw row gone, a plain rowid table would hand out id 1 again, below the
    # remembered last id; AUTOINCREMENT does not.
    store.record_probe(probe_result(H0 + 3700), None)
    assert store.rollup(H0 + 7260, raw_retention_s=0) == 1
    assert store.rows("SELECT ts, n FROM probes_1m ORDER BY ts") == [
        {"ts": H0, "n": 1},
        {"ts": H0 + 3660, "n": 1},
    ]
    assert store.rows("SELECT ts, n FROM probes_1h ORDER BY ts") == [
        {"ts": H0, "n": 1},
        {"ts": H0 + 3600, "n": 1},
    ]


# ---- history --------------------------------------------------------------------------------


def ttft_at(i: int) -> float:
    return 100.0 + (i % 7) * 10 + (i // 360) * 50  # a step up every hour


def _three_hours(store: Store) -> None:
    fp = store.record_fingerprint(Fingerprint(model="m"))
    for i in range(3 * 360):  # 3 h at one probe per 10 s
        store.record_probe(probe_result(H0 + i * 10, ttft_ms=ttft_at(i), cold=i == 0), fp)
    store.record_gpu_samples(
        [sample(H0 + i * 5, g, temp_c=50.0 + i % 30) for i in range(3 * 720) for g in (0, 1)]
    )


@pytest.mark.parametrize("resolution, buckets", [("1m", 180), ("1h", 3)])
def test_buckets_are_the_same_before_and_after_rollup(
    store: Store, resolution: str, buckets: int
) -> None:
    _three_hours(store)
    end = H0 + 3 * 3600
    probes_before = store.history(H0, end, resolution)
    gpu_before = store.history(H0, end, resolution, series="gpu")
    assert store.rollup(end + 60, raw_retention_s=3600) == 1080 + 4320
    assert store.history(H0, end, resolution) == probes_before
    assert store.history(H0, end, resolution, series="gpu") == gpu_before
    assert len(probes_before) == buckets and sum(r["n"] for r in probes_before) == 1080
    assert len(gpu_before) == 2 * buckets and sum(r["n"] for r in gpu_before) == 4320


def test_hourly_buckets_are_exact(store: Store) -> None:
    _three_hours(store)
    end = H0 + 3 * 3600
    store.rollup(end, raw_retention_s=3600)
    hours = store.history(H0, end, "1h")
    assert [(r["ts"], r["span_s"]) for r in hours] == [(H0 + k * 3600, 3600) for k in range(3)]
    for k, h in enumerate(hours):
        raw = [ttft_at(i) for i in range(k * 360, (k + 1) * 360) if i != 0]  # 0 was cold
        assert h["ttft_n"] == len(raw)
        assert h["ttft_p50_ms"] == pytest.approx(np.percentile(raw, 50))
        assert h["ttft_p95_ms"] == pytest.approx(np.percentile(raw, 95))
        assert h["ttft_mean_ms"] == pytest.approx(np.mean(raw))
    assert hours[0]["cold_n"] == 1 and hours[0]["cold_ttft_max_ms"] == 100.0
    gpu_hours = store.history(H0, end, "1h", series="gpu", gpu_index=0)
    assert [(r["n"], r["temp_max_c"], r["temp_mean_c"]) for r in gpu_hours] == [
        (720, 79.0, 64.5)
    ] * 3


def test_raw_history_reads_rollups_then_raw_rows_without_overlap(store: Store) -> None:
    _three_hours(store)
    end = H0 + 3 * 3600
    store.rollup(end, raw_retention_s=3600)
    boundary = end - 3600  # raw rows begin here
    rows = store.history(H0, None, "raw")
    assert list(rows[0]) == list(PROBE_HISTORY_COLUMNS)
    older = [r for r in rows if r["span_s"] == 60]
    newer = [r for r in rows if r["span_s"] == 0]
    assert rows == older + newer  # oldest first, rollups before raw rows
    assert older[-1]["ts"] == boundary - 60 and newer[0]["ts"] == boundary
    assert sum(r["n"] for r in rows) == 1080
    assert newer[0]["prompt_id"] == "capital" and newer[0]["n"] == 1
    assert newer[0]["ttft_p95_ms"] == ttft_at(720)
    assert older[0]["cold_n"] == 1 and older[0]["ttft_n"] == 5  # the cold start kept apart

    gpu = store.history(boundary - 120, boundary + 10, "raw", series="gpu", gpu_index=1)
    assert list(gpu[0]) == list(GPU_HISTORY_COLUMNS)
    assert [(r["ts"], r["span_s"], r["n"]) for r in gpu] == [
        (boundary - 120, 60, 12),
        (boundary - 60, 60, 12),
        (boundary, 0, 1),
        (boundary + 5, 0, 1),
    ]
    assert {r["gpu_index"] for r in gpu} == {1}


@pytest.mark.parametrize("days, span", [(1, 0), (2, 0), (3, 60), (60, 60), (61, 3600), (365, 3600)])
def test_auto_resolution_follows_the_length_of_the_range(
    store: Store, days: int, span: int
) -> None:
    store.record_probe(probe_result(H0 - 600), None)
    store.record_gpu_samples([sample(H0 - 600, 0)])
    for series in ("probes", "gpu"):
        (row,) = store.history(H0 - days * 86400, H0, series=series)
        assert row["span_s"] == span


def test_history_rejects_unknown_resolution(store: Store) -> None:
    with pytest.raises(ValueError, match="resolution must be one of"):
        store.history(T0, None, "5m")


def test_the_laws_surge_memory_is_kept_per_engine_replaced_and_forgotten(store: Store) -> None:
    from llm_watchdog.store.control import save_surge_memory, surge_memory

    save_surge_memory(store, "a", {"cap": 6}, T0)
    save_surge_memory(store, None, {"cap": 3}, T0)  # no engine identified: kept under ''
    save_surge_memory(store, "a", {"cap": 5}, T0 + 60)  # one row per engine, the newest
    assert surge_memory(store, "a", T0) == {"cap": 5}
    assert surge_memory(store, None, T0) == {"cap": 3}
    assert surge_memory(store, "a", T0 + 61) is None  # older than asked for
    store.execute("UPDATE law_memory SET surge = '[1, 2]' WHERE fingerprint_id = ''")
    assert surge_memory(store, None, T0) is None  # not an object: not started from
    save_surge_memory(store, "a", None, T0 + 120)
    assert surge_memory(store, "a", T0) is None
    assert store.rows("SELECT COUNT(*) AS n FROM law_memory")[0]["n"] == 1
