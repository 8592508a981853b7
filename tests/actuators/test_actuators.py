"""Actuators against real serving layers: the project's gateway, a control-API server that
does not do what it says, HAProxy started from Debian's package, a generic HTTP endpoint and
a command. Every failure must be one line that says what to do; a verification mismatch must
come out as "control not effective"."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_watchdog.actuators.base import (
    ENV_ALLOWANCE,
    ENV_LEASE_S,
    ENV_REASON,
    ActuatorError,
    ReadBack,
    check,
    not_effective_event,
)
from llm_watchdog.actuators.command import CommandActuator
from llm_watchdog.actuators.gateway import GatewayActuator
from llm_watchdog.actuators.haproxy import HaproxyActuator
from llm_watchdog.actuators.http import HttpActuator, fill
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from tests.helpers.streamserver import StreamServer, closed_port_url

TOKEN = "s3cret-control-token"


# -- a control API that can be told to lie --------------------------------------------------


class ControlServer:
    """GET /control and PUT /control/classes/batch as in docs/gateway.md, on 127.0.0.1 port 0.

    `report` overrides the allowance GET reports (a layer that ignores writes), `inflight`
    is what GET reports as in flight; `puts` records every accepted PUT body.
    """

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.allowance = 4
        self.report: int | None = None
        self.inflight = 0
        self.puts: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/state":  # the shape a generic HttpActuator reads
                    self._send(200, {"limits": {"batch": owner.shown()}, "busy": owner.inflight})
                    return
                shown = owner.shown()
                batch = {
                    "allowance": shown,
                    "inflight": owner.inflight,
                    "queued": 0,
                    "max_queue_wait_s": 30.0,
                    "lease_expires_at": None,
                }
                self._send(200, {"classes": {"batch": batch, "chat": {"allowance": None}}})

            def do_PUT(self) -> None:  # noqa: N802
                if self.headers.get("Authorization") != f"Bearer {owner.token}":
                    self._send(401, {"error": {"message": "missing or wrong control token"}})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.puts.append(body)
                owner.allowance = body["allowance"]
                self._send(200, {"allowance": owner.shown(), "lease_expires_at": 1.0e9})

            do_POST = do_PUT  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def shown(self) -> int:
        return self.allowance if self.report is None else self.report

    def __enter__(self) -> ControlServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def control_server() -> Iterator[ControlServer]:
    with ControlServer() as srv:
        yield srv


# -- the project's gateway ----------------------------------------------------------------


@pytest.fixture
def engine() -> Iterator[StreamServer]:
    with StreamServer(answer="one two three four", first_token_delay_s=0.05) as srv:
        yield srv


@pytest.fixture
def gateway(engine: StreamServer) -> Iterator[GatewayServer]:
    config = GatewayConfig(
        upstream_url=engine.url,
        listen_port=0,
        control_token=TOKEN,
        batch_default_allowance=2,
        batch_ceiling=16,
        max_queue_wait_s=10.0,
        shutdown_timeout_s=1.0,
    )
    with GatewayServer(config) as gw:
        yield gw


def test_gateway_apply_then_read_back_and_verify(gateway: GatewayServer) -> None:
    act = GatewayActuator(gateway.url, TOKEN)
    try:
        res = act.apply(5, 60.0, "chat p95 under target")
        assert res.ok, res.detail
        assert res.lease_s == 60.0 and res.lease_expires_at is not None
        rb = act.read_back()
        assert (rb.allowance, rb.inflight, rb.queued) == (5, 0, 0)
        assert rb.max_queue_wait_s == 10.0
        v = act.verify(5)
        assert v.ok and v.kind == "ok"
        assert act.verify(3).kind == "not_effective"
    finally:
        act.close()


def test_gateway_wrong_token_is_401_and_changes_nothing(gateway: GatewayServer) -> None:
    act = GatewayActuator(gateway.url, "not-the-token")
    try:
        res = act.apply(9, 60.0, "x")
        assert not res.ok
        assert res.detail == (
            f"the gateway at {gateway.url} refused the control token (401): give the daemon "
            "the gateway's token (LLM_WATCHDOG_GATEWAY_TOKEN or its token file)"
        )
        assert act.read_back().allowance == 2  # the default, untouched
    finally:
        act.close()


def test_gateway_rejects_value_over_its_ceiling(gateway: GatewayServer) -> None:
    act = GatewayActuator(gateway.url, TOKEN)
    try:
        res = act.apply(99, 60.0, "x")
        assert not res.ok
        assert res.detail.startswith("the gateway refused allowance 99 (HTTP 400): allowance must")
        assert "[0, 16]" in res.detail
    finally:
        act.close()


def test_gateway_inflight_held_at_allowance_verifies(
    gateway: GatewayServer, engine: StreamServer
) -> None:
    """Two batch streams against an allowance of 1: one runs, one queues; verify() reads
    the behaviour (in-flight 1), not just the flag."""
    engine.set(first_token_delay_s=0.6)
    act = GatewayActuator(gateway.url, TOKEN)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with httpx.Client(timeout=10) as client:
                r = client.post(
                    gateway.url + "/v1/chat/completions",
                    json=body,
                    headers={"X-Traffic-Class": "batch"},
                )
                r.raise_for_status()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        assert act.apply(1, 30.0, "hold batch at one").ok
        threads = [threading.Thread(target=send) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        rb = act.read_back()
        while (rb.inflight, rb.queued) != (1, 1) and time.monotonic() < deadline:
            time.sleep(0.02)
            rb = act.read_back()
        assert (rb.allowance, rb.inflight, rb.queued) == (1, 1, 1)
        assert act.verify(1).ok
        for t in threads:
            t.join(10)
        assert not errors
    finally:
        act.close()


def test_gateway_unreachable_is_one_line() -> None:
    url = closed_port_url()
    act = GatewayActuator(url, TOKEN)
    try:
        res = act.apply(3, 60.0, "x")
        assert not res.ok
        assert res.detail == (
            f"cannot reach {url}/control/classes/batch (connection refused): "
            "is `llm-watchdog gateway` running there?"
        )
        v = act.verify(3)
        assert (v.ok, v.kind) == (False, "unreadable")
        assert v.detail == (
            f"cannot verify the allowance: cannot reach {url}/control (connection refused): "
            "is `llm-watchdog gateway` running there?"
        )
    finally:
        act.close()


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), "(connection refused)"),
        (httpx.ReadTimeout("timed out"), "did not answer PUT in time: is it overloaded or hung?"),
        (
            httpx.RemoteProtocolError("peer closed"),
            "PUT http://gw.test/control/classes/batch failed (RemoteProtocolError: peer closed)",
        ),
    ],
)
def test_gateway_transport_faults_are_mapped(fault: httpx.HTTPError, expected: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise fault

    act = GatewayActuator("http://gw.test", TOKEN, transport=httpx.MockTransport(handler))
    try:
        res = act.apply(2, 60.0, "x")
        assert not res.ok and expected in res.detail
        with pytest.raises(ActuatorError):
            act.read_back()
    finally:
        act.close()


def test_gateway_that_is_not_a_gateway() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>")

    act = GatewayActuator("http://web.test", TOKEN, transport=httpx.MockTransport(handler))
    try:
        with pytest.raises(ActuatorError) as err:
            act.read_back()
        assert str(err.value) == (
            "GET http://web.test/control answered with something that is not JSON (HTTP 200): "
            "is that the right address?"
        )
    finally:
        act.close()


# -- verification against a layer that does not do what it says ---------------------------


def test_layer_ignoring_the_write_is_not_effective(control_server: ControlServer) -> None:
    control_server.report = 8  # accepts every write, keeps doing 8
    act = GatewayActuator(control_server.url, TOKEN)
    try:
        res = act.apply(3, 60.0, "cut")
        assert not res.ok
        assert res.detail == "the gateway accepted the write but reports allowance 8, not 3"
        v = act.verify(3)
        assert (v.ok, v.kind) == (False, "not_effective")
        assert v.detail == (
            f"control not effective: gateway {control_server.url} reports allowance 8, expected 3"
        )
        event = not_effective_event(v, ts=1000.0, target="gateway")
        assert event is not None
        assert (event.kind, event.severity, event.state) == (
            "control_not_effective",
            "critical",
            "firing",
        )
        assert event.message == v.detail
    finally:
        act.close()


def test_inflight_over_allowance_is_not_effective(control_server: ControlServer) -> None:
    act = GatewayActuator(control_server.url, TOKEN)
    try:
        assert act.apply(2, 60.0, "cut").ok
        control_server.inflight = 5  # the flag says 2, the behaviour is 5
        v = act.verify(2)
        assert v.kind == "not_effective"
        assert v.detail == (
            f"control not effective: gateway {control_server.url} has 5 batch requests in "
            "flight, over the allowance 2"
        )
        assert act.verify(2, check_inflight=False).ok  # right after a cut, before draining
    finally:
        act.close()


def test_check_treats_no_limit_as_a_mismatch() -> None:
    v = check("haproxy be/s1", 0, ReadBack(allowance=None, inflight=0))
    assert v.kind == "not_effective"
    assert v.detail == "control not effective: haproxy be/s1 reports no limit, expected 0"
    assert not_effective_event(check("x", 1, ReadBack(1)), ts=0.0, target="x") is None


# -- a generic HTTP endpoint --------------------------------------------------------------


def test_fill_keeps_numbers_numbers() -> None:
    template = {"limit": "{allowance}", "why": "watchdog: {reason}", "ttl": ["{lease_s}"], "k": 1}
    assert fill(template, 3, 60.0, "hot") == {
        "limit": 3,
        "why": "watchdog: hot",
        "ttl": [60.0],
        "k": 1,
    }


def test_http_actuator_template_headers_and_read_back(control_server: ControlServer) -> None:
    act = HttpActuator(
        "POST",
        control_server.url + "/control/classes/batch",
        json_template={"allowance": "{allowance}", "lease_s": "{lease_s}", "reason": "{reason}"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        read_url=control_server.url + "/state",
        read_fields={"allowance": "limits.batch", "inflight": "busy"},
    )
    try:
        res = act.apply(6, 45.0, "grow")
        assert res.ok, res.detail
        assert control_server.puts[-1] == {"allowance": 6, "lease_s": 45.0, "reason": "grow"}
        assert act.read_back() == ReadBack(allowance=6, inflight=0)
        assert act.verify(6).ok
        control_server.report = 1
        assert act.verify(6).kind == "not_effective"
    finally:
        act.close()


def test_http_actuator_failures(control_server: ControlServer) -> None:
    act = HttpActuator(
        "PUT", control_server.url + "/x", json_template={"n": "{allowance}"}, headers={}
    )
    try:
        res = act.apply(1, 10.0, "x")
        assert res.detail == (
            f"PUT {control_server.url}/x refused the credentials (HTTP 401): check the "
            "headers configured for this actuator"
        )
        v = act.verify(1)
        assert (v.ok, v.kind, v.detail) == (
            True,
            "unverified",
            f"PUT {control_server.url}/x: no read-back configured",
        )
    finally:
        act.close()
    bad = HttpActuator(
        "GET",
        control_server.url,
        json_template={},
        read_url=control_server.url + "/state",
        read_fields={"allowance": "limits.nope"},
    )
    try:
        with pytest.raises(ActuatorError) as err:
            bad.read_back()
        assert str(err.value) == (
            f"GET {control_server.url}/state: no 'limits.nope' in the answer "
            "(read_fields.allowance)"
        )
    finally:
        bad.close()


def test_http_actuator_unknown_read_field() -> None:
    with pytest.raises(ValueError) as err:
        HttpActuator(
            "PUT",
            "http://x.test",
            json_template={},
            read_url="http://x.test",
            read_fields={"n": "a"},
        )
    assert str(err.value) == (
        "read_fields: unknown field 'n' (known: allowance, inflight, lease_expires_at, "
        "max_queue_wait_s, queued)"
    )


# -- a command ----------------------------------------------------------------------------


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(body)
    return [sys.executable, str(path)]


def test_command_actuator_passes_the_allowance_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "state.json"
    writer = script(
        tmp_path,
        "set.py",
        (
            "import json, os, sys\n"
            f"json.dump({{k: os.environ[k] for k in {[ENV_ALLOWANCE, ENV_LEASE_S, ENV_REASON]!r}}},"
            f" open({str(out)!r}, 'w'))\n"
        ),
    )
    reader = script(
        tmp_path,
        "get.py",
        (
            "import json\n"
            f"s = json.load(open({str(out)!r}))\n"
            "print(json.dumps({'allowance': int(s['LLM_WATCHDOG_ALLOWANCE']), 'inflight': 1}))\n"
        ),
    )
    act = CommandActuator(writer, read_argv=reader)
    res = act.apply(7, 90.0, "p95 low")
    assert res.ok, res.detail
    assert json.loads(out.read_text()) == {
        ENV_ALLOWANCE: "7",
        ENV_LEASE_S: "90",
        ENV_REASON: "p95 low",
    }
    assert act.read_back() == ReadBack(allowance=7, inflight=1)
    assert act.verify(7).ok
    assert act.verify(2).kind == "not_effective"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "import sys; sys.stderr.write('boom\\nno permission to set\\n'); sys.exit(3)",
            "exited with status 3: no permission to set",
        ),
        ("import time; time.sleep(5)", "did not finish within 0.5 s and was stopped"),
    ],
)
def test_command_actuator_failures(tmp_path: Path, body: str, expected: str) -> None:
    act = CommandActuator(script(tmp_path, "c.py", body), timeout_s=0.5)
    res = act.apply(1, 10.0, "x")
    assert not res.ok
    assert res.detail == f"{sys.executable} {expected}"


def test_command_actuator_missing_program_and_bad_read_back(tmp_path: Path) -> None:
    res = CommandActuator([str(tmp_path / "nope")]).apply(1, 10.0, "x")
    assert res.detail == f"cannot run {tmp_path / 'nope'}: no such program (check the path)"
    act = CommandActuator(["true"], read_argv=script(tmp_path, "r.py", "print('hello')"))
    with pytest.raises(ActuatorError) as err:
        act.read_back()
    assert str(err.value) == (
        f'{sys.executable} must print JSON like {{"allowance": 4, "inflight": 2}}, got \'hello\''
    )


# -- HAProxy, a real process ----------------------------------------------------------------

HAPROXY = shutil.which("haproxy")
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="haproxy is not installed (apt-get install -y haproxy; CI installs it)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlowBackend:
    """An HTTP server whose answers wait until `release` is set: requests stay in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                owner.release.wait(10)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[tuple[str, int, SlowBackend]]:
    """HAProxy with a stats socket in tmp_path and one backend server in front of a slow
    local server. `timeout queue` lives here: HAProxy 2.6 cannot change it at runtime."""
    assert HAPROXY is not None
    backend = SlowBackend()
    sock = tmp_path / "admin.sock"
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        "global\n"
        f"    stats socket {sock} mode 600 level admin\n"
        "defaults\n"
        "    mode http\n"
        "    timeout connect 2s\n"
        "    timeout client 20s\n"
        "    timeout server 20s\n"
        "    timeout queue 10s\n"
        "frontend fe\n"
        f"    bind 127.0.0.1:{port}\n"
        "    default_backend batch\n"
        "backend batch\n"
        f"    server engine 127.0.0.1:{backend.port} maxconn 8\n"
    )
    proc = subprocess.Popen(
        [HAPROXY, "-f", str(cfg), "-db"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"haproxy did not start: {out}")
            time.sleep(0.02)
        yield str(sock), port, backend
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        backend.release.set()
        backend.close()


@needs_haproxy
def test_haproxy_set_maxconn_and_read_back_from_show_stat(
    haproxy: tuple[str, int, SlowBackend],
) -> None:
    sock, _, _ = haproxy
    act = HaproxyActuator(sock, backend="batch", server="engine")
    assert act.read_back().allowance == 8  # from haproxy.cfg
    res = act.apply(3, 60.0, "cut")
    assert res.ok, res.detail
    assert res.lease_s is None and "no lease" in res.detail
    rb = act.read_back()
    assert (rb.allowance, rb.inflight, rb.queued) == (3, 0, 0)
    assert act.verify(3).ok


@needs_haproxy
def test_haproxy_zero_is_maintenance_not_maxconn_zero(
    haproxy: tuple[str, int, SlowBackend],
) -> None:
    """maxconn 0 means no limit in HAProxy: written naively it is caught by verify, and the
    actuator writes allowance 0 as maintenance instead."""
    sock, _, _ = haproxy
    act = HaproxyActuator(sock, backend="batch", server="engine")
    assert act.command("set maxconn server batch/engine 0").strip() == ""
    v = act.verify(0)
    assert v.kind == "not_effective"
    assert v.detail == "control not effective: haproxy batch/engine reports no limit, expected 0"
    assert act.apply(0, 60.0, "hot").ok
    assert act.read_back().allowance == 0
    assert "MAINT" in act.read_back().detail
    assert act.apply(4, 60.0, "cooled").ok
    rb = act.read_back()
    assert rb.allowance == 4 and "MAINT" not in rb.detail


@needs_haproxy
def test_haproxy_holds_inflight_at_maxconn_and_queues_the_rest(
    haproxy: tuple[str, int, SlowBackend],
) -> None:
    sock, port, backend = haproxy
    act = HaproxyActuator(sock, backend="batch", server="engine")
    assert act.apply(2, 60.0, "two at a time").ok
    statuses: list[int] = []

    def send() -> None:
        with httpx.Client(timeout=15) as client:
            statuses.append(client.get(f"http://127.0.0.1:{port}/").status_code)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 5
        rb = act.read_back()
        while (rb.inflight, rb.queued) != (2, 2) and time.monotonic() < deadline:
            time.sleep(0.02)
            rb = act.read_back()
        assert (rb.allowance, rb.inflight, rb.queued) == (2, 2, 2)
        assert act.verify(2).ok
        assert act.verify(1).kind == "not_effective"
    finally:
        backend.release.set()
        for t in threads:
            t.join(15)
    assert sorted(statuses) == [200, 200, 200, 200]


@needs_haproxy
def test_haproxy_errors_are_one_line(haproxy: tuple[str, int, SlowBackend], tmp_path: Path) -> None:
    sock, _, _ = haproxy
    res = HaproxyActuator(sock, backend="batch", server="nope").apply(3, 60.0, "x")
    assert res.detail == (
        "HAProxy has no server batch/nope (No such server.): check the names with "
        "`show servers state`"
    )
    with pytest.raises(ActuatorError) as err:
        HaproxyActuator(sock, backend="other", server="engine").read_back()
    assert str(err.value) == (
        "HAProxy's `show stat` has no server other/engine: check the names with "
        "`show servers state`"
    )
    # The queue cap is configuration only in 2.6: the runtime API says so itself.
    answer = HaproxyActuator(sock, backend="batch", server="engine").command("set timeout queue 3s")
    assert "only supports 'cli'" in answer


def test_haproxy_socket_missing(tmp_path: Path) -> None:
    path = tmp_path / "none.sock"
    res = HaproxyActuator(str(path), backend="b", server="s").apply(1, 60.0, "x")
    assert res.detail == (
        f"no HAProxy stats socket at {path}: is haproxy running with "
        f"`stats socket {path} level admin`?"
    )
    port = free_port()
    res = HaproxyActuator(f"127.0.0.1:{port}", backend="b", server="s").apply(1, 60.0, "x")
    assert res.detail == (
        f"cannot reach HAProxy at 127.0.0.1:{port} (connection refused): is haproxy running "
        f"with `stats socket 127.0.0.1:{port} level admin`?"
    )
