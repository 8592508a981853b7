"""The daemon's /metrics and /status: prometheus-client text, labels, bounded connections."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

import httpx
import pytest

from llm_watchdog.daemon.api import ApiServer, ProbeMetrics, _write, heat_eta_s
from llm_watchdog.errors import ConfigError
from llm_watchdog.models import GpuSample
from tests.helpers.metrics import families, sample


def status_of(**over: Any) -> dict[str, Any]:
    st: dict[str, Any] = {
        "model": "smollm2",
        "last_probe": {"ts": 1796106856.6, "ok": True},
        "gpus": [
            GpuSample(
                ts=1796106855.25,
                gpu_index=0,
                uuid="GPU-1234",
                temp_c=81.0,
                temp_slowdown_c=87.0,
                sm_clock_mhz=1450.0,
                sm_clock_max_mhz=1980.0,
                throttle_reasons=0x20,
            ).to_dict()
        ],
        "gpu_info": [{"index": 0, "uuid": "GPU-1234", "name": "NVIDIA RTX 4090"}],
        "nvml": True,
        "drift": {
            "baseline": {"ttft_p95_ms": 800.0},
            "recent_p95_ms": 1900.0,
            "learning": {"have": 300, "need": 300},
            "temp_slope_c_per_min": 2.0,
            "open_events": [{"kind": "chat_slowed", "cause": "thermal"}],
        },
        "control": {
            "allowance": 4,
            "inflight": 3,
            "target_p95_ms": 1500.0,
            "actions": {"cut": 2, "hold": 7},
            "not_effective": False,
            "last": {"p95_est_ms": 1700.0},
        },
        "alert_deliveries": {"am": {"ok": 3, "failed": 1}},
    }
    st.update(over)
    return st


@pytest.fixture
def api() -> Any:
    probes = ProbeMetrics()
    state = {"status": status_of()}
    server = ApiServer(
        "127.0.0.1", 0, lambda: state["status"], probes, max_connections=32, hostname="box1"
    ).start()
    server.state = state  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.stop()


def test_metrics_carry_dcgm_and_vllm_labels(api: ApiServer) -> None:
    api.probes.add(True, None, 120.0, False, True, model_name="smollm2", engine="llamacpp")
    api.probes.add(True, None, 40_000.0, False, True, model_name="smollm2", engine="llamacpp")
    api.probes.add(False, "timeout", None, False, None)
    text = httpx.get(api.url + "/metrics", timeout=5).text
    fams = families(text)
    ttft = "llm_watchdog_ttft_seconds"
    labels = {"model_name": "smollm2", "engine": "llamacpp"}
    assert sample(fams, ttft, f"{ttft}_count", **labels) == 2
    assert sample(fams, ttft, f"{ttft}_bucket", le="0.01", **labels) == 0
    assert sample(fams, ttft, f"{ttft}_bucket", le="0.25", **labels) == 1
    assert sample(fams, ttft, f"{ttft}_bucket", le="60.0", **labels) == 2
    temp = "llm_watchdog_gpu_temperature_celsius"
    gpu = {"gpu": "0", "UUID": "GPU-1234", "modelName": "NVIDIA RTX 4090", "Hostname": "box1"}
    assert sample(fams, temp, temp, **gpu) == 81.0
    active = "llm_watchdog_gpu_clock_event_active"
    assert sample(fams, active, active, reason="sw_thermal_slowdown", **gpu) == 1.0
    assert sample(fams, active, active, reason="sw_power_cap", **gpu) == 0.0
    assert sample(fams, "llm_watchdog_build_info", "llm_watchdog_build_info") == 1.0
    assert "process_start_time_seconds" in fams and "python_info" in fams
    probes = "llm_watchdog_probes"
    assert sample(fams, probes, f"{probes}_total", outcome="failed", error="timeout") == 1
    drift = "llm_watchdog_drift_open"
    assert sample(fams, drift, drift, kind="chat_slowed", cause="thermal") == 1
    actions = "llm_watchdog_control_actions"
    assert sample(fams, actions, f"{actions}_total", reason="cut") == 2
    alerts = "llm_watchdog_alert_deliveries"
    assert sample(fams, alerts, f"{alerts}_total", sink="am", outcome="failed") == 1
    # 6 °C to the slowdown threshold at 2 °C a minute: three minutes.
    eta = "llm_watchdog_heat_eta_seconds"
    assert sample(fams, eta, eta) == pytest.approx(180.0)
    target = "llm_watchdog_target_ttft_p95_seconds"
    assert sample(fams, target, target) == 1.5


def test_timestamps_keep_every_digit(api: ApiServer) -> None:
    fams = families(httpx.get(api.url + "/metrics", timeout=5).text)
    last = "llm_watchdog_last_probe_timestamp_seconds"
    assert sample(fams, last, last) == 1796106856.6
    ts = "llm_watchdog_gpu_last_sample_timestamp_seconds"
    assert sample(fams, ts, ts, gpu="0") == 1796106855.25


def test_label_values_are_escaped(api: ApiServer) -> None:
    odd = 'model "x"\\\nnext line'
    api.probes.add(True, None, 100.0, False, True, model_name=odd, engine="vllm")
    fams = families(httpx.get(api.url + "/metrics", timeout=5).text)
    ttft = "llm_watchdog_ttft_seconds"
    assert sample(fams, ttft, f"{ttft}_count", model_name=odd, engine="vllm") == 1


def test_violation_counters_add_up_per_gpu(api: ApiServer) -> None:
    for _ in range(3):
        api.probes.add_gpu(
            [GpuSample(ts=1.0, gpu_index=0, thermal_violation_ms=500.0, power_violation_ms=0.0)]
        )
    fams = families(httpx.get(api.url + "/metrics", timeout=5).text)
    name = "llm_watchdog_gpu_thermal_violation_seconds"
    assert fams[name].type == "counter"
    assert sample(fams, name, f"{name}_total", gpu="0", UUID="GPU-1234") == 1.5


def test_openmetrics_is_served_when_asked(api: ApiServer) -> None:
    r = httpx.get(
        api.url + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        timeout=5,
    )
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


def test_status_is_json_and_unknown_paths_say_where_to_look(api: ApiServer) -> None:
    assert httpx.get(api.url + "/status", timeout=5).json()["control"]["allowance"] == 4
    r = httpx.get(api.url + "/nope", timeout=5)
    assert r.status_code == 404 and "/metrics" in r.text
    assert httpx.post(api.url + "/metrics", timeout=5).status_code == 405


def test_heat_eta_only_while_warming() -> None:
    assert heat_eta_s(80.0, 87.0, 0.0) is None
    assert heat_eta_s(80.0, 87.0, -1.0) is None
    assert heat_eta_s(None, 87.0, 1.0) is None
    assert heat_eta_s(90.0, 87.0, 1.0) == 0.0


def test_two_thousand_idle_connections_take_no_thread_and_a_scrape_gets_through(
    api: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="llm_watchdog")
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(2000):
            idle.append(socket.create_connection(api._sock.getsockname()[:2], timeout=5))
        # Half of them send half a request and stop.
        for s in idle[::2]:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        r = httpx.get(api.url + "/metrics", timeout=10)
        assert r.status_code == 200 and "llm_watchdog_build_info" in r.text
        assert api.open_connections <= api.max_connections
        assert threading.active_count() <= threads_before + 2
    finally:
        for s in idle:
            s.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_clients_that_leave_mid_answer_leave_no_traceback(
    api: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    addr = api._sock.getsockname()[:2]
    for _ in range(200):
        s = socket.create_connection(addr, timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.close()  # a reset, before the answer is read
    assert httpx.get(api.url + "/metrics", timeout=10).status_code == 200
    bad = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def test_an_answer_that_fits_the_socket_leaves_the_connection_idle_at_once() -> None:
    """A write that the kernel takes whole returns without giving up the loop: were it to
    wait there, a burst of quick clients would all count as busy at once and the cap would
    shut a newcomer (a scrape) out with a reset."""

    def at_once(writer: asyncio.StreamWriter, size: int) -> bool:
        """Does writing `size` bytes finish without suspending?"""
        step = _write(writer, 200, "text/plain", b"x" * size, keep=True)
        try:
            step.send(None)
        except StopIteration:
            return True
        finally:
            step.close()
        return False

    async def one_write() -> tuple[bool, bool]:
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=a)
        try:
            # A body bigger than the socket's buffers does wait for the peer to read.
            return at_once(writer, 1000), at_once(writer, 20_000_000)
        finally:
            writer.transport.abort()
            b.close()

    small, big = asyncio.run(one_write())
    assert small
    assert not big


def test_keep_alive_serves_many_requests_on_one_connection(api: ApiServer) -> None:
    with httpx.Client(timeout=5) as client:
        for _ in range(5):
            assert client.get(api.url + "/metrics").status_code == 200
    assert api.open_connections <= 1


def test_a_port_in_use_fails_at_construction() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A ConfigError naming api.listen: the daemon exits 78, which systemd does not restart.
        with pytest.raises(ConfigError, match=r"^api\.listen: cannot listen on"):
            ApiServer("127.0.0.1", port, status_of, ProbeMetrics())


def test_clients_that_send_and_never_read_are_dropped_and_a_scrape_gets_through() -> None:
    """Pipelined requests with no reading fill the socket: each such connection is busy in
    its write, never idle, so it is never closed to make room; the idle timeout drops it."""
    import time

    server = ApiServer(
        "127.0.0.1",
        0,
        lambda: {"x": "y" * 6000},
        ProbeMetrics(),
        max_connections=4,
        idle_timeout_s=1.0,
    ).start()
    addr = server._sock.getsockname()[:2]
    data = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n" * 3000
    stuck = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(addr)
            s.setblocking(False)
            stuck.append(s)
        sent = [0] * len(stuck)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            for i, s in enumerate(stuck):
                try:
                    sent[i] += s.send(data[sent[i] :])
                except OSError:
                    pass
            time.sleep(0.05)
        assert all(n > 0 for n in sent)
        deadline = time.monotonic() + 10
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.open_connections == 0  # all four dropped, none waiting on a reader
        r = httpx.get(server.url + "/status", timeout=5)
        assert r.status_code == 200 and r.json()["x"] == "y" * 6000
    finally:
        for s in stuck:
            s.close()
        server.stop()
