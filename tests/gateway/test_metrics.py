"""The gateway's /metrics: prometheus-client's ASGI app over the gateway's own registry."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.gateway.observe import MODEL_NAMES_MAX, Observer, model_of
from tests.helpers.metrics import families, sample

TOKEN = "metrics-token"


@pytest.fixture
def gw() -> Iterator[GatewayServer]:
    config = GatewayConfig(
        upstream_url="http://127.0.0.1:9",
        listen_port=0,
        control_token=TOKEN,
        batch_default_allowance=3,
        batch_ceiling=16,
        shutdown_timeout_s=2.0,
    )
    server = GatewayServer(config).start()
    try:
        yield server
    finally:
        server.stop()


def test_lease_expiry_is_exported_to_the_last_digit(gw: GatewayServer) -> None:
    r = httpx.put(
        gw.url + "/control/classes/batch",
        json={"allowance": 2, "lease_s": 600, "reason": "hot"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=5,
    )
    assert r.status_code == 200
    expires = httpx.get(gw.url + "/control", timeout=5).json()["classes"]["batch"][
        "lease_expires_at"
    ]
    fams = families(httpx.get(gw.url + "/metrics", timeout=5).text)
    name = "llm_watchdog_gateway_lease_expires_timestamp_seconds"
    assert sample(fams, name, name, **{"class": "batch"}) == expires
    assert sample(fams, "llm_watchdog_gateway_allowance", "llm_watchdog_gateway_allowance") == 2
    changes = "llm_watchdog_gateway_control_changes"
    assert fams[changes].type == "counter"
    assert sample(fams, changes, f"{changes}_total", **{"class": "batch"}) == 1


def test_gateway_metrics_name_admitting_build_and_process(gw: GatewayServer) -> None:
    fams = families(httpx.get(gw.url + "/metrics", timeout=5).text)
    admitting = "llm_watchdog_gateway_admitting"
    assert sample(fams, admitting, admitting, **{"class": "batch"}) == 3
    assert sample(fams, "llm_watchdog_build_info", "llm_watchdog_build_info") == 1
    assert "process_start_time_seconds" in fams
    ttft = "llm_watchdog_gateway_ttft_seconds"
    assert fams[ttft].type == "histogram"
    les = [s.labels["le"] for s in fams[ttft].samples if s.name.endswith("_bucket")]
    assert les[0] == "0.01" and "60.0" in les


def test_openmetrics_is_negotiated(gw: GatewayServer) -> None:
    r = httpx.get(
        gw.url + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        timeout=5,
    )
    assert r.status_code == 200
    assert r.text.rstrip().endswith("# EOF")


def test_no_lease_is_nan_not_a_number_in_disguise() -> None:
    obs = Observer(["chat", "batch"], 16)
    text = obs.prometheus({"lease_expires_timestamp_seconds": {"batch": None}})
    assert 'llm_watchdog_gateway_lease_expires_timestamp_seconds{class="batch"} NaN' in text
    text = obs.prometheus({"lease_expires_timestamp_seconds": {"batch": 1796106856.6}})
    assert "1.796106856600e+09" not in text and "1.7961068566e+09" in text


def test_model_name_is_the_request_bodys_and_its_values_are_bounded() -> None:
    long_doc = json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}]})[:-1]
    body = (long_doc + ', "model": "Qwen/Qwen2.5-7B"}').encode()
    assert model_of(body) == "Qwen/Qwen2.5-7B"  # after a long document, not only up front
    # Text that only quotes a "model" key inside a message is not the request's model.
    quoted = json.dumps({"messages": [{"role": "user", "content": 'say "model": "evil"'}]})
    assert model_of(quoted.encode()) == "unknown"
    for name in ('a"bé', "back\\slash"):  # escapes in the value are decoded
        assert model_of(json.dumps({"model": name}).encode()) == name
    assert model_of(b"not json at all") == "unknown"
    obs = Observer(["chat"], 16)
    for i in range(MODEL_NAMES_MAX + 10):
        obs["chat"].record_ttft(0.0, 0.05, f"made-up-{i}")
    obs["chat"].record_ttft(0.0, 0.05, "made-up-0")
    fams = families(obs.prometheus({}))
    ttft = "llm_watchdog_gateway_ttft_seconds"
    names = {s.labels["model_name"] for s in fams[ttft].samples if s.name.endswith("_count")}
    assert len(names) == MODEL_NAMES_MAX + 1 and "other" in names
    assert sample(fams, ttft, f"{ttft}_count", model_name="other") == 10
    assert sample(fams, ttft, f"{ttft}_count", model_name="made-up-0") == 2
    obs.engine = "vllm"  # what the upstream's identity said
    fams = families(obs.prometheus({}))
    assert sample(fams, ttft, f"{ttft}_count", model_name="made-up-0", engine="vllm") == 2
