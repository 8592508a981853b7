"""Webhook sink against a real HTTP receiver on 127.0.0.1: shapes, retries, failures, secrets."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.header import decode_header
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from llm_watchdog.alerts.config import AlertConfig
from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.manager import AlertManager, MemoryAlertLog, send_test
from llm_watchdog.alerts.sinks import DeliveryError
from llm_watchdog.alerts.webhook import WebhookSink, redact_url
from tests.helpers.builders import FakeClock

T0 = 1_700_000_000.0
TOKEN = "T0KEN-s3cret-abcdef"


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """What a webhook receiver got, and a script of answers: status ints, (status, headers)
    pairs, or "hang" (no answer until the test ends). After the script: 200."""

    url: str = ""
    script: list[Any] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def next_answer(self) -> Any:
        return self.script.pop(0) if self.script else 200


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        receiver: Receiver = self.server.receiver
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        receiver.seen.append(Seen(self.path, dict(self.headers.items()), body))
        answer = receiver.next_answer()
        if answer == "hang":
            receiver.release.wait(10)
            answer = 200
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            text = b"ok" if status < 400 else f"error {status} for {self.path}".encode()
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    rec = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hooks/{TOKEN}")
    server.receiver = rec  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        rec.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def alert(state: str = "firing", **kw: Any) -> AlertEvent:
    values: dict[str, Any] = {
        "key": "drift:chat_slowed:1700000000",
        "kind": "chat_slowed",
        "state": state,
        "ts": T0,
        "title": "Chat slowed (thermal) at 86 °C",
        "message": "Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline; GPU 0 86 °C",
        "cause": "thermal",
        "fields": {"p95_ms": 1900.0, "baseline_p95_ms": 800.0},
    }
    values.update(kw)
    return AlertEvent(**values)


# -- shapes ------------------------------------------------------------------------------


def test_generic_shape_posts_every_field_as_json(receiver: Receiver) -> None:
    with WebhookSink(receiver.url, "generic", headers={"X-Team": "ml"}, host="gpu-box") as sink:
        sink.send(alert())
    (seen,) = receiver.seen
    assert seen.path == f"/hooks/{TOKEN}"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["X-Team"] == "ml"
    assert seen.json() == {
        "source": "llm-watchdog",
        "schema": 1,
        "host": "gpu-box",
        "key": "drift:chat_slowed:1700000000",
        "kind": "chat_slowed",
        "state": "firing",
        "severity": "critical",
        "ts": T0,
        "time": "2023-11-14T22:13:20+00:00",
        "title": "Chat slowed (thermal) at 86 °C",
        "message": "Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline; GPU 0 86 °C",
        "cause": "thermal",
        "fields": {"p95_ms": 1900.0, "baseline_p95_ms": 800.0},
    }


def test_slack_shape_is_text_with_optional_blocks(receiver: Receiver) -> None:
    with WebhookSink(receiver.url, "slack") as plain:
        plain.send(alert(message="p95 <2 s> & rising"))
    with WebhookSink(receiver.url, "slack", blocks=True, host="gpu-box") as rich:
        rich.send(alert(state="resolved", message="Resolved after 7 min"))
    first, second = (s.json() for s in receiver.seen)
    assert first == {"text": "🔴 p95 &lt;2 s&gt; &amp; rising"}
    assert second["text"] == "✅ Resolved after 7 min"
    header, section, context = second["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "✅ Chat slowed (thermal) at 86 °C"},
    }
    assert section["text"] == {"type": "mrkdwn", "text": "Resolved after 7 min"}
    assert context["elements"][0]["text"] == (
        "chat_slowed · resolved · critical · gpu-box · cause thermal"
    )


def test_discord_shape_cuts_to_2000_characters_and_pings_nobody(receiver: Receiver) -> None:
    with WebhookSink(receiver.url, "discord") as sink:
        sink.send(alert(severity="warning", message="@everyone " + "x" * 2500))
        sink.send(alert(message="short"))
    long, short = (s.json() for s in receiver.seen)
    assert len(long["content"]) == 2000
    assert long["content"].startswith("⚠️ @everyone xxx") and long["content"].endswith("x…")
    assert long["allowed_mentions"] == {"parse": []}
    assert short == {"content": "🔴 short", "allowed_mentions": {"parse": []}}


def _decoded(value: str) -> str:
    return "".join(
        part.decode(charset or "ascii") if isinstance(part, bytes) else part
        for part, charset in decode_header(value)
    )


def test_ntfy_shape_is_plain_text_with_title_priority_and_tags(receiver: Receiver) -> None:
    auth = {"Authorization": "Bearer tk_abcdefghijklmnop"}
    with WebhookSink(receiver.url, "ntfy", headers=auth) as sink:
        sink.send(alert())
        sink.send(alert(state="resolved", message="Resolved after 7 min: Chat slowed"))
        sink.send(alert(kind="heat_warning", severity="warning", title="Heat warning"))
    fire, end, heat = receiver.seen
    assert fire.body.decode("utf-8") == alert().message
    assert fire.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert fire.headers["Authorization"] == "Bearer tk_abcdefghijklmnop"
    # "°" is not ASCII: the title travels as an RFC 2047 encoded word, which ntfy decodes.
    assert fire.headers["Title"].startswith("=?UTF-8?B?")
    assert _decoded(fire.headers["Title"]) == "Chat slowed (thermal) at 86 °C"
    assert (fire.headers["Priority"], fire.headers["Tags"]) == ("5", "rotating_light,chat_slowed")
    assert (end.headers["Priority"], end.headers["Tags"]) == ("3", "white_check_mark,chat_slowed")
    assert heat.headers["Title"] == "Heat warning"  # ASCII stays readable
    assert (heat.headers["Priority"], heat.headers["Tags"]) == ("4", "warning,heat_warning")


# -- failures, one attempt at a time -----------------------------------------------------


def test_server_error_is_retryable_and_hides_the_token(receiver: Receiver) -> None:
    receiver.script = [(503, {"Retry-After": "7"})]
    with WebhookSink(receiver.url, "slack") as sink:
        with pytest.raises(DeliveryError) as info:
            sink.send(alert())
    err = info.value
    assert err.retryable and err.retry_after_s == 7.0
    port = receiver.url.split(":")[2].split("/")[0]
    # The body echoed the path (and the token in it): scrubbed.
    assert str(err) == (
        f"http://127.0.0.1:{port}/… answered 503 Service Unavailable: error 503 for …"
    )
    assert TOKEN not in sink.name and TOKEN not in repr(sink)


def test_client_error_is_final_and_says_what_to_check(receiver: Receiver) -> None:
    receiver.script = [404]
    with WebhookSink(receiver.url) as sink, pytest.raises(DeliveryError) as info:
        sink.send(alert())
    assert not info.value.retryable
    assert str(info.value).endswith("(check the URL and token)")
    assert TOKEN not in str(info.value)


def test_unreachable_receiver_says_so_without_the_token() -> None:
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with WebhookSink(f"http://127.0.0.1:{port}/hooks/{TOKEN}", timeout_s=2) as sink:
        with pytest.raises(DeliveryError) as info:
            sink.send(alert())
    text = str(info.value)
    assert text.startswith(f"cannot reach http://127.0.0.1:{port}/… (")
    assert text.endswith("is the receiver up and the URL right?")
    assert TOKEN not in text and info.value.retryable


def test_redact_url_keeps_only_scheme_host_and_port() -> None:
    assert redact_url("https://hooks.slack.com/services/T0/B0/XYZ") == "https://hooks.slack.com/…"
    assert redact_url("https://ntfy.sh/my-secret-topic") == "https://ntfy.sh/…"
    assert redact_url("http://10.0.0.2:8080") == "http://10.0.0.2:8080"


# -- through the manager: retries with backoff, recorded, never raised --------------------


def manager_for(
    sink: WebhookSink, log: MemoryAlertLog, sleeps: list[float], **cfg: Any
) -> AlertManager:
    config = AlertConfig(tick_interval_s=None, **cfg)
    return AlertManager([sink], log, config, clock=FakeClock(T0), sleep=sleeps.append)


def test_retries_with_exponential_backoff_until_delivered(receiver: Receiver) -> None:
    receiver.script = [500, (429, {"Retry-After": "30"}), 200]
    log, sleeps = MemoryAlertLog(), []
    with manager_for(WebhookSink(receiver.url, "slack"), log, sleeps, backoff_s=2) as manager:
        manager.submit(alert())
        assert manager.flush(10)
    assert len(receiver.seen) == 3
    # 2 s, then 4 s stretched to the 30 s the receiver asked for.
    assert sleeps == [2.0, 30.0]
    rows = log.rows
    assert [(r["attempts"], r["ok"], r["final"]) for r in rows] == [(1, 0, 0), (2, 0, 0), (3, 1, 1)]
    assert "answered 500" in rows[0]["error"] and "answered 429" in rows[1]["error"]
    assert rows[2]["error"] is None
    assert {r["key"] for r in rows} == {"drift:chat_slowed:1700000000"}
    assert all(TOKEN not in (r["error"] or "") + r["sink"] for r in rows)


def test_a_receiver_that_always_fails_is_recorded_not_raised(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.script = [500] * 10
    log, sleeps = MemoryAlertLog(), []
    sink = WebhookSink(receiver.url, "generic")
    with caplog.at_level(logging.DEBUG, logger="llm_watchdog.alerts"):
        with manager_for(sink, log, sleeps, max_attempts=4, backoff_s=1, backoff_max_s=3) as m:
            m.submit(alert())  # no exception here ...
            assert m.flush(10)  # ... nor in the worker
    assert len(receiver.seen) == 4
    assert sleeps == [1.0, 2.0, 3.0]  # doubling, capped at backoff_max
    final = [r for r in log.rows if r["final"]]
    assert len(final) == 1 and final[0]["ok"] == 0 and final[0]["attempts"] == 4
    assert "answered 500 Internal Server Error" in final[0]["error"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("not delivered" in w and "attempt 4" in w for w in warnings)
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_a_hanging_receiver_never_blocks_submit(receiver: Receiver) -> None:
    receiver.script = ["hang"]
    log, sleeps = MemoryAlertLog(), []
    sink = WebhookSink(receiver.url, "generic", timeout_s=0.3)
    with manager_for(sink, log, sleeps, max_attempts=1) as manager:
        started = time.monotonic()
        queued = manager.submit(alert())
        assert time.monotonic() - started < 0.25  # well under the sink's 0.3 s timeout
        assert [a.state for a in queued] == ["firing"]
        assert manager.flush(10)
    (row,) = log.rows
    assert row["ok"] == 0
    assert row["error"].startswith("no answer from http://127.0.0.1:")
    assert row["error"].endswith("within 0.3 s")


def test_send_test_reaches_every_sink_and_reports_each(receiver: Receiver) -> None:
    receiver.script = [200, 403]
    log = MemoryAlertLog()
    good = WebhookSink(receiver.url, "slack", name="ops-slack")
    bad = WebhookSink(receiver.url, "discord", name="ops-discord")
    with good, bad:
        results = send_test([good, bad], recorder=log, clock=FakeClock(T0), host="gpu-box")
    assert [(r.sink, r.ok) for r in results] == [("ops-slack", True), ("ops-discord", False)]
    assert "answered 403 Forbidden" in (results[1].error or "")
    assert receiver.seen[0].json() == {
        "text": "🧪 Test alert from llm-watchdog on gpu-box: this sink (ops-slack) works."
    }
    assert [(r["sink"], r["state"], r["ok"]) for r in log.rows] == [
        ("ops-slack", "test", 1),
        ("ops-discord", "test", 0),
    ]


@pytest.mark.parametrize(
    ("fault", "start"),
    [
        (httpx.ConnectError, "cannot reach https://hooks.example.test/… ("),
        (httpx.RemoteProtocolError, "cannot reach https://hooks.example.test/… ("),
        (httpx.ProxyError, "cannot reach https://hooks.example.test/… ("),
        (httpx.ConnectTimeout, "no answer from https://hooks.example.test/… within 10 s"),
        (httpx.ReadTimeout, "no answer from https://hooks.example.test/… within 10 s"),
    ],
)
def test_every_httpx_failure_maps_to_a_retryable_delivery_error(
    fault: type[httpx.TransportError], start: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        # httpx errors often quote the URL: it must not reach the error text.
        raise fault(f"failed on {request.url}", request=request)

    url = f"https://hooks.example.test/services/{TOKEN}"
    with WebhookSink(url, transport=httpx.MockTransport(handler)) as sink:
        with pytest.raises(DeliveryError) as info:
            sink.send(alert())
    assert str(info.value).startswith(start)
    assert info.value.retryable and TOKEN not in str(info.value)
