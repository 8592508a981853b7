"""The daemon when its database stops taking rows: a full disk is one log line a minute and
one storage_failing alert (resolved when writes go through), never a traceback per write; a
database deleted or replaced under it is an alert and exit code 1."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import pytest

from llm_watchdog.alerts import AlertConfig, AlertEvent, AlertManager
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.daemon.storage import StorageHealth
from llm_watchdog.errors import StorageError
from llm_watchdog.store.db import Store
from tests.daemon.test_start_up import RecordingSink
from tests.helpers.fakenvml import scenario_basic
from tests.helpers.streamserver import StreamServer


class Alerts:
    def __init__(self) -> None:
        self.sent: list[AlertEvent] = []

    def submit(self, event: AlertEvent) -> list[AlertEvent]:
        self.sent.append(event)
        return [event]

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True


def settings_for(url: str, db: Path) -> Any:
    return settings_from_dict(
        {
            "server": {"url": url, "model": "auto"},
            "probe": {"interval": "1s", "jitter": "0s"},
            "storage": {"path": str(db)},
        },
        "test.toml",
    )


# ---- the pure part -----------------------------------------------------------------------


def test_a_storm_of_failures_is_one_line_a_minute_and_one_alert() -> None:
    health = StorageHealth("/var/lib/w.db")
    says = [
        health.failed("probe", "database w.db: disk full", 1000.0 + i * 0.1) for i in range(350)
    ]
    lines = [s.log_line for s in says if s.log_line]
    alerts = [s.alert for s in says if s.alert]
    assert len(lines) == 1 and "disk full" in lines[0]
    assert len(alerts) == 1 and alerts[0].kind == "storage_failing"
    assert alerts[0].state == "firing" and alerts[0].severity == "critical"
    later = health.failed("gpu", "database w.db: disk full", 1061.0)
    assert (
        later.log_line is not None and "(350 failed writes since the last line)" in later.log_line
    )
    assert later.alert is None
    back = health.succeeded(1070.0)
    assert back.alert is not None and back.alert.state == "resolved"
    assert back.alert.key == alerts[0].key
    assert back.log_line is not None and "351 failed writes lost" in back.log_line
    assert health.succeeded(1071.0).log_line is None  # nothing to resolve twice


# ---- through the daemon's jobs -------------------------------------------------------------


def test_a_full_disk_under_the_daemon_logs_once_and_alerts_once(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = Alerts()
    with StreamServer(answer="Paris") as srv, Store(db_path) as store:
        daemon = Daemon(settings_for(srv.url, db_path), store, nvml=scenario_basic(), alerts=alerts)
        daemon.startup()
        try:
            probe = daemon._guarded("probe", daemon.probe_once)
            probe()
            pages = store.rows("PRAGMA page_count")[0]["page_count"]
            # SQLite's own "database or disk is full", from a real file that may not grow.
            store.db.execute(f"PRAGMA max_page_count = {pages}")
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="llm_watchdog"):
                for _ in range(40):
                    probe()
                failing = [r for r in caplog.records if r.levelno >= logging.ERROR]
                assert len(failing) == 1, [r.getMessage() for r in failing]
                assert failing[0].exc_info is None and "disk full" in failing[0].getMessage()
                store.db.execute(f"PRAGMA max_page_count = {pages * 100}")
                probe()
        finally:
            daemon.shutdown(timeout_s=2)
        rows = store.probes()
    kinds = [(a.kind, a.state) for a in alerts.sent if a.kind == "storage_failing"]
    assert kinds == [("storage_failing", "firing"), ("storage_failing", "resolved")]
    back = [r.getMessage() for r in caplog.records if "storage writes again" in r.getMessage()]
    assert len(back) == 1
    lost = int(back[0].split("(")[1].split()[0])
    # The last pages had room for some rows; every row that was committed is still there.
    assert lost >= 1 and len(rows) == 42 - lost


def test_a_deleted_database_stops_the_daemon_with_exit_code_1(db_path: Path) -> None:
    alerts = Alerts()
    with StreamServer(answer="Paris") as srv, Store(db_path, exclusive=True) as store:
        daemon = Daemon(settings_for(srv.url, db_path), store, nvml=scenario_basic(), alerts=alerts)
        daemon.startup()
        try:
            assert daemon.check_database_file() is True and daemon.exit_code == 0
            db_path.unlink()
            assert daemon.check_database_file() is False
        finally:
            daemon.shutdown(timeout_s=2)
    assert daemon.exit_code == 1 and daemon.should_exit.is_set()
    assert [a.kind for a in alerts.sent] == ["storage_failing"]
    assert "was deleted while in use" in alerts.sent[0].message


# ---- the storage alert over a restart -------------------------------------------------------


def storage_alerts(sink: RecordingSink) -> list[tuple[str, str]]:
    return [(a.state, a.key) for a in sink.sent if a.kind == "storage_failing"]


def history(store: Store) -> list[tuple[str, str, int]]:
    rows = store.rows(
        "SELECT state, key, ok FROM alerts WHERE kind = 'storage_failing' ORDER BY ts, id"
    )
    return [(r["state"], r["key"], r["ok"]) for r in rows]


def alerting_daemon(url: str, db_path: Path, store: Store, sink: RecordingSink):
    manager = AlertManager([sink], store, AlertConfig(tick_interval_s=None))
    daemon = Daemon(settings_for(url, db_path), store, nvml=scenario_basic(), alerts=manager)
    daemon.startup()
    return daemon, manager


def stop(daemon: Daemon, manager: AlertManager) -> None:
    daemon.shutdown(timeout_s=2)
    assert manager.flush(5)
    manager.close()


def fill_the_disk(store: Store, *, alerts_too: bool = False) -> None:
    """A database file that may not grow. `alerts_too`: and whose `alerts` pages are full
    (rows of another kind), so that even an alert's small row fails."""
    pages = store.rows("PRAGMA page_count")[0]["page_count"]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    if not alerts_too:
        return
    for size in (1000, 100, 10, 0):
        with contextlib.suppress(StorageError):
            while True:
                store.insert(
                    "alerts",
                    {"ts": 0.0, "key": "filler", "kind": "filler", "state": "firing"}
                    | {"severity": "info", "sink": "none", "ok": 0, "attempts": 0, "final": 1}
                    | {"title": "", "message": "x" * size},
                )


