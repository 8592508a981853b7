"""The probe over real sockets: measurements, every error class, keep-alive, cache busting."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_watchdog.config import Settings
from llm_watchdog.models import ERROR_CLASSES, ProbeResult
from llm_watchdog.probe.client import ProbeOptions, Prober
from llm_watchdog.probe.sets import Prompt, load_probe_set
from tests.helpers.streamserver import StreamServer, closed_port_url, unanswering_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PARIS = Prompt(
    "capital-france",
    ({"role": "user", "content": "What is the capital of France? Answer in one word."},),
    expect_any_of=("paris",),
    max_tokens=16,
)
FAST = ProbeOptions(connect_timeout_s=1.0, first_token_timeout_s=1.0, total_timeout_s=2.0)


@pytest.fixture
def srv() -> Iterator[StreamServer]:
    with StreamServer() as server:
        yield server


def probe_once(
    url: str, options: ProbeOptions = FAST, prompt: Prompt = PARIS, **kw: object
) -> ProbeResult:
    with Prober(url, "test-model", options, **kw) as prober:  # type: ignore[arg-type]
        return prober.probe(prompt, "default", now=lambda: 1_700_000_000.5)


# -- what a good probe measures ------------------------------------------------------------


def test_a_good_probe_measures_ttft_tokens_gaps_and_quality(srv: StreamServer) -> None:
    srv.set(first_token_delay_s=0.1, token_gap_s=0.02)
    r = probe_once(srv.v1)
    assert r.ok and r.error_class is None and r.error_detail is None
    assert (r.ts, r.prompt_id, r.probe_set, r.model) == (
        1_700_000_000.5,
        "capital-france",
        "default",
        "test-model",
    )
    assert r.url == f"{srv.url}/v1/chat/completions"
    assert r.answer == "The capital of France is Paris." and r.quality_pass is True
    assert r.output_tokens == 6  # from the usage chunk
    assert r.first_event_ms is not None and r.ttft_ms is not None and r.total_ms is not None
    assert r.first_event_ms < 50  # the role-only chunk comes at once
    assert 100 <= r.ttft_ms < 150
    # The whole stream, not up to the first token: five 20-ms gaps on the server's side. The
    # client's read of the first token can come late by a little on a loaded machine (CI
    # measured 99.5 ms for the five), so with slack.
    assert r.total_ms - r.ttft_ms >= 5 * 20 - 10
    assert r.gap_p50_ms is not None and r.gap_max_ms is not None
    assert 19 <= r.gap_p50_ms < 60 and r.gap_max_ms >= r.gap_p50_ms
    assert (r.cache_mode, r.cache_bust, r.connection) == ("bust", "system_nonce", "fresh")


def test_wrong_answer_is_ok_but_fails_the_quality_gate(srv: StreamServer) -> None:
    srv.set(answer="The capital of France is Lyon.")
    r = probe_once(srv.url)
    assert r.ok and r.quality_pass is False and r.answer == "The capital of France is Lyon."


def test_default_probe_set_round_passes_against_the_server(srv: StreamServer) -> None:
    ps = load_probe_set("default")
    answers = {
        "capital-france": "Paris.",
        "capital-japan": "Tokyo",
        "week-days": "There are 7 days.",
        "dog-legs": "Four legs.",
        "two-plus-two": "4",
    }
    with Prober(srv.url, "test-model", FAST) as prober:
        for p in ps.prompts:
            srv.set(answer=answers[p.id])
            r = prober.probe(p, ps.name)
            assert r.ok and r.quality_pass, (p.id, r)
    bodies = [q.json for q in srv.chat_requests()]
    assert [b["max_tokens"] for b in bodies] == [p.max_tokens for p in ps.prompts]


def test_reasoning_tokens_end_ttft(srv: StreamServer) -> None:
    srv.set(reasoning="Let me think about it", answer="Paris", token_gap_s=0.05)
    r = probe_once(srv.url)
    assert r.ok and r.answer == "Paris" and r.quality_pass
    assert r.ttft_ms is not None and r.total_ms is not None
    assert r.ttft_ms < 50 and r.total_ms > 5 * 50  # first reasoning token, not first content


def test_without_usage_the_token_deltas_are_counted(srv: StreamServer) -> None:
    srv.set(answer="a b c d", usage=False)
    r = probe_once(srv.url)
    assert srv.chat_requests()[0].json["stream_options"] == {"include_usage": True}
    assert r.output_tokens == 4


def test_missing_done_after_a_finish_reason_is_accepted(srv: StreamServer) -> None:
    srv.set(fault="no_done")
    r = probe_once(srv.url)
    assert r.ok and r.quality_pass


def test_keep_alive_connection_is_reused_and_said_so(srv: StreamServer) -> None:
    with Prober(srv.url, "test-model", FAST) as prober:
        results = [prober.probe(PARIS, "default") for _ in range(3)]
    assert [r.connection for r in results] == ["fresh", "reused", "reused"]
    assert [q.reused for q in srv.chat_requests()] == [False, True, True]


def test_api_key_goes_in_the_authorization_header(srv: StreamServer) -> None:
    r = probe_once(srv.url, api_key="sekret")
    assert r.ok
    assert srv.chat_requests()[0].headers["authorization"] == "Bearer sekret"


# -- cache busting: what the server receives -------------------------------------------------


def test_default_bust_puts_a_fresh_nonce_in_a_leading_system_message(srv: StreamServer) -> None:
    with Prober(srv.url, "test-model", FAST) as prober:
        results = [prober.probe(PARIS, "default") for _ in range(2)]
    assert [r.cache_bust for r in results] == ["system_nonce", "system_nonce"]
    bodies = [q.json for q in srv.chat_requests()]
    for body in bodies:
        system, user = body["messages"]
        assert system["role"] == "system" and system["content"].startswith("[")
        assert user == PARIS.messages[0]  # the checked question is untouched
        assert "cache_prompt" not in body
        assert (
            body["model"],
            body["stream"],
            body["temperature"],
            body["seed"],
            body["max_tokens"],
        ) == (
            "test-model",
            True,
            0,
            ProbeOptions.seed,  # the one default, the config's `probe.seed`
            16,
        )
    assert bodies[0]["messages"][0] != bodies[1]["messages"][0]
    assert ProbeOptions.seed == Settings().probe.seed == 1234


def test_bust_on_llamacpp_uses_its_own_switch_and_keeps_the_prompt(srv: StreamServer) -> None:
    r = probe_once(srv.url, ProbeOptions(engine="llamacpp", seed=7))
    assert r.cache_bust == "cache_prompt_false"
    body = srv.chat_requests()[0].json
    assert body["cache_prompt"] is False
    assert body["messages"] == list(PARIS.messages)
    assert body["seed"] == 7


def test_cached_mode_sends_the_prompt_as_it_is(srv: StreamServer) -> None:
    r = probe_once(srv.url, ProbeOptions(cache_mode="cached", engine="llamacpp"))
    assert (r.cache_mode, r.cache_bust) == ("cached", "none")
    body = srv.chat_requests()[0].json
    assert body["messages"] == list(PARIS.messages) and "cache_prompt" not in body


def test_nonce_goes_into_an_existing_system_message(srv: StreamServer) -> None:
    prompt = Prompt(
        "sys",
        (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
        ),
        expect_any_of=("paris",),
    )
    probe_once(srv.url, prompt=prompt)
    system, user = srv.chat_requests()[0].json["messages"]
    assert system["role"] == "system" and system["content"].endswith("] Be brief.")
    assert user == {"role": "user", "content": "Capital of France?"}


# -- Ollama's native API -----------------------------------------------------------------------


def test_ollama_native_stream_and_load_duration() -> None:
    with StreamServer(
        engine="ollama", model="llama3.2", load_duration_ms=1234.5, first_token_delay_s=0.05
    ) as srv:
        r = probe_once(
            srv.url, ProbeOptions(api="ollama", first_token_timeout_s=1, total_timeout_s=2, seed=3)
        )
        body = srv.chat_requests()[0]
    assert r.ok and r.quality_pass and r.answer == "The capital of France is Paris."
    assert r.url == f"{srv.url}/api/chat" and body.path == "/api/chat"
    assert r.load_duration_ms == pytest.approx(1234.5)
    assert r.output_tokens == 6
    assert r.ttft_ms is not None and r.ttft_ms >= 50
    assert body.json["options"] == {"temperature": 0, "seed": 3, "num_predict": 16}
    assert body.json["stream"] is True and body.json["messages"][0]["role"] == "system"


# -- every error class, over real sockets --------------------------------------------------------


def test_connect_refused_says_what_to_try() -> None:
    url = closed_port_url()
    r = probe_once(url + "/v1")
    assert (r.ok, r.error_class, r.quality_pass, r.ttft_ms) == (
        False,
        "connect_refused",
        None,
        None,
    )
    assert r.error_detail == (
        f"cannot reach {url}/v1 (connection refused): is the server running? "
        f"try `curl {url}/v1/models`"
    )


def test_connect_timeout() -> None:
    with unanswering_port("full_backlog") as url:
        t = time.monotonic()
        r = probe_once(url, ProbeOptions(connect_timeout_s=0.3))
        elapsed = time.monotonic() - t
    assert r.error_class == "connect_timeout"
    assert r.error_detail == (
        f"cannot reach {url}/v1 (no connection within 0.3 s, connect_timeout_s): is the host "
        f"and port right and reachable? try `curl -m 5 {url}/v1/models`"
    )
    assert elapsed < 2


@pytest.mark.parametrize(
    ("behaviour", "detail_start"),
    [
        ({"fault": "hang"}, "no response from"),
        ({"headers_delay_s": 5.0}, "no response from"),
        ({"fault": "keepalive_forever", "keepalive_every_s": 0.02}, "no token from"),
        ({"first_token_delay_s": 5.0}, "no token from"),
    ],
    ids=["hang-before-headers", "slow-headers", "keepalive-comments-only", "slow-first-token"],
)
def test_first_token_timeout_fires_on_time(
    srv: StreamServer, behaviour: dict[str, object], detail_start: str
) -> None:
    srv.set(**behaviour)
    t = time.monotonic()
    r = probe_once(srv.url, ProbeOptions(first_token_timeout_s=0.4, total_timeout_s=3.0))
    elapsed = time.monotonic() - t
    assert r.error_class == "first_token_timeout" and r.ttft_ms is None
    assert r.connection == "fresh"
    assert r.error_detail is not None and r.error_detail.startswith(detail_start)
    assert "0.4 s (first_token_timeout_s)" in r.error_detail
    assert 0.39 <= elapsed < 1.2
    # How long it waited, before or after the response began: chat's TTFT was longer.
    assert r.total_ms is not None and 390 <= r.total_ms <= elapsed * 1000


def test_timeout_on_a_kept_alive_connection_says_reused(srv: StreamServer) -> None:
    with Prober(srv.url, "test-model", ProbeOptions(first_token_timeout_s=0.3)) as prober:
        assert prober.probe(PARIS, "default").ok
        srv.set(fault="hang")
        r = prober.probe(PARIS, "default")
    assert (r.error_class, r.connection) == ("first_token_timeout", "reused")


def test_keepalive_comments_do_not_count_as_tokens_but_events_do(srv: StreamServer) -> None:
    srv.set(fault="keepalive_forever", keepalive_every_s=0.02)
    r = probe_once(srv.url, ProbeOptions(first_token_timeout_s=0.3))
    assert r.error_class == "first_token_timeout"
    assert r.first_event_ms is not None and r.first_event_ms < 100  # the role-only chunk


def test_total_timeout_keeps_what_was_measured(srv: StreamServer) -> None:
    srv.set(answer=" ".join(["word"] * 40), token_gap_s=0.05)
    t = time.monotonic()
    r = probe_once(srv.url, ProbeOptions(first_token_timeout_s=1.0, total_timeout_s=0.5))
    elapsed = time.monotonic() - t
    assert r.error_class == "total_timeout" and not r.ok
    assert r.ttft_ms is not None and r.ttft_ms < 100
    assert r.output_tokens is not None and 3 <= r.output_tokens < 40
    assert (
        r.error_detail is not None
        and "not finished within 0.5 s (total_timeout_s)" in r.error_detail
    )
    assert 0.49 <= elapsed < 1.3


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (
            500,
            b'{"error": {"code": 500, "message": "model crashed", "type": "server_error"}}',
            "model crashed (server_error)",
        ),
        (
            400,
            (FIXTURES / "llamacpp" / "error_bad_request.txt").read_bytes().splitlines()[0],
            "Expected 'messages' to be an array (invalid_request_error)",
        ),
        (
            404,
            (FIXTURES / "vllm" / "error_model_not_found.json").read_bytes(),
            "The model `gpt-4` does not exist. (NotFoundError)",
        ),
        (422, b'{"detail": "max_tokens must be at least 1"}', "max_tokens must be at least 1"),
        (401, b"Unauthorized", "Unauthorized"),
        (503, b"", "(empty body)"),
    ],
    ids=["500-json", "400-llamacpp", "404-vllm", "422-detail", "401-text", "503-empty"],
)
def test_http_status_names_the_servers_message(
    srv: StreamServer, status: int, body: bytes, message: str
) -> None:
    srv.set(static={"/v1/chat/completions": (status, body)})
    r = probe_once(srv.url)
    assert (r.ok, r.error_class, r.http_status) == (False, "http_status", status)
    assert r.error_detail is not None
    assert r.error_detail.startswith(
        f"HTTP {status} from {srv.url}/v1/chat/completions: {message}; "
    )


def test_http_status_hints(srv: StreamServer) -> None:
    hints = {
        401: "check the API key",
        404: "try `curl",
        503: "overloaded or still loading",
        500: "check its log",
    }
    for status, hint in hints.items():
        srv.set(fault="status", status=status)
        r = probe_once(srv.url)
        assert r.error_detail is not None and hint in r.error_detail, status


def test_server_error_event_inside_a_200_stream(srv: StreamServer) -> None:
    srv.set(fault="error_mid_stream", fault_after_tokens=2)
    r = probe_once(srv.url)
    assert (r.ok, r.error_class, r.http_status) == (False, "server_error", None)
    assert (
        r.error_detail is not None and "CUDA out of memory (InternalServerError)" in r.error_detail
    )
    assert r.ttft_ms is not None and r.answer == "The capital" and r.quality_pass is None


@pytest.mark.parametrize(
    ("behaviour", "detail_part"),
    [
        ({"fault": "garbage"}, "unparseable line (data is not JSON: <html>502 Bad Gateway</html>)"),
        ({"fault": "cut", "fault_after_tokens": 2}, "lost mid-stream after 2 tokens"),
        ({"fault": "not_streaming"}, "answered application/json, not a stream"),
        ({"answer": "", "tokens": []}, "finished the stream without any token"),
        ({"fault": "drop"}, "closed a new connection without answering"),
    ],
    ids=["garbage-line", "cut-mid-stream", "not-streaming", "no-tokens", "dropped-fresh"],
)
def test_protocol_errors(srv: StreamServer, behaviour: dict[str, object], detail_part: str) -> None:
    srv.set(**behaviour)
    r = probe_once(srv.url)
    assert (r.ok, r.error_class) == (False, "protocol_error")
    assert r.error_detail is not None and detail_part in r.error_detail


def test_garbage_line_keeps_the_timings(srv: StreamServer) -> None:
    srv.set(fault="garbage", first_token_delay_s=0.05)
    r = probe_once(srv.url)
    assert r.error_class == "protocol_error" and r.ttft_ms is not None and r.ttft_ms >= 50
    assert r.answer == "The capital of France is Paris."


def test_stale_keepalive_connection_is_retried_once_on_a_fresh_one(srv: StreamServer) -> None:
    with Prober(srv.url, "test-model", FAST) as prober:
        first = prober.probe(PARIS, "default")
        srv.set(fault="drop_reused")
        second = prober.probe(PARIS, "default")
    assert (first.ok, first.connection) == (True, "fresh")
    assert (second.ok, second.connection, second.quality_pass) == (True, "retried_stale", True)
    assert [q.reused for q in srv.chat_requests()] == [False, True, False]


def test_server_closing_idle_connections_like_llamacpp_is_no_failure(srv: StreamServer) -> None:
    srv.set(idle_close_s=0.1)
    with Prober(srv.url, "test-model", FAST) as prober:
        first = prober.probe(PARIS, "default")
        time.sleep(0.3)  # the server has closed the idle connection by now
        second = prober.probe(PARIS, "default")
    assert (first.ok, second.ok) == (True, True)
    assert second.connection in ("fresh", "retried_stale")
    assert [q.reused for q in srv.chat_requests()][-1] is False


def test_stale_connection_whose_retry_also_dies(srv: StreamServer) -> None:
    with Prober(srv.url, "test-model", FAST) as prober:
        assert prober.probe(PARIS, "default").ok
        srv.set(fault="drop")
        r = prober.probe(PARIS, "default")
    assert (r.ok, r.error_class, r.connection) == (False, "stale_connection", "retried_stale")
    assert (
        r.error_detail is not None
        and "closed a kept-alive connection without answering" in r.error_detail
    )
    assert len(srv.chat_requests()) == 3


def test_server_gone_between_probes_is_connect_refused() -> None:
    server = StreamServer().start()
    with Prober(server.url, "test-model", FAST) as prober:
        assert prober.probe(PARIS, "default").ok
        server.close()
        r = prober.probe(PARIS, "default")
    assert r.error_class == "connect_refused"


def test_every_error_class_is_known() -> None:
    # the classes this file and test_bounds.py produce over real sockets, all of them from
    # the shared list
    produced = {
        "over_length",
        "connect_refused",
        "connect_timeout",
        "first_token_timeout",
        "total_timeout",
        "http_status",
        "protocol_error",
        "server_error",
        "stale_connection",
    }
    assert produced == set(ERROR_CLASSES)


def test_no_exception_escapes_a_probe() -> None:
    def explode(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("transport bug")

    r = probe_once("http://127.0.0.1:9", transport=httpx.MockTransport(explode))
    assert (r.ok, r.error_class) == (False, "protocol_error")
    assert r.error_detail is not None and "unexpected RuntimeError" in r.error_detail


def test_mock_transport_stream_is_parsed_too() -> None:
    body = (FIXTURES / "vllm" / "chat_stream_usage.sse").read_bytes()

    def answer(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    r = probe_once("http://engine.test/v1", transport=httpx.MockTransport(answer))
    assert r.ok and r.quality_pass and r.output_tokens == 8


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"connect_timeout_s": 0},
            "probe option connect_timeout_s must be a positive number, got 0",
        ),
        ({"total_timeout_s": -1.0}, "probe option total_timeout_s must be a positive number"),
        (
            {"cache_mode": "never"},
            "probe option cache_mode must be 'bust' or 'cached', got 'never'",
        ),
        ({"api": "grpc"}, "probe option api must be 'openai' or 'ollama', got 'grpc'"),
    ],
)
def test_probe_options_are_checked(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        ProbeOptions(**kw)  # type: ignore[arg-type]
    assert str(info.value).startswith(message)


def test_bad_base_url_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="must look like http://HOST:PORT"):
        Prober("localhost:8000", "m")
