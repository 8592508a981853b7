"""GET /control/identity: the gateway names the engine behind it, and the daemon pointed at
the gateway fingerprints that engine, not the gateway."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import httpx

from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.probe.fingerprint import redact_command
from llm_watchdog.store.db import Store
from tests.helpers.streamserver import StreamServer


def test_the_gateway_reports_its_upstreams_identity():
    with (
        StreamServer(engine="vllm", version="0.6.3", model="qwen") as engine,
        GatewayServer(GatewayConfig(upstream_url=engine.url, listen_port=0)) as gw,
    ):
        ident = httpx.get(gw.url + "/control/identity").json()
    assert ident["gateway"] == "llm-watchdog" and ident["upstream"] == engine.url
    assert (ident["engine"], ident["version"], ident["model"]) == ("vllm", "0.6.3", "qwen")
    # The engine here is this test process: its command line, read from /proc.
    assert ident["launch_command_source"] == "process"
    assert ident["launch_command"] == shlex.join(redact_command(list(_own_argv())))


def _own_argv() -> list[str]:
    with open("/proc/self/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def status_after_start(store: Store, db_path: Path, server: dict[str, Any]) -> dict[str, Any]:
    """Start a daemon (no GPU, no API) with these `server` settings; its status, stopped."""
    settings = settings_from_dict(
        {
            "server": server,
            "gpu": {"enabled": False},
            "storage": {"path": str(db_path)},
            "api": {"listen": ""},
        },
        "test.toml",
    )
    daemon = Daemon(settings, store)
    daemon.startup()
    try:
        return daemon.status()
    finally:
        daemon.shutdown(timeout_s=2)


def test_the_daemon_follows_the_gateway_to_the_engine(db_path):
    with (
        StreamServer(engine="vllm", version="0.6.3", model="qwen") as engine,
        GatewayServer(GatewayConfig(upstream_url=engine.url, listen_port=0)) as gw,
        Store(db_path) as store,
    ):
        status = status_after_start(store, db_path, {"url": gw.url})
        fp = store.latest_fingerprint()
    assert fp["engine"] == "vllm" and fp["model"] == "qwen"
    assert fp["extra"]["launch_command_source"] == "gateway: process"
    assert fp["launch_command"] == shlex.join(redact_command(_own_argv()))
    assert status["fingerprint"]["launch_command_source"] == "gateway: process"


def test_a_configured_command_is_redacted_in_the_store_and_on_status(db_path):
    with StreamServer(engine="llamacpp") as engine, Store(db_path) as store:
        server = {"url": engine.url, "launch_command": "llama-server -m m.gguf --api-key sk-SECRET"}
        status = status_after_start(store, db_path, server)
        fp = store.latest_fingerprint()
    assert fp["launch_command"] == "llama-server -m m.gguf --api-key '***'"
    assert fp["extra"]["launch_command_source"] == "config"
    assert "SECRET" not in str(status)