def test_a_storage_alert_fired_before_a_restart_resolves_after_it(db_path: Path) -> None:
    sink = RecordingSink()
    with StreamServer(answer="Paris") as srv:
        with Store(db_path) as store:
            daemon, manager = alerting_daemon(srv.url, db_path, store, sink)
            try:
                probe = daemon._guarded("probe", daemon.probe_once)
                probe()
                fill_the_disk(store)
                for _ in range(40):
                    probe()
            finally:
                stop(daemon, manager)  # stopped while the disk is still full
        ((state, key),) = storage_alerts(sink)
        assert state == "firing"
        assert (db_path.parent / (db_path.name + ".storage-alert")).exists()
        # Restarted, and the disk has room again (a new connection has no page limit).
        with Store(db_path) as store:
            daemon, manager = alerting_daemon(srv.url, db_path, store, sink)
            try:
                daemon._guarded("probe", daemon.probe_once)()
            finally:
                stop(daemon, manager)
            rows = history(store)
    assert storage_alerts(sink) == [("firing", key), ("resolved", key)]
    assert sink.sent[-1].message.startswith("storage writes again after ")
    assert "before a restart" in sink.sent[-1].message
    # The history says when storage failed and when it came back.
    assert rows == [("firing", key, 1), ("resolved", key, 1)]
    assert not (db_path.parent / (db_path.name + ".storage-alert")).exists()


def test_a_storage_failure_and_its_recovery_in_one_run_are_both_in_the_history(
    db_path: Path,
) -> None:
    sink = RecordingSink()
    with StreamServer(answer="Paris") as srv, Store(db_path) as store:
        daemon, manager = alerting_daemon(srv.url, db_path, store, sink)
        try:
            probe = daemon._guarded("probe", daemon.probe_once)
            probe()
            fill_the_disk(store, alerts_too=True)
            for _ in range(40):
                probe()
            assert manager.flush(5)
            assert history(store) == []  # the firing alert went out; its row could not
            store.db.execute("PRAGMA max_page_count = 1073741823")
            probe()
        finally:
            stop(daemon, manager)
        rows = history(store)
    ((_, key), _) = storage_alerts(sink)
    assert rows == [("firing", key, 1), ("resolved", key, 1)]


def test_the_alert_of_a_deleted_database_resolves_on_the_new_one(db_path: Path) -> None:
    sink = RecordingSink()
    with StreamServer(answer="Paris") as srv:
        with Store(db_path, exclusive=True) as store:
            daemon, manager = alerting_daemon(srv.url, db_path, store, sink)
            try:
                db_path.unlink()
                assert daemon.check_database_file() is False
            finally:
                stop(daemon, manager)
        ((state, key),) = storage_alerts(sink)
        assert state == "firing" and key.startswith("storage:file:")
        # systemd restarts the watchdog onto a new, empty database at the same path.
        with Store(db_path, exclusive=True) as store:
            daemon, manager = alerting_daemon(srv.url, db_path, store, sink)
            try:
                daemon._guarded("probe", daemon.probe_once)()
            finally:
                stop(daemon, manager)
            rows = history(store)
    assert storage_alerts(sink) == [("firing", key), ("resolved", key)]
    assert rows == [("firing", key, 1), ("resolved", key, 1)]
