"""The fault matrix: one row per fault, against the real daemon wiring (real sockets on
127.0.0.1, a real SQLite file, fake NVML passed in). Every row asserts that the daemon lives
(the guarded job returns and the next one works), that the failure is recorded with its class,
that a person is alerted where one should be, and that no committed row is lost.

Families: engine faults (the stream server's and a few hostile ones), NVML faults, storage
faults, control faults, process faults. The two-daemon and deleted-database process rows run
as real processes in tests/daemon/test_one_writer.py; SIGTERM mid-probe here.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llm_watchdog.actuators.haproxy import HaproxyActuator
from llm_watchdog.alerts import AlertEvent
from llm_watchdog.config import settings_from_dict
from llm_watchdog.control.law import ControlConfig
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.daemon.steer import Steer, gateway_steer
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.store.db import Store, StoreError
from llm_watchdog.store.lock import DatabaseInUse
from tests.helpers import fakenvml
from tests.helpers.builders import FakeClock, probe_result
from tests.helpers.streamserver import StreamServer, closed_port_url, unanswering_port

ROOT = Path(__file__).resolve().parents[1]


class Alerts:
    def __init__(self) -> None:
        self.sent: list[AlertEvent] = []
        self._lock = threading.Lock()

    def submit(self, event: AlertEvent) -> list[AlertEvent]:
        with self._lock:
            self.sent.append(event)
        return [event]

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def kinds(self) -> set[str]:
        return {a.kind for a in self.sent if a.state == "firing"}


def settings_for(url: str, db: Path, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "server": {"url": url, "model": "auto"},
        "probe": {
            "interval": "1s",
            "jitter": "0s",
            "connect_timeout": "0.5s",
            "first_token_timeout": "0.6s",
            "total_timeout": "1.2s",
        },
        "gpu": {"interval": "1s", "call_timeout": "0.3s"},
        "storage": {"path": str(db)},
    }
    for section, values in extra.items():
        data.setdefault(section, {}).update(values)
    return settings_from_dict(data, "matrix.toml")


# ---- engine faults -------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineFault:
    id: str
    behaviour: dict[str, Any] = field(default_factory=dict)
    error_class: str | None = None  # None: the probe is ok
    url: str | None = None  # "refused" | "full_backlog" | "silent": no stream server at all
    alert: bool = True  # three failures in a row page a person (probes_failing)


_500 = {"fault": "status", "status": 500}
ENGINE_FAULTS = [
    EngineFault("healthy", {}, None, alert=False),
    EngineFault("reasoning-only answer", {"answer": "", "reasoning": "Paris"}, alert=False),
    EngineFault("no role chunk", {"role_chunk": False}, alert=False),
    EngineFault("no usage chunk", {"usage": False}, alert=False),
    EngineFault("idle keep-alive closed", {"idle_close_s": 0.01}, alert=False),
    EngineFault("drops reused connections", {"fault": "drop_reused"}, alert=False),
    EngineFault("http 500", _500, "http_status"),
    EngineFault("http 503", {"fault": "status", "status": 503}, "http_status"),
    EngineFault("http 429", {"fault": "status", "status": 429}, "http_status"),
    EngineFault("http 401", {"fault": "status", "status": 401}, "http_status"),
    EngineFault("http 404", {"fault": "status", "status": 404}, "http_status"),
    EngineFault("http 400", {"fault": "status", "status": 400}, "http_status"),
    EngineFault(
        "http 500 with ANSI body",
        {**_500, "error_body": {"error": "\x1b[2J\x1b[31mfake\nline"}},
        "http_status",
    ),
    EngineFault(
        "http 500 non-JSON body", {**_500, "error_body": "<html>oops</html>"}, "http_status"
    ),
    EngineFault("error mid-stream", {"fault": "error_mid_stream"}, "server_error"),
    EngineFault("garbage line", {"fault": "garbage"}, "protocol_error"),
    EngineFault("no [DONE]", {"fault": "no_done", "usage": False}, None, alert=False),
    EngineFault("cut mid-body", {"fault": "cut"}, "protocol_error"),
    EngineFault("keep-alives forever", {"fault": "keepalive_forever"}, "first_token_timeout"),
    EngineFault("no response", {"fault": "hang"}, "first_token_timeout"),
    EngineFault("headers late", {"headers_delay_s": 2.0}, "first_token_timeout"),
    EngineFault("first token late", {"first_token_delay_s": 2.0}, "first_token_timeout"),
    EngineFault(
        "tokens slow", {"token_gap_s": 0.5, "answer": "Paris is in France"}, "total_timeout"
    ),
    EngineFault("every connection dropped", {"fault": "drop"}, "protocol_error"),
    EngineFault("not streaming", {"fault": "not_streaming"}, "protocol_error"),
    EngineFault("empty answer", {"answer": "", "tokens": ()}, "protocol_error"),
    EngineFault("ignores max_tokens", {"tokens": ("Paris",) + (" x",) * 200}, "over_length"),
    EngineFault("huge deltas", {"tokens": ("y" * 40_000,) * 3}, "over_length"),
    EngineFault("connection refused", url="refused", error_class="connect_refused"),
    EngineFault("connect times out", url="full_backlog", error_class="connect_timeout"),
    EngineFault("connected, silent", url="silent", error_class="first_token_timeout"),
]


@contextmanager
def engine(fault: EngineFault) -> Iterator[tuple[str, StreamServer | None]]:
    if fault.url == "refused":
        yield closed_port_url(), None
    elif fault.url in ("full_backlog", "silent"):
        with unanswering_port(fault.url) as url:
            yield url, None
    else:
        with StreamServer(answer="Paris") as srv:
            yield srv.url, srv


@pytest.mark.parametrize("fault", ENGINE_FAULTS, ids=lambda f: f.id)
def test_engine_fault(fault: EngineFault, db_path: Path) -> None:
    alerts = Alerts()
    with engine(fault) as (url, srv), Store(db_path, exclusive=True) as store:
        daemon = Daemon(
            settings_for(url, db_path), store, nvml=fakenvml.scenario_basic(), alerts=alerts
        )
        daemon.startup()  # identity is read while the engine is well
        if srv is not None:
            srv.set(**fault.behaviour)
        probe = daemon._guarded("probe", daemon.probe_once)
        try:
            for _ in range(3):
                probe()
            results = store.probes()
            if srv is not None:  # the engine recovers: the daemon goes on probing
                srv.set(
                    fault=None,
                    headers_delay_s=0,
                    first_token_delay_s=0,
                    token_gap_s=0,
                    tokens=None,
                    answer="Paris",
                    reasoning="",
                )
                probe()
        finally:
            daemon.shutdown(timeout_s=2)
        rows = store.probes()
    assert len(results) == 3  # every probe is a row, failed or not
    assert [r["error_class"] for r in results] == [fault.error_class] * 3, [
        r["error_detail"] for r in results
    ]
    assert all(bool(r["ok"]) is (fault.error_class is None) for r in results)
    for r in results:
        detail = r["error_detail"] or ""
        assert "\n" not in detail and "\x1b" not in detail and len(detail) < 2000
        assert len(r["answer"] or "") <= 4096 + 32 * 16
    assert ("probes_failing" in alerts.kinds()) is fault.alert
    if srv is not None:
        assert len(rows) == 4 and rows[-1]["ok"], rows[-1]["error_detail"]
    assert not daemon.should_exit.is_set() or daemon.exit_code == 0


# ---- NVML faults ----------------------------------------------------------------------------


def _nonsense() -> Any:
    gpu = fakenvml.FakeGpu(
        temp_c=-40_000, sm_clock_mhz=0, sm_clock_max_mhz=0, power_mw=2**31, util_gpu_pct=900
    )
    return fakenvml.FakeNvml([gpu])


@dataclass(frozen=True)
class NvmlFault:
    id: str
    make: Callable[[], Any]
    events: tuple[str, ...]  # GPU event kinds recorded (in order, at least these)
    alert: bool
    samples: bool  # GPU rows still written while the fault lasts


NVML_FAULTS = [
    NvmlFault(
        "library missing", fakenvml.scenario_library_missing, ("nvml_unavailable",), False, False
    ),
    NvmlFault(
        "driver not loaded",
        fakenvml.scenario_driver_not_loaded,
        ("nvml_unavailable",),
        False,
        False,
    ),
    NvmlFault("field not supported", fakenvml.scenario_fields_not_supported, (), False, True),
    NvmlFault(
        "gpu lost then back", lambda: fakenvml.scenario_gpu_lost(2, 1), ("gpu_lost",), True, True
    ),
    # Until the stuck call returns, no GPU row is written; the probes go on.
    NvmlFault("hung call", fakenvml.scenario_hung_call, ("nvml_timeout",), True, False),
    NvmlFault("nonsense values", _nonsense, (), False, True),
]


@pytest.mark.parametrize("fault", NVML_FAULTS, ids=lambda f: f.id)
def test_nvml_fault(fault: NvmlFault, db_path: Path) -> None:
    alerts = Alerts()
    clock = FakeClock(1_764_000_000.0)
    nvml = fault.make()
    with StreamServer(answer="Paris") as srv, Store(db_path, exclusive=True) as store:
        daemon = Daemon(
            settings_for(srv.url, db_path), store, nvml=nvml, alerts=alerts, clock=clock
        )
        daemon.startup()
        sample = daemon._guarded("gpu", daemon.sample_gpu)
        probe = daemon._guarded("probe", daemon.probe_once)
        try:
            for _ in range(8):
                sample()
                probe()
                clock.now += 30  # past any re-init backoff
            during = store.gpu_samples()
            release = getattr(nvml, "release", None)
            if release is not None:
                release.set()
                deadline = time.monotonic() + 5
                while daemon.reader.stalled and time.monotonic() < deadline:
                    time.sleep(0.01)
                sample()  # the stuck call has returned: sampling resumes
        finally:
            daemon.shutdown(timeout_s=2)
        events = [e["kind"] for e in store.gpu_events()]
        probes = store.probes()
        after = store.gpu_samples()
    assert len(probes) == 8 and all(p["ok"] for p in probes)  # the probes never stopped
    for kind in fault.events:
        assert kind in events, events
    assert ("telemetry_lost" in alerts.kinds()) is fault.alert
    # Every fault here ends before the run does: what fired has resolved.
    told = {(a.key, a.state) for a in alerts.sent if a.kind == "telemetry_lost"}
    assert {k for k, st in told if st == "firing"} == {k for k, st in told if st == "resolved"}
    assert bool(during) is fault.samples
    assert bool(after) is (fault.samples or fault.id == "hung call")  # resumed once it returned
    for s in after:
        assert s["temp_c"] is None or -300 < s["temp_c"] < 300 or fault.id == "nonsense values"


# ---- storage faults -------------------------------------------------------------------------


def _locked(store: Store, db: Path) -> Callable[[], None]:
    other = sqlite3.connect(db, timeout=0.1, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock

    def undo() -> None:
        other.execute("ROLLBACK")
        other.close()

    return undo


def _full(store: Store, db: Path) -> Callable[[], None]:
    pages = store.rows("PRAGMA page_count")[0]["page_count"]
    store.db.execute(f"PRAGMA max_page_count = {pages}")
    for _ in range(200):  # fill the last pages
        try:
            store.record_probe(probe_result(), None)
        except StoreError:
            break
    return lambda: store.db.execute(f"PRAGMA max_page_count = {pages * 1000}")


@pytest.mark.parametrize("make", [_locked, _full], ids=["locked", "full"])
def test_storage_fault_while_running(make: Callable[..., Any], db_path: Path) -> None:
    alerts = Alerts()
    with StreamServer(answer="Paris") as srv, Store(db_path, busy_timeout_s=0.2) as store:
        daemon = Daemon(
            settings_for(srv.url, db_path), store, nvml=fakenvml.scenario_basic(), alerts=alerts
        )
        daemon.startup()
        probe = daemon._guarded("probe", daemon.probe_once)
        try:
            probe()
            before = len(store.probes())
            undo = make(store, db_path)
            kept = len(store.probes())
            for _ in range(5):
                probe()  # each fails to store; none raises
            undo()
            probe()
        finally:
            daemon.shutdown(timeout_s=2)
        after = len(store.probes())
    assert before >= 1 and after == kept + 1  # nothing committed was lost; writes resumed
    states = [(a.kind, a.state) for a in alerts.sent if a.kind == "storage_failing"]
    assert states == [("storage_failing", "firing"), ("storage_failing", "resolved")]


def test_storage_fault_deleted(db_path: Path) -> None:
    alerts = Alerts()
    with StreamServer(answer="Paris") as srv, Store(db_path, exclusive=True) as store:
        daemon = Daemon(
            settings_for(srv.url, db_path), store, nvml=fakenvml.scenario_basic(), alerts=alerts
        )
        daemon.startup()
        try:
            daemon.probe_once()
            db_path.unlink()
            daemon._guarded("database-file", daemon.check_database_file)()
        finally:
            daemon.shutdown(timeout_s=2)
    assert daemon.exit_code == 1 and "storage_failing" in alerts.kinds()


def test_storage_fault_foreign(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StoreError, match="not an llm-watchdog database"):
        Store(path, exclusive=True)


def test_storage_fault_read_only_folder(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llm_watchdog.cli import cli

    blocker = tmp_path / "state"
    blocker.write_text("")  # where the folder should be, a file: mkdir fails as read-only does
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[storage]\npath = "{blocker / "sub" / "w.db"}"\n[api]\nlisten = ""\n')
    out = CliRunner().invoke(cli, ["--config", str(cfg), "run"], env={}, obj={})
    # A config problem (storage.path points at a place that cannot be a folder): exit 78.
    assert out.exit_code == 78 and "storage.path: cannot create" in out.output
    assert "Traceback" not in out.output


def test_storage_fault_second_writer(db_path: Path) -> None:
    with Store(db_path, exclusive=True):
        with pytest.raises(DatabaseInUse, match=f"pid {os.getpid()}"):
            Store(db_path, exclusive=True)


# ---- control faults -------------------------------------------------------------------------

CONTROL = ControlConfig(target_p95_ms=100.0, default_allowance=8, ceiling=16, lease_s=0.5)


@contextmanager
def control_target(kind: str) -> Iterator[Steer]:
    if kind == "haproxy socket missing":
        yield Steer(CONTROL, HaproxyActuator("/nonexistent/haproxy.sock", "batch", "s1"), _STORE[0])
    elif kind == "gateway down":
        yield gateway_steer(CONTROL, closed_port_url(), "t", _STORE[0])
    elif kind == "gateway times out":
        with unanswering_port("silent") as url:
            yield gateway_steer(CONTROL, url, "t", _STORE[0])
    elif kind == "gateway 5xx":
        with StreamServer(fault="status", status=502) as srv:
            yield gateway_steer(CONTROL, srv.url, "t", _STORE[0])
    elif kind == "gateway 401":
        with (
            StreamServer(answer="ok") as up,
            GatewayServer(
                GatewayConfig(upstream_url=up.url, listen_port=0, control_token="right")
            ) as gw,
        ):
            yield gateway_steer(CONTROL, gw.url, "wrong", _STORE[0])


_STORE: list[Store] = []
CONTROL_FAULTS = [
    "gateway down",
    "gateway times out",
    "gateway 5xx",
    "gateway 401",
    "haproxy socket missing",
]


@pytest.mark.parametrize("kind", CONTROL_FAULTS)
def test_control_fault(kind: str, db_path: Path) -> None:
    with Store(db_path) as store:
        _STORE[:] = [store]
        with control_target(kind) as steer:
            try:
                for _ in range(3):
                    for _ in range(3):
                        steer.canary(probe_result(ttft_ms=400.0))
                    steer.step()  # lives
            finally:
                steer.close()
                _STORE.clear()
        rows = store.rows("SELECT applied, apply_detail FROM control_actions")
    written = [r for r in rows if r["applied"] is not None]
    assert written and all(r["applied"] == 0 for r in written)
    assert all(r["apply_detail"] and "\n" not in r["apply_detail"] for r in written)


def test_control_fault_watchdog_gone_allowance_ends_safe_through_the_lease() -> None:
    import httpx

    with (
        StreamServer(answer="ok") as up,
        GatewayServer(
            GatewayConfig(
                upstream_url=up.url,
                listen_port=0,
                control_token="t",
                batch_default_allowance=8,
                batch_ceiling=16,
            )
        ) as gw,
    ):
        h = {"Authorization": "Bearer t"}
        body = {"allowance": 2, "lease_s": 0.3, "reason": "cut"}
        assert httpx.put(f"{gw.url}/control/classes/batch", json=body, headers=h).status_code == 200
        # The watchdog dies here: nothing renews the lease.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = httpx.get(f"{gw.url}/control").json()["classes"]["batch"]
            if state["allowance"] == 8:
                break
            time.sleep(0.05)
    assert state["allowance"] == 8  # back to the configured default


# ---- process faults -------------------------------------------------------------------------


@pytest.mark.parametrize("jump_s", [-3600.0, 86400.0 * 3], ids=["clock back 1 h", "clock on 3 d"])
def test_process_fault_clock_jump(jump_s: float, db_path: Path) -> None:
    alerts = Alerts()
    clock = FakeClock(1_764_000_000.0)
    with StreamServer(answer="Paris") as srv, Store(db_path, exclusive=True, clock=clock) as store:
        daemon = Daemon(
            settings_for(srv.url, db_path),
            store,
            nvml=fakenvml.scenario_basic(),
            alerts=alerts,
            clock=clock,
        )
        daemon.startup()
        jobs = [
            daemon._guarded(n, f)
            for n, f in (
                ("probe", daemon.probe_once),
                ("gpu", daemon.sample_gpu),
                ("rollup", daemon.rollup),
            )
        ]
        try:
            for i in range(6):
                if i == 3:
                    clock.now += jump_s
                for job in jobs:
                    job()
                clock.now += 10
        finally:
            daemon.shutdown(timeout_s=2)
        probes = store.probes()
    assert len(probes) == 6 and all(p["ok"] for p in probes)
    assert not daemon.storage.failing


@pytest.mark.slow
def test_process_fault_sigterm_mid_probe(tmp_path: Path, db_path: Path) -> None:
    with StreamServer(answer="Paris", first_token_delay_s=0.2, token_gap_s=0.3) as srv:
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[server]\nurl = "{srv.url}"\n[probe]\ninterval = "0.5s"\njitter = "0s"\n'
            f'[storage]\npath = "{db_path}"\n[gpu]\nenabled = false\n[api]\nlisten = ""\n'
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "llm_watchdog", "--config", str(cfg), "run"],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(srv.chat_requests()) < 3:
                time.sleep(0.05)
            time.sleep(0.3)  # inside a probe: its tokens take 1.5 s
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    with Store(db_path, read_only=True) as s:
        assert len(s.probes()) >= 1
        assert s.rows("PRAGMA integrity_check")[0]["integrity_check"] == "ok"


def test_the_matrix_has_at_least_40_rows() -> None:
    rows = (
        len(ENGINE_FAULTS)
        + len(NVML_FAULTS)
        + 2
        + 4  # storage: locked, full; deleted, foreign, read-only folder, second writer
        + len(CONTROL_FAULTS)
        + 1
        + 2
        + 1  # process: two clock jumps, SIGTERM mid-probe
    )
    assert rows >= 40
