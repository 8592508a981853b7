"""Engine detection and `model = "auto"` over real sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_watchdog.probe.engine import (
    EngineInfo,
    ModelResolveError,
    api_root,
    detect_engine,
    engine_slots,
    models_url,
    resolve_model,
    slots_from_launch,
)
from tests.helpers.streamserver import StreamServer, closed_port_url, unanswering_port

LLAMACPP = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/",
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8000/v1/",
        "  http://127.0.0.1:8000/v1  ",
    ],
)
def test_base_url_with_or_without_v1(url: str) -> None:
    assert api_root(url) == "http://127.0.0.1:8000"
    assert models_url(url) == "http://127.0.0.1:8000/v1/models"
    assert models_url(url, "ollama") == "http://127.0.0.1:8000/api/tags"


def test_base_url_under_a_path_prefix_keeps_it() -> None:
    assert api_root("https://gw.example/llm/v1") == "https://gw.example/llm"


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://host", "http://", ""])
def test_bad_base_url(url: str) -> None:
    with pytest.raises(ValueError, match="must look like http://HOST:PORT"):
        api_root(url)


@pytest.mark.parametrize(
    ("engine", "version"),
    [
        ("llamacpp", "b6000-abc"),
        ("vllm", "0.10.1"),
        ("sglang", "0.4.9"),
        ("tgi", "3.0.1"),
        ("ollama", "0.11.4"),
    ],
)
def test_detects_each_engine_and_its_version(engine: str, version: str) -> None:
    with StreamServer(engine=engine, version=version, model="m-1") as srv:
        info = detect_engine(srv.v1)
    assert (info.engine, info.version, info.models) == (engine, version, ("m-1",))


def test_llamacpp_from_its_real_endpoints() -> None:
    static = {
        "/props": (200, (LLAMACPP / "props.json").read_bytes()),
        "/v1/models": (200, (LLAMACPP / "v1_models.json").read_bytes()),
    }
    with StreamServer(static=static) as srv:
        info = detect_engine(srv.url)
    assert info.engine == "llamacpp"
    assert info.version == "b0-unknown"
    assert info.models == ("smollm2-135m-instruct",)
    assert info.props["total_slots"] == 4
    assert engine_slots(info) == 4  # --parallel: what the controller keeps chat's share of


@pytest.mark.parametrize(("engine", "slots"), [("sglang", 48), ("vllm", None), ("tgi", None)])
def test_engine_slots_where_the_engine_publishes_them(engine: str, slots: int | None) -> None:
    with StreamServer(engine=engine) as srv:
        assert engine_slots(detect_engine(srv.url)) == slots


def test_a_plain_openai_server_is_unknown_with_its_models() -> None:
    with StreamServer(engine="generic", model="gpt-x") as srv:
        info = detect_engine(srv.url)
        paths = [r.path for r in srv.requests]
    assert info == EngineInfo(
        engine="unknown", version="unknown", models=("gpt-x",), props={}, detail=info.detail
    )
    assert info.detail == "no engine-specific endpoint answered"
    assert paths == [
        "/v1/models",
        "/props",
        "/api/version",
        "/info",
        "/get_server_info",
        "/version",
    ]


def test_owned_by_saves_the_other_lookups() -> None:
    with StreamServer(engine="vllm") as srv:
        assert detect_engine(srv.url).engine == "vllm"
        assert [r.path for r in srv.requests] == ["/v1/models", "/version"]


@pytest.mark.parametrize(
    ("engine", "hidden"),
    [
        ("llamacpp", "/props"),
        ("vllm", "/version"),
        ("sglang", "/get_server_info"),
        ("ollama", "/api/version"),
    ],
)
def test_engine_behind_a_proxy_that_passes_only_v1(engine: str, hidden: str) -> None:
    with StreamServer(engine=engine, static={hidden: (404, b"{}")}) as srv:
        info = detect_engine(srv.url)
    assert (info.engine, info.version) == (engine, "unknown")
    assert info.detail == f"{hidden} did not answer"


def test_unreachable_server_is_reported_not_raised() -> None:
    url = closed_port_url()
    info = detect_engine(url)
    assert (info.engine, info.version, info.models) == ("unreachable", "unknown", ())
    assert info.props == {"error": "connection refused"}
    assert info.detail == (
        f"cannot reach {url}/v1/models (connection refused): is the server running? "
        f"try `curl {url}/v1/models`"
    )


def test_silent_server_is_unreachable_after_the_timeout() -> None:
    with unanswering_port("silent") as url:
        info = detect_engine(url, timeout_s=0.2)
    assert info.engine == "unreachable" and info.props == {"error": "timed out"}
    assert info.detail.startswith(f"no answer from {url}/v1/models within 0.2 s")


def test_api_key_is_sent_and_a_rejected_key_is_named() -> None:
    with StreamServer(static={"/v1/models": (401, b'{"error": "bad key"}')}) as srv:
        info = detect_engine(srv.url, api_key="sekret")
        headers = srv.requests[0].headers
    assert headers["authorization"] == "Bearer sekret"
    assert info.engine == "unknown"
    assert info.detail == f"{srv.url}/v1/models answered HTTP 401: check the API key"


def test_resolve_model_takes_the_first_listed() -> None:
    static = {"/v1/models": (200, (LLAMACPP / "v1_models.json").read_bytes())}
    with StreamServer(static=static) as srv:
        assert resolve_model(srv.v1) == "smollm2-135m-instruct"


def test_resolve_model_falls_back_to_ollama_tags() -> None:
    with StreamServer(
        engine="ollama", model="llama3.2:1b", static={"/v1/models": (404, b"{}")}
    ) as srv:
        assert resolve_model(srv.url) == "llama3.2:1b"


def test_resolve_model_errors_are_one_line() -> None:
    url = closed_port_url()
    with pytest.raises(ModelResolveError) as info:
        resolve_model(url)
    assert str(info.value) == (
        f"cannot reach {url}/v1/models (connection refused): is the server running? "
        f"try `curl {url}/v1/models`"
    )
    with StreamServer(static={"/v1/models": (200, b'{"object": "list", "data": []}')}) as srv:
        with pytest.raises(ModelResolveError) as info:
            resolve_model(srv.url)
    assert str(info.value) == (
        f"cannot pick a model automatically: {srv.url}/v1/models lists no model; "
        "set the model name explicitly"
    )


@pytest.mark.parametrize(
    ("engine", "command", "slots"),
    [
        ("vllm", "vllm serve m --max-num-seqs 64 --port 8000", 64),
        ("vllm", "python -m vllm.entrypoints.openai.api_server --max-num-seqs=32", 32),
        ("vllm", "vllm serve m --max_num_seqs 16", 16),
        ("vllm", "vllm serve m --max-num-seqs 8 --max-num-seqs 12", 12),  # the last wins
        ("vllm", "vllm serve m", None),  # its default is not guessed
        ("vllm", "vllm serve m --max-num-seqs lots", None),
        ("vllm", "vllm serve m --max-num-seqs", None),
        ("llamacpp", "llama-server -m m.gguf -np 8", 8),
        ("llamacpp", "llama-server -m m.gguf --parallel 4", 4),
        ("sglang", "python -m sglang.launch_server --max-running-requests 48", 48),
        ("ollama", "ollama serve", None),
        ("vllm", None, None),
        ("vllm", "vllm serve 'unbalanced --max-num-seqs 9", 9),
    ],
)
def test_slots_from_launch(engine: str, command: str | None, slots: int | None) -> None:
    assert slots_from_launch(engine, command) == slots
