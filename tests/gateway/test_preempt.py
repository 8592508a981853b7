"""Pre-emption (`preempt_batch`, `--preempt-batch`) over real sockets: a cut of the batch
allowance under what runs ends the newest batch requests in flight, tells their clients to
retry, closes their engine connections, and gives each place back once. Chat is never
pre-empted, and without the setting a cut ends nothing.

Streams are started one after another, each once its first event is out, so the order in
which they were admitted is the order of the list."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from click.testing import CliRunner

from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.gateway import cli as gateway_cli
from llm_watchdog.gateway.admission import Allowance, ClassGate
from tests.gateway.test_direct import Reader, connect, post
from tests.gateway.test_gateway import (
    CHAT_URL,
    FakeEngine,
    batch_state,
    chat_body,
    control,
    gateways,
    put_batch,
    wait_for,
)
from tests.helpers.metrics import families, sample


@pytest.fixture
def make_gateway(engine: FakeEngine) -> Iterator[Callable[..., GatewayServer]]:
    with gateways(
        engine,
        preempt_batch=True,
        batch_ramp_per_s=0.0,
        max_queue_wait_s=10.0,
        shutdown_timeout_s=2.0,
    ) as make:
        yield make


class Stream:
    """One streaming request on its own connection, held by the engine after its first
    event until the test releases `hold`."""

    def __init__(self, gw: GatewayServer, hold: str, cls: str = "batch") -> None:
        self.hold = hold
        self.sock = connect(gw)
        headers = {"X-Traffic-Class": cls, "X-Test-Hold": hold}
        self.sock.sendall(post(CHAT_URL, chat_body(), headers))
        self.reader = Reader(self.sock)
        self.reader.read_until(lambda r: bool(r.answers) and b"data: " in r.answers[0].body)

    def read_to_end(self) -> Stream:
        """Until the answer is complete or the gateway closes the connection."""
        self.reader.read_until(lambda r: r.closed or r.answers[0].complete)
        return self

    @property
    def body(self) -> bytes:
        return self.reader.answers[0].body

    @property
    def complete(self) -> bool:
        return self.reader.answers[0].complete

    def close(self) -> None:
        self.sock.close()


def last_event(body: bytes) -> Any:
    events = [e for e in body.split(b"\n\n") if e.strip()]
    assert events[-1].startswith(b"data: "), events[-1]
    return json.loads(events[-1][len(b"data: ") :])


def assert_preempted_stream(stream: Stream) -> None:
    stream.read_to_end()
    assert stream.reader.answers[0].status == 200  # the headers were out before the cut
    error = last_event(stream.body)["error"]
    assert (error["type"], error["code"]) == ("preempted", 503)
    assert "pre-empted" in error["message"] and "retry" in error["message"]
    assert b"[DONE]" not in stream.body
    assert not stream.complete  # the chunked body is left unfinished: the client sees an error
    assert stream.reader.closed


def assert_finished_stream(stream: Stream) -> None:
    stream.read_to_end()
    assert stream.complete
    assert stream.body.endswith(b"data: [DONE]\n\n")
    assert b"preempted" not in stream.body


def engine_outcome(engine: FakeEngine, hold: str) -> str:
    (seen,) = [s for s in engine.seen if s.headers.get("x-test-hold") == hold]
    return seen.outcome


def cut(http: httpx.Client, gw: GatewayServer, allowance: int, **extra: Any) -> dict[str, Any]:
    response = put_batch(http, gw, {"allowance": allowance, "reason": "chat burst", **extra})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


# -- streams mid-answer --------------------------------------------------------------------


def test_a_cut_ends_the_newest_batch_streams_and_the_oldest_runs_to_its_end(
    engine: FakeEngine,
    make_gateway: Callable[..., GatewayServer],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = make_gateway(batch_default_allowance=4)
    streams = [Stream(gw, f"b{i}") for i in range(4)]
    try:
        assert batch_state(http, gw)["inflight"] == 4
        with caplog.at_level("INFO", logger="llm_watchdog.gateway"):
            state = cut(http, gw, 1)
        # The PUT's own answer already shows the cut in force.
        assert (state["inflight"], state["preempted"], state["preempt"]) == (1, 3, True)
        for stream in streams[1:]:
            assert_preempted_stream(stream)
        for stream in streams[1:]:
            wait_for(
                lambda s=stream: engine_outcome(engine, s.hold) == "cancelled",  # type: ignore[misc]
                what=f"engine saw {stream.hold}'s connection closed",
            )
        assert engine_outcome(engine, "b0") == "open"
        for stream in streams:
            engine.release(stream.hold)
        assert_finished_stream(streams[0])
    finally:
        for stream in streams:
            stream.close()
    wait_for(lambda: engine_outcome(engine, "b0") == "completed", what="b0 completed")
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="the last place given back")
    state = batch_state(http, gw)
    assert (state["preempted"], state["observed"]["preempted_total"]) == (3, 3)
    assert state["observed"]["ok_total"] == 1
    lines = [r.getMessage() for r in caplog.records if "pre-empted" in r.getMessage()]
    assert lines == ["pre-empted 3 batch requests: allowance 1, in flight 4"]
    fams = families(http.get(gw.url + "/metrics").text)
    preempted = "llm_watchdog_gateway_preempted"
    assert sample(fams, preempted, f"{preempted}_total", **{"class": "batch"}) == 3
    requests = "llm_watchdog_gateway_requests"
    assert (
        sample(fams, requests, f"{requests}_total", outcome="preempted", **{"class": "batch"}) == 3
    )


def test_without_preempt_batch_a_cut_ends_nothing(engine: FakeEngine, http: httpx.Client) -> None:
    with gateways(engine, batch_default_allowance=4, batch_ramp_per_s=0.0) as make:
        gw = make()  # preempt_batch left at its default
        streams = [Stream(gw, f"b{i}") for i in range(4)]
        try:
            state = cut(http, gw, 1)
            assert (state["inflight"], state["preempted"], state["preempt"]) == (4, 0, False)
            for stream in streams:
                engine.release(stream.hold)
            for stream in streams:
                assert_finished_stream(stream)
        finally:
            for stream in streams:
                stream.close()
        wait_for(lambda: engine.count("completed") == 4, what="all four completed")
        wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="places given back")
        assert batch_state(http, gw)["observed"]["ok_total"] == 4


# -- before the headers --------------------------------------------------------------------


def test_a_request_preempted_before_its_headers_gets_503_with_retry_after(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1)
    with connect(gw) as sock:
        # The engine holds it in "prefill": no status line yet.
        headers = {"X-Traffic-Class": "batch", "X-Test-Hold-Prefill": "p"}
        sock.sendall(post(CHAT_URL, chat_body(), headers))
        wait_for(lambda: engine.count("open") == 1, what="the request at the engine")
        state = cut(http, gw, 0, lease_s=30)
        assert (state["inflight"], state["preempted"]) == (0, 1)
        answer = Reader(sock).read_answers(1)[0]
        assert answer.status == 503
        # Paused under a lease: a retry would only wait in line, so it is told the lease's end.
        assert answer.headers[b"retry-after"] == b"30"
        assert answer.headers[b"content-type"] == b"application/json"
        error = json.loads(answer.body)["error"]
        assert (error["type"], error["code"]) == ("preempted", 503)
        assert error["message"] == (
            "batch request pre-empted for chat (batch allowance cut to 0): retry after 30 s"
        )
        # The client's connection stays usable: the next request on it is answered.
        sock.sendall(post(CHAT_URL, chat_body(stream=False)))
        assert Reader(sock).read_answers(1)[0].status == 200
    wait_for(lambda: engine.seen[0].outcome == "cancelled", what="engine saw the close")
    engine.release("p")


def test_without_a_lease_retry_after_is_one_second(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2)
    with connect(gw) as first, connect(gw) as second:
        headers = {"X-Traffic-Class": "batch", "X-Test-Hold-Prefill": "p"}
        first.sendall(post(CHAT_URL, chat_body(), headers))
        wait_for(lambda: engine.count("open") == 1, what="the first at the engine")
        second.sendall(post(CHAT_URL, chat_body(), headers))
        wait_for(lambda: engine.count("open") == 2, what="the second at the engine")
        cut(http, gw, 1)
        answer = Reader(second).read_answers(1)[0]  # the newer one
        assert (answer.status, answer.headers[b"retry-after"]) == (503, b"1")
        wait_for(lambda: engine.count("cancelled") == 1, what="engine saw the newer one go")
        engine.release("p")
        kept = Reader(first).read_answers(1)[0]
        assert kept.status == 200 and kept.body.endswith(b"data: [DONE]\n\n")


# -- chat ------------------------------------------------------------------------------------


def test_chat_in_flight_is_never_preempted(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2)
    # Chat comes last: the newest requests in flight are chat's, and still only batch ends.
    streams = [
        Stream(gw, "b0"),
        Stream(gw, "b1"),
        Stream(gw, "c0", "chat"),
        Stream(gw, "c1", "chat"),
    ]
    try:
        state = cut(http, gw, 0)
        assert (state["inflight"], state["preempted"]) == (0, 2)
        classes = control(http, gw)["classes"]
        assert (classes["chat"]["inflight"], classes["chat"]["preempted"]) == (2, 0)
        assert classes["chat"]["preempt"] is False
        for stream in streams[:2]:
            assert_preempted_stream(stream)
        for stream in streams:
            engine.release(stream.hold)
        for stream in streams[2:]:
            assert_finished_stream(stream)
    finally:
        for stream in streams:
            stream.close()
    # The engine marks a stream completed after its last write, so the client can have read
    # [DONE] before the engine's thread records it: wait until no outcome is left open.
    holds = ("b0", "b1", "c0", "c1")
    wait_for(
        lambda: all(engine_outcome(engine, h) != "open" for h in holds),
        what="every engine stream settled",
    )
    assert [engine_outcome(engine, h) for h in holds] == [
        "cancelled",
        "cancelled",
        "completed",
        "completed",
    ]
    chat = control(http, gw)["classes"]["chat"]
    assert (chat["inflight"], chat["observed"]["ok_total"]) == (0, 2)


# -- accounting ------------------------------------------------------------------------------


def test_places_are_given_back_once_and_the_new_allowance_holds_after(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=3)
    streams = [Stream(gw, f"b{i}") for i in range(3)]
    later: list[socket.socket] = []
    try:
        assert cut(http, gw, 1)["preempted"] == 2
        for stream in streams[1:]:
            assert_preempted_stream(stream)
        wait_for(lambda: engine.count("cancelled") == 2, what="two engine connections closed")
        # A place given back twice would let these in at once; with one left, both wait.
        for _ in range(2):
            sock = connect(gw)
            later.append(sock)
            sock.sendall(post(CHAT_URL, chat_body(), {"X-Traffic-Class": "batch"}))
        wait_for(lambda: batch_state(http, gw)["queued"] == 2, what="both new ones in line")
        state = batch_state(http, gw)
        assert (state["inflight"], state["queued"]) == (1, 2)
        # A raise lets exactly one more in.
        state = cut(http, gw, 2)
        assert (state["inflight"], state["queued"], state["preempted"]) == (2, 1, 2)
        engine.release("b0")
        assert_finished_stream(streams[0])
        for sock in later:
            answer = Reader(sock).read_answers(1)[0]
            assert answer.status == 200 and answer.body.endswith(b"data: [DONE]\n\n")
    finally:
        for stream in streams:
            stream.close()
        for sock in later:
            sock.close()
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="every place given back")
    state = batch_state(http, gw)
    assert (state["inflight"], state["queued"], state["preempted"]) == (0, 0, 2)
    assert (state["observed"]["ok_total"], state["observed"]["preempted_total"]) == (3, 2)
    assert state["observed"]["disconnected_total"] == 0  # a pre-empted one is not counted twice


def test_a_lease_that_ends_in_a_cut_preempts(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=1)
    assert cut(http, gw, 3, lease_s=0.5)["allowance"] == 3
    streams = [Stream(gw, f"b{i}") for i in range(3)]
    try:
        wait_for(lambda: batch_state(http, gw)["preempted"] == 2, what="lease ran out")
        for stream in streams[1:]:
            assert_preempted_stream(stream)
        assert batch_state(http, gw)["inflight"] == 1
        engine.release("b0")
        assert_finished_stream(streams[0])
    finally:
        for stream in streams:
            stream.close()
    wait_for(lambda: batch_state(http, gw)["inflight"] == 0, what="every place given back")


class Holder:
    def __init__(self) -> None:
        self.ended = False

    def preempt(self) -> None:
        self.ended = True


def test_a_waiter_granted_and_preempted_before_it_runs_gives_its_place_back_once() -> None:
    async def main() -> None:
        gate = ClassGate("batch", Allowance(1, 4), max_queue_wait_s=5.0, max_queued=10)
        first, second = Holder(), Holder()
        assert await gate.acquire(first) == "admitted"
        waiter = asyncio.ensure_future(gate.acquire(second))
        await asyncio.sleep(0)
        gate.release(first)  # grants the waiter's place; the waiter has not run since
        assert gate.inflight == 1
        assert gate.preempt(0) == 1
        assert (second.ended, first.ended, gate.inflight) == (True, False, 0)
        waiter.cancel()  # what a pre-empted request does with a task still waiting
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.release(second)  # and what a late release does
        assert gate.inflight == 0
        assert gate.preempt(0) == 0

    asyncio.run(main())


# -- what an OpenAI client sees ----------------------------------------------------------------


def test_the_openai_library_raises_on_both_kinds_of_preemption(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-x", max_retries=0)
    errors: dict[str, BaseException] = {}
    started = threading.Event()

    def streaming() -> None:
        try:
            stream = client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"X-Traffic-Class": "batch", "X-Test-Hold": "s"},
            )
            for _ in stream:
                started.set()
        except BaseException as exc:  # noqa: B036 - reported to the test
            errors["stream"] = exc
        finally:
            started.set()

    def waiting() -> None:
        try:
            client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Traffic-Class": "batch", "X-Test-Hold-Prefill": "p"},
            )
        except BaseException as exc:  # noqa: B036 - reported to the test
            errors["whole"] = exc

    threads = [threading.Thread(target=streaming)]
    threads[0].start()
    assert started.wait(10)
    threads.append(threading.Thread(target=waiting))
    threads[1].start()
    wait_for(lambda: engine.count("open") == 2, what="both at the engine")
    assert cut(http, gw, 0)["preempted"] == 2
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    wait_for(lambda: engine.count("cancelled") == 2, what="both engine connections closed")
    engine.release("s")
    engine.release("p")
    stream_error = errors["stream"]
    assert isinstance(stream_error, openai.APIError)
    assert isinstance(stream_error.body, dict) and stream_error.body["type"] == "preempted"
    whole_error = errors["whole"]
    assert isinstance(whole_error, openai.InternalServerError)
    assert whole_error.status_code == 503
    assert whole_error.response.headers["retry-after"] == "1"


# -- the ASGI path ---------------------------------------------------------------------------


def test_requests_on_the_asgi_path_are_preempted_too(
    engine: FakeEngine, make_gateway: Callable[..., GatewayServer], http: httpx.Client
) -> None:
    gw = make_gateway(batch_default_allowance=2)
    raw = json.dumps(chat_body()).encode()

    def http10(headers: bytes) -> bytes:
        # HTTP/1.0 is left to uvicorn's request cycle and proxy.py (protocol.py).
        return (
            b"POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"x-traffic-class: batch\r\n" + headers + b"content-length: %d\r\n\r\n" % len(raw) + raw
        )

    with connect(gw) as streaming, connect(gw) as waiting:
        streaming.sendall(http10(b"x-test-hold: s\r\n"))
        reader = Reader(streaming)
        reader.read_until(lambda r: bool(r.answers) and b"data: " in r.answers[0].body)
        waiting.sendall(http10(b"x-test-hold-prefill: p\r\n"))
        wait_for(lambda: engine.count("open") == 2, what="both at the engine")
        state = cut(http, gw, 0)
        assert (state["inflight"], state["preempted"]) == (0, 2)
        before = Reader(waiting).read_answers(1)[0]
        assert (before.status, before.headers[b"retry-after"]) == (503, b"1")
        assert json.loads(before.body)["error"]["type"] == "preempted"
        reader.read_until(lambda r: r.closed)
        assert last_event(reader.answers[0].body)["error"]["type"] == "preempted"
        assert b"[DONE]" not in reader.answers[0].body
    wait_for(lambda: engine.count("cancelled") == 2, what="both engine connections closed")
    engine.release("s")
    engine.release("p")
    state = batch_state(http, gw)
    assert (state["inflight"], state["observed"]["preempted_total"]) == (0, 2)


# -- the setting -----------------------------------------------------------------------------


def test_preempt_batch_from_the_command_line_and_the_environment(monkeypatch: Any) -> None:
    seen: list[GatewayConfig] = []

    def run(config: GatewayConfig, **kwargs: Any) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(gateway_cli, "run", run)
    for args, env in (
        ([], {}),
        (["--preempt-batch"], {}),
        ([], {"LLM_WATCHDOG_GATEWAY_PREEMPT_BATCH": "1"}),
    ):
        result = CliRunner().invoke(gateway_cli.gateway, args, env=env)
        assert result.exit_code == 0, result.output
    assert [config.preempt_batch for config in seen] == [False, True, True]
    with pytest.raises(ValueError, match="preempt_batch must be true or false"):
        GatewayConfig(preempt_batch="yes")  # type: ignore[arg-type]
