"""sd_notify: messages on a notify socket the test binds, the heartbeat that stops when the
probe loop is wedged, and the daemon's READY / WATCHDOG / STOPPING around its jobs."""

from __future__ import annotations

import json
import threading
import time

import httpx

from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.notify import Heartbeat, Notifier
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.store.db import Store
from tests.helpers.builders import FakeClock
from tests.helpers.notify import NotifySocket


def test_messages_reach_a_path_socket(tmp_path):
    with NotifySocket(tmp_path / "notify") as ns:
        n = Notifier({"NOTIFY_SOCKET": ns.address})
        assert n.ready("probing") and n.stopping()
        ns.wait_for("STOPPING")
        n.close()
    assert ns.all() == [
        {"READY": "1", "STATUS": "probing"},
        {"STOPPING": "1", "STATUS": "stopping"},
    ]


def test_messages_reach_an_abstract_socket():
    with NotifySocket(abstract=True) as ns:
        assert ns.address.startswith("@")
        n = Notifier({"NOTIFY_SOCKET": ns.address})
        assert n.send("WATCHDOG=1")
        ns.wait_for("WATCHDOG")
        n.close()


def test_without_a_socket_nothing_is_sent_and_nothing_fails():
    n = Notifier({})
    assert not n.enabled and not n.ready("x") and n.watchdog_usec is None


def test_a_socket_that_is_gone_is_one_warning_not_an_error(tmp_path, caplog):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert not n.send("WATCHDOG=1") and not n.send("WATCHDOG=1")
    n.close()
    assert sum("cannot notify systemd" in r.message for r in caplog.records) == 1


def test_the_watchdog_interval_is_for_this_process_only():
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_usec == 30_000_000
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_usec is None
    assert Notifier({"WATCHDOG_USEC": "0"}).watchdog_usec is None


def test_the_heartbeat_pings_only_while_the_work_moves(tmp_path):
    clock = FakeClock(100.0)
    with NotifySocket(tmp_path / "notify") as ns:
        env = {"NOTIFY_SOCKET": ns.address, "WATCHDOG_USEC": "10000000"}
        hb = Heartbeat(Notifier(env), stale_s=25.0, clock=clock)
        assert hb.interval_s == 5.0  # half of WatchdogSec, as sd_watchdog_enabled(3) says
        hb.beat()
        clock.now += 20
        assert hb.tick()
        clock.now += 6  # 26 s since the last finished job: the loop is stuck
        assert not hb.tick()
        hb.beat()
        assert hb.tick()
        ns.wait_for("WATCHDOG")
        hb.notifier.close()
    assert hb.pings == 2


class WedgeableEngine:
    """An engine behind an httpx transport: answers until `wedge` is set, then never answers
    a chat request (no timeout can free it: the probe loop is stuck)."""

    def __init__(self) -> None:
        self.wedge = threading.Event()
        self.release = threading.Event()

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/v1/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        if path.endswith("/chat/completions"):
            if self.wedge.is_set():
                self.release.wait(60)
            chunk = {"choices": [{"index": 0, "delta": {"content": "Paris"}}]}
            body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
            return httpx.Response(
                200, content=body.encode(), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(404, json={"error": "no"})


def test_a_wedged_probe_loop_stops_the_watchdog_pings(tmp_path, monkeypatch, db_path):
    engine = WedgeableEngine()
    settings = settings_from_dict(
        {
            "server": {"url": "http://127.0.0.1:9", "launch_command": "engine --test"},
            "probe": {"interval": "0.2s", "jitter": "0s", "total_timeout": "0.2s"},
            "gpu": {"enabled": False},
            "storage": {"path": str(db_path)},
            "api": {"listen": ""},
            "drift": {"enabled": False},
        },
        "test.toml",
    )
    with NotifySocket(tmp_path / "notify") as ns, Store(db_path) as store:
        # WatchdogSec=0.2s: a ping every 0.1 s while probes finish; a probe is stale after
        # 2 intervals + total_timeout = 0.6 s.
        env = {"NOTIFY_SOCKET": ns.address, "WATCHDOG_USEC": "200000"}
        daemon = Daemon(
            settings,
            store,
            transport=httpx.MockTransport(engine.handler),
            notifier=Notifier(env),
        )
        daemon.startup()
        server = threading.Thread(target=daemon.serve, daemon=True)
        server.start()
        try:
            ready = ns.wait_for("READY", timeout_s=10)
            assert "last probe ok" in ready["STATUS"]
            time.sleep(1.0)
            before = ns.count("WATCHDOG")
            assert before >= 5
            engine.wedge.set()
            time.sleep(1.5)  # the wedged probe holds its job; pings stop within 0.6 s
            wedged_at = time.monotonic()
            time.sleep(1.0)
            assert ns.count("WATCHDOG", since=wedged_at) == 0
            assert daemon.heartbeat.due() is False
            engine.wedge.clear()
            engine.release.set()  # the stuck job returns; the loop runs and pings again
            time.sleep(1.5)
            assert ns.count("WATCHDOG", since=wedged_at + 1.0) >= 3
        finally:
            daemon.should_exit.set()
            server.join(5)
            daemon.shutdown(timeout_s=2)
            daemon.notifier.close()
        ns.wait_for("STOPPING", timeout_s=5)
