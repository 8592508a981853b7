"""The gateway's pure parts and its asyncio admission, without sockets."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from llm_watchdog.gateway import Gateway, GatewayConfig, read_token
from llm_watchdog.gateway.admission import Allowance, ClassGate
from llm_watchdog.gateway.control import parse_put
from llm_watchdog.gateway.observe import Histogram, quantile
from llm_watchdog.gateway.proxy import (
    ClassError,
    classify,
    forward_headers,
    inject_priority,
    relay_headers,
    retry_after_from,
)
from tests.helpers.builders import FakeClock

# -- allowance and lease -----------------------------------------------------------------


def test_allowance_lease_runs_out_at_its_time_and_not_before() -> None:
    a = Allowance(default=8, ceiling=16)
    change = a.set(2, lease_s=30, reason="chat slow", now=100.0, wall=5000.0)
    assert (change.before, change.after, change.kind) == (8, 2, "set")
    assert a.lease_expires_at == 5030.0
    assert a.expire(now=129.9, wall=5029.9) is None
    assert a.value == 2
    assert a.seconds_left(125.0) == 5.0
    expired = a.expire(now=130.0, wall=5030.0)
    assert expired is not None
    assert (expired.kind, expired.before, expired.after, expired.reason) == (
        "lease_expired",
        2,
        8,
        "chat slow",
    )
    assert (a.value, a.lease_expires_at, a.seconds_left(131.0)) == (8, None, None)
    assert a.expire(now=500.0, wall=5400.0) is None  # only once


def test_allowance_without_lease_stays() -> None:
    a = Allowance(default=8, ceiling=16)
    a.set(3, lease_s=None, reason="", now=0.0, wall=0.0)
    assert a.expire(now=1e9, wall=1e9) is None
    assert a.value == 3


@pytest.mark.parametrize("value", [-1, 17])
def test_allowance_outside_the_range_is_refused(value: int) -> None:
    a = Allowance(default=8, ceiling=16)
    with pytest.raises(ValueError, match=r"allowance must be an integer in \[0, 16\]"):
        a.set(value, lease_s=None, reason="", now=0.0, wall=0.0)
    assert a.value == 8


def test_gateway_lease_expiry_with_an_injected_clock_logs_and_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llm_watchdog.gateway")
    clock, wall = FakeClock(10.0), FakeClock(1_700_000_000.0)
    gw = Gateway(GatewayConfig(batch_default_allowance=6), clock=clock, wall=wall)

    async def scenario() -> dict[str, Any]:
        gw.set_allowance("batch", 1, 60.0, "heat")
        clock.now += 59
        assert not gw.expire_leases()
        clock.now += 1
        wall.now += 60
        assert gw.expire_leases()
        return gw.control_state()

    state = asyncio.run(scenario())
    assert state["classes"]["batch"]["allowance"] == 6
    assert [c["kind"] for c in state["changes"]] == ["set", "lease_expired"]
    assert state["changes"][1]["ts"] == 1_700_000_060.0
    assert "batch allowance 6 -> 1 (lease 60 s): heat" in caplog.text
    assert "batch allowance lease ran out: 1 -> default 6 (it was set for: heat)" in caplog.text


def test_a_raise_ramps_from_what_runs_and_a_cut_is_at_once() -> None:
    a = Allowance(default=4, ceiling=16, ramp_per_s=0.5)
    assert a.limit(0.0) == 4  # the default is in force from the start, not ramped
    a.set(1, None, "shed", now=0.0, wall=0.0, inflight=4)
    assert (a.limit(0.0), a.next_rise(0.0)) == (1, None)  # a cut: at once
    a.set(9, None, "regrow", now=10.0, wall=10.0, inflight=3)
    # 3 still running: one more at once, then one every 2 s, up to 9
    assert [a.limit(t) for t in (10.0, 11.9, 12.0, 14.0, 19.9, 20.0, 500.0)] == [
        4,
        4,
        5,
        6,
        8,
        9,
        9,
    ]
    assert (a.next_rise(10.0), a.next_rise(12.5), a.next_rise(20.0)) == (12.0, 14.0, None)
    a.set(7, None, "", now=14.0, wall=14.0, inflight=5)  # lower, still above the ramp (6)
    assert (a.limit(14.0), a.limit(16.0), a.limit(99.0)) == (7, 7, 7)
    a.set(2, 30.0, "", now=16.0, wall=16.0, inflight=6)
    assert a.limit(16.0) == 2
    a.expire(now=46.0, wall=46.0, inflight=2)  # back to the default 4, ramped too
    assert (a.value, a.limit(46.0), a.limit(48.0), a.limit(50.0)) == (4, 3, 4, 4)


def test_an_allowance_left_unused_ramps_again_and_one_kept_full_does_not() -> None:
    a = Allowance(default=8, ceiling=16, ramp_per_s=0.5, ramp_idle_s=10.0)
    a.observe(0.0, inflight=8, waiting=False)  # full: the job uses all of it
    a.observe(30.0, inflight=7, waiting=False)  # one ended; its stream sends again at once
    a.observe(30.1, inflight=8, waiting=False)
    assert a.limit(100.0) == 8
    a.observe(100.0, inflight=2, waiting=False)  # the job winds down
    a.observe(105.0, inflight=0, waiting=False)
    assert a.limit(105.0) == 8  # not yet unused for 10 s
    a.observe(300.0, inflight=0, waiting=False)  # it comes back after minutes
    # one at once, then one every 2 s: eight prefills do not land on chat together
    assert [a.limit(t) for t in (300.0, 301.9, 302.0, 314.0)] == [1, 1, 2, 8]
    a.observe(400.0, inflight=3, waiting=True)  # some wait: the limit is not unused
    assert a.limit(400.0) == 8


def test_no_ramp_no_restart_after_idle() -> None:
    a = Allowance(default=8, ceiling=16, ramp_idle_s=10.0)
    a.observe(0.0, inflight=0, waiting=False)
    a.observe(600.0, inflight=0, waiting=False)
    assert a.limit(600.0) == 8


def test_without_a_ramp_a_raise_is_at_once() -> None:
    a = Allowance(default=1, ceiling=16)
    a.set(9, None, "", now=0.0, wall=0.0, inflight=1)
    assert (a.limit(0.0), a.next_rise(0.0)) == (9, None)


# -- admission queue ---------------------------------------------------------------------


def batch_gate(allowance: int, wait_s: float = 5.0, max_queued: int = 100) -> ClassGate:
    a = Allowance(default=allowance, ceiling=64)
    return ClassGate("batch", allowance=a, max_queue_wait_s=wait_s, max_queued=max_queued)


def test_gate_admits_waiters_in_arrival_order() -> None:
    async def scenario() -> list[int]:
        gate = batch_gate(1)
        assert await gate.acquire() == "admitted"
        order: list[int] = []

        async def waiter(n: int) -> None:
            assert await gate.acquire() == "admitted"
            order.append(n)

        tasks = []
        for n in range(4):
            tasks.append(asyncio.ensure_future(waiter(n)))
            await asyncio.sleep(0)  # each joins the line before the next
        assert gate.queued == 4
        for _ in range(4):
            gate.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert gate.inflight == 1
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_gate_times_out_then_reports_full() -> None:
    async def scenario() -> tuple[str, str, int]:
        gate = batch_gate(0, wait_s=0.05, max_queued=1)
        first = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        second = await gate.acquire()  # the line (1 place) is taken
        return await first, second, gate.queued

    assert asyncio.run(scenario()) == ("timeout", "full", 0)


def test_gate_with_no_wait_allowed_refuses_at_once() -> None:
    async def scenario() -> str:
        return await batch_gate(0, wait_s=0.0).acquire()

    assert asyncio.run(scenario()) == "timeout"


def test_cancelled_waiter_leaves_the_line_and_the_next_one_gets_the_place() -> None:
    async def scenario() -> tuple[int, int, str]:
        gate = batch_gate(1)
        await gate.acquire()
        leaving = asyncio.ensure_future(gate.acquire())
        staying = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.sleep(0)
        queued_after_cancel = gate.queued
        gate.release()
        outcome = await staying
        return queued_after_cancel, gate.inflight, outcome

    assert asyncio.run(scenario()) == (1, 1, "admitted")


def test_waiter_granted_as_it_is_cancelled_passes_the_place_on() -> None:
    async def scenario() -> tuple[int, str]:
        gate = batch_gate(1)
        await gate.acquire()
        granted_then_gone = asyncio.ensure_future(gate.acquire())
        next_in_line = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        gate.release()  # grants the first waiter ...
        granted_then_gone.cancel()  # ... which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await granted_then_gone
        outcome = await next_in_line
        return gate.inflight, outcome

    assert asyncio.run(scenario()) == (1, "admitted")


def test_lowering_the_allowance_keeps_running_ones_and_raising_it_wakes_waiters() -> None:
    async def scenario() -> list[tuple[int, int]]:
        gate = batch_gate(3)
        for _ in range(3):
            await gate.acquire()
        assert gate.allowance is not None
        gate.allowance.set(1, None, "", 0.0, 0.0)
        waiter = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0)
        seen = [(gate.inflight, gate.queued)]
        gate.release()  # 2 left in flight, still over 1
        await asyncio.sleep(0)
        seen.append((gate.inflight, gate.queued))
        gate.allowance.set(4, None, "", 0.0, 0.0)
        gate.wake()
        await waiter
        seen.append((gate.inflight, gate.queued))
        return seen

    assert asyncio.run(scenario()) == [(3, 1), (2, 1), (3, 0)]


def test_after_a_raise_the_gate_lets_waiters_in_one_at_a_time() -> None:
    async def scenario() -> tuple[int, int, float]:
        a = Allowance(default=1, ceiling=64, ramp_per_s=20.0)  # one every 50 ms
        gate = ClassGate("batch", allowance=a, max_queue_wait_s=5.0, max_queued=100)
        await gate.acquire()
        waiters = [asyncio.ensure_future(gate.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        t0 = time.monotonic()
        a.set(4, None, "", t0, 0.0, gate.inflight)
        gate.wake()
        await asyncio.sleep(0)
        at_once = gate.inflight  # one let in at once, the other two by the ramp
        outcomes = await asyncio.wait_for(asyncio.gather(*waiters), 5.0)
        assert outcomes == ["admitted"] * 3
        return at_once, gate.inflight, time.monotonic() - t0

    at_once, inflight, took = asyncio.run(scenario())
    assert (at_once, inflight) == (2, 4)
    assert took >= 2 / 20.0 - 1e-6  # no sooner than the ramp allows


def test_the_ramp_alone_holds_back_only_places_the_allowance_has_room_for() -> None:
    a = Allowance(default=1, ceiling=64, ramp_per_s=0.5)
    a.set(8, None, "", now=100.0, wall=0.0, inflight=1)  # limit 2 at once, then +1 every 2 s
    assert a.limit(100.0) == 2
    assert a.paced_until(2, 100.0) is None  # the limit already lets the second in
    assert a.paced_until(3, 100.0) == pytest.approx(102.0)
    assert a.paced_until(8, 101.0) == pytest.approx(112.0)
    assert a.paced_until(9, 100.0) is None  # over the allowance: no room, not pacing
    assert a.paced_until(8, 112.0) is None  # the climb is over
    assert Allowance(default=4, ceiling=8).paced_until(3, 0.0) is None  # no ramp


def test_a_waiter_the_ramp_holds_is_not_turned_away_at_max_queue_wait() -> None:
    async def scenario() -> list[str]:
        a = Allowance(default=1, ceiling=64, ramp_per_s=10.0)  # one every 100 ms
        gate = ClassGate("batch", allowance=a, max_queue_wait_s=0.05, max_queued=100)
        await gate.acquire()
        waiters = [asyncio.ensure_future(gate.acquire()) for _ in range(4)]
        await asyncio.sleep(0)
        a.set(4, None, "", time.monotonic(), 0.0, gate.inflight)
        gate.wake()  # one let in at once; the ramp paces two more over 200 ms
        return list(await asyncio.wait_for(asyncio.gather(*waiters), 5.0))

    # The fourth waiter has no room in the allowance of 4: it waits 50 ms and leaves.
    assert asyncio.run(scenario()) == ["admitted", "admitted", "admitted", "timeout"]


@pytest.mark.parametrize(
    ("slots", "line"),
    [(0, None), (1, 1), (2, 1), (4, 3), (7, 6), (8, 7), (16, 14), (64, 60), (256, 252)],
)
def test_the_slot_line_keeps_an_eighth_of_the_slots_at_least_one_and_at_most_four(
    slots: int, line: int | None
) -> None:
    # A 4-slot llama.cpp server kept none for chat: batch took all four.
    assert GatewayConfig(engine_slots=slots).slot_line == line


def test_the_law_and_the_gateway_keep_the_same_slots_for_chat() -> None:
    from llm_watchdog.control.law import ControlConfig

    for slots in range(1, 300):
        law = ControlConfig(target_p95_ms=1000.0, engine_slots=slots).slot_line
        assert law == GatewayConfig(engine_slots=slots).slot_line, slots


def test_batch_waits_under_the_slot_line_and_a_chat_release_lets_it_in() -> None:
    async def scenario() -> list[tuple[int, int, int]]:
        gw = Gateway(GatewayConfig(engine_slots=8, batch_default_allowance=8, batch_ramp_per_s=0))
        chat, batch = gw.gates["chat"], gw.gates["batch"]
        for _ in range(3):
            assert await chat.acquire() == "admitted"  # chat is never held by the line
        for _ in range(4):
            assert await batch.acquire() == "admitted"
        waiter = asyncio.ensure_future(batch.acquire())  # 3 + 4 = 7: the line
        await asyncio.sleep(0)
        seen = [(chat.inflight, batch.inflight, batch.queued)]
        assert await chat.acquire() == "admitted"  # chat may still take the slots kept for it
        chat.release()
        chat.release()  # 2 chat + 4 batch: one under the line
        assert await asyncio.wait_for(waiter, 1.0) == "admitted"
        seen.append((chat.inflight, batch.inflight, batch.queued))
        assert not batch.try_acquire()  # 2 + 5 = 7 again
        assert gw.class_state("batch")["slot_line"] == 7
        assert gw.class_state("chat")["slot_line"] is None
        return seen

    assert asyncio.run(scenario()) == [(3, 4, 1), (2, 5, 0)]


def test_without_engine_slots_batch_is_held_by_its_allowance_alone() -> None:
    async def scenario() -> int:
        gw = Gateway(GatewayConfig(batch_default_allowance=8, batch_ramp_per_s=0))
        for _ in range(100):
            await gw.gates["chat"].acquire()
        return sum(gw.gates["batch"].try_acquire() for _ in range(10))

    assert asyncio.run(scenario()) == 8


def test_chat_gate_is_never_limited() -> None:
    async def scenario() -> tuple[list[str], int]:
        gate = ClassGate("chat", allowance=None, max_queue_wait_s=None, max_queued=0)
        outcomes = [await gate.acquire() for _ in range(500)]
        return outcomes, gate.inflight

    outcomes, inflight = asyncio.run(scenario())
    assert set(outcomes) == {"admitted"} and inflight == 500


@pytest.mark.parametrize(
    ("wait_s", "lease_left_s", "allowance", "expected"),
    [
        (30.0, None, 4, 30),
        (0.3, None, 4, 1),
        (0.3, 41.2, 0, 42),
        (5.0, 41.2, 2, 5),
        (1, 1e9, 0, 3600),
    ],
)
def test_retry_after(
    wait_s: float, lease_left_s: float | None, allowance: int, expected: int
) -> None:
    assert retry_after_from(wait_s, lease_left_s, allowance) == expected


# -- classes, headers, body --------------------------------------------------------------

KEYS = GatewayConfig(key_classes={"sk-b": "batch", "sk-c": "chat"}, default_class="batch")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # A key's class outranks the header: the header may lower it, never raise it.
        ([(b"x-traffic-class", b"chat"), (b"authorization", b"Bearer sk-b")], "batch"),
        ([(b"x-traffic-class", b"batch"), (b"authorization", b"Bearer sk-c")], "batch"),
        ([(b"x-traffic-class", b"chat"), (b"authorization", b"Bearer sk-c")], "chat"),
        ([(b"x-traffic-class", b"chat"), (b"authorization", b"Bearer unknown")], "chat"),
        ([(b"x-traffic-class", b" BATCH ")], "batch"),
        ([(b"authorization", b"Bearer sk-c")], "chat"),
        ([(b"authorization", b"bearer  sk-c ")], "chat"),
        ([(b"authorization", b"Basic sk-c")], "batch"),
        ([(b"authorization", b"Bearer unknown")], "batch"),
        ([], "batch"),
    ],
)
def test_classify(headers: list[tuple[bytes, bytes]], expected: str) -> None:
    assert classify(headers, KEYS) == expected


def test_classify_refuses_an_unknown_class() -> None:
    with pytest.raises(ClassError, match="unknown traffic class 'gold'"):
        classify([(b"x-traffic-class", b"gold")], KEYS)


def test_hop_by_hop_headers_are_not_forwarded() -> None:
    incoming = [
        (b"host", b"gateway:8090"),
        (b"connection", b"keep-alive, x-private"),
        (b"x-private", b"1"),
        (b"keep-alive", b"timeout=5"),
        (b"transfer-encoding", b"chunked"),
        (b"content-length", b"12"),
        (b"te", b"trailers"),
        (b"authorization", b"Bearer sk"),
        (b"accept", b"text/event-stream"),
    ]
    assert forward_headers(incoming) == [
        (b"authorization", b"Bearer sk"),
        (b"accept", b"text/event-stream"),
    ]
    answer = [(b"date", b"x"), (b"content-type", b"text/event-stream"), (b"connection", b"close")]
    assert relay_headers(answer) == [(b"content-type", b"text/event-stream")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model":"m","priority":5}', b'{"model":"m","priority":-3}'),
        (b'{"model": "m"}', b'{"model":"m","priority":-3}'),
        (b"[1,2]", b"[1,2]"),
        (b"not json", b"not json"),
        (b"\xff\xfe", b"\xff\xfe"),
    ],
)
def test_inject_priority(body: bytes, expected: bytes) -> None:
    assert inject_priority(body, "priority", -3) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"allowance": 0}, (0, None, "")),
        ({"allowance": 16, "lease_s": 2, "reason": None}, (16, 2.0, "")),
        ({"allowance": 3, "lease_s": 0.5, "reason": "x" * 900}, (3, 0.5, "x" * 500)),
        ({"allowance": 3, "lease_s": float("inf")}, "lease_s must be a positive number"),
        ({"allowance": 3, "reason": 7}, "reason must be a string, got 7"),
        ("3", "the body must be a JSON object"),
    ],
)
def test_parse_put(data: Any, expected: Any) -> None:
    parsed = parse_put(data, ceiling=16)
    if isinstance(expected, str):
        assert isinstance(parsed, str) and parsed.startswith(expected)
    else:
        assert parsed == expected


# -- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"upstream_url": "127.0.0.1:8000"}, "upstream_url: expected a URL like http://"),
        ({"upstream_url": "http://256.1.1.1:80"}, "upstream_url: .*Invalid IPv4 address"),
        ({"upstream_url": "http://127.0.0.1:99999"}, "port 99999 is not between 1 and 65535"),
        ({"upstream_url": "http://127.0.0.1:8000/v1"}, "must be the engine's root"),
        ({"secondary_upstream_url": "ftp://x"}, "secondary_upstream_url: expected a URL like"),
        ({"default_class": "gold"}, "default_class must be one of chat, batch, got 'gold'"),
        (
            {"batch_default_allowance": 65},
            r"batch_default_allowance must be an integer in \[0, 64\]",
        ),
        ({"batch_ceiling": -1}, "batch_ceiling must be an integer >= 0"),
        ({"max_queue_wait_s": -1}, "max_queue_wait_s must be >= 0 seconds"),
        ({"batch_ramp_per_s": -0.5}, "batch_ramp_per_s must be >= 0 requests a second"),
        ({"key_classes": {"sk-12345678": "gold"}, "default_class": "chat"}, "…5678 must be one of"),
        ({"priorities": {"chat": "high"}}, "priorities must map chat/batch to integers"),
        ({"listen_port": 70000}, r"listen_port must be in \[0, 65535\]"),
        ({"engine_slots": -2}, "engine_slots must be an integer >= 0 .*max_num_seqs"),
        (
            {"client_stall_timeout_s": -1},
            r"client_stall_timeout_s must be >= 0 seconds \(0: never\)",
        ),
        ({"client_stall_timeout_s": float("nan")}, "client_stall_timeout_s must be >= 0 seconds"),
    ],
)
def test_config_rejects_what_cannot_work(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatewayConfig(**overrides)


def test_config_is_frozen_and_keeps_its_own_copies() -> None:
    keys = {"sk-a": "batch"}
    config = GatewayConfig(key_classes=keys, control_token="tok")
    keys["sk-b"] = "batch"
    assert dict(config.key_classes) == {"sk-a": "batch"}
    with pytest.raises(AttributeError):
        config.batch_ceiling = 3  # type: ignore[misc]
    assert "tok" not in repr(config) and "sk-a" not in repr(config)
    assert config.listen_host == "127.0.0.1"


def test_read_token_from_file_env_or_nowhere(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc123\n")
    assert read_token(path, environ={"LLM_WATCHDOG_GATEWAY_TOKEN": "env"}) == "abc123"
    assert read_token(None, environ={"LLM_WATCHDOG_GATEWAY_TOKEN": " env "}) == "env"
    assert read_token(None, environ={}) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read control token file .* create it"), ("\n", "is empty: write the token")],
)
def test_read_token_errors_say_what_to_do(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_token(path, environ={})


# -- observation -------------------------------------------------------------------------


def test_quantile_is_nearest_rank() -> None:
    assert quantile([], 0.5) is None
    assert quantile([5.0], 0.95) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.95) == 95.0


def test_histogram_lines_are_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    assert list(h.lines("m", 'class="chat"')) == [
        'm_bucket{class="chat",le="0.1"} 2',
        'm_bucket{class="chat",le="1"} 3',
        'm_bucket{class="chat",le="+Inf"} 4',
        'm_sum{class="chat"} 3.650000',
        'm_count{class="chat"} 4',
    ]
