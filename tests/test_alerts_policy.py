"""The pure part of alerting: rules, dedupe, rate limit with summary, resolved; alert text."""

from __future__ import annotations

import pytest

from watchdog.alerts.events import AlertEvent
from watchdog.alerts.policy import AlertPolicy, AlertRules
from watchdog.alerts.text import (
    baseline_invalidated_message,
    chat_slowed_message,
    format_duration,
    format_ms,
    heat_warning_message,
    resolved_message,
    throttle_reason_names,
)

T0 = 1_700_000_000.0


def firing(key: str, kind: str = "chat_slowed", ts: float = T0, **kw: object) -> AlertEvent:
    return AlertEvent(
        key=key,
        kind=kind,
        state="firing",
        ts=ts,
        title=kw.pop("title", "Chat slowed (thermal)"),  # type: ignore[arg-type]
        message=kw.pop("message", f"Chat slowed under heat ({key})"),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def resolved(key: str, kind: str = "chat_slowed", ts: float = T0, message: str = "") -> AlertEvent:
    return AlertEvent(key=key, kind=kind, state="resolved", ts=ts, title="", message=message)


# -- the event value ---------------------------------------------------------------------


def test_event_defaults_severity_from_kind_and_keeps_message_on_one_line() -> None:
    e = AlertEvent("k", "chat_slowed", "firing", T0, "Chat\nslowed", "line one\n  line two")
    assert e.severity == "critical"
    assert e.message == "line one line two"
    assert e.title == "Chat slowed"
    assert AlertEvent("k", "new_kind", "firing", T0, "t", "m").severity == "warning"


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"state": "open"}, "unknown alert state 'open'"),
        ({"severity": "urgent"}, "unknown severity 'urgent': expected one of info, warning"),
        ({"key": ""}, "key must be a non-empty stable id"),
    ],
)
def test_event_rejects_bad_values(kwargs: dict[str, str], text: str) -> None:
    base = {"key": "k", "kind": "chat_slowed", "state": "firing", "ts": T0, "title": "t"}
    with pytest.raises(ValueError, match=text):
        AlertEvent(**{**base, "message": "m", **kwargs})  # type: ignore[arg-type]


# -- dedupe and resolved -----------------------------------------------------------------


def test_fires_once_per_key_and_resolves_with_duration() -> None:
    policy = AlertPolicy()
    first = policy.decide(firing("drift:1"), T0)
    assert [a.key for a in first] == ["drift:1"]
    # The detector repeats the open event every step: no second alert.
    for step in range(1, 20):
        assert policy.decide(firing("drift:1", ts=T0 + step * 10), T0 + step * 10) == []
    out = policy.decide(resolved("drift:1", ts=T0 + 420), T0 + 420)
    assert len(out) == 1
    r = out[0]
    assert (r.state, r.key, r.kind, r.severity) == (
        "resolved",
        "drift:1",
        "chat_slowed",
        "critical",
    )
    assert r.message == "Resolved after 7 min: Chat slowed (thermal)"
    assert r.title == "Resolved: Chat slowed (thermal)"
    assert r.fields["started_ts"] == T0
    # Resolving again, or resolving a key that never fired, sends nothing.
    assert policy.decide(resolved("drift:1"), T0 + 500) == []
    assert policy.decide(resolved("never-fired"), T0 + 500) == []


def test_resolved_message_from_the_event_wins() -> None:
    policy = AlertPolicy()
    policy.decide(firing("e"), T0)
    out = policy.decide(resolved("e", message="Chat fast again: p95 TTFT 0.8 s"), T0 + 60)
    assert out[0].message == "Chat fast again: p95 TTFT 0.8 s"


def test_same_key_after_resolve_is_a_new_episode() -> None:
    policy = AlertPolicy()
    assert policy.decide(firing("telemetry:gpu0", kind="telemetry_lost"), T0)
    policy.decide(resolved("telemetry:gpu0", kind="telemetry_lost"), T0 + 5)
    again = policy.decide(firing("telemetry:gpu0", kind="telemetry_lost"), T0 + 600)
    assert [a.state for a in again] == ["firing"]


# -- rules -------------------------------------------------------------------------------


def test_rules_filter_by_kind_and_minimum_severity() -> None:
    rules = AlertRules(
        enabled_kinds=frozenset({"chat_slowed", "heat_warning"}), min_severity="warning"
    )
    policy = AlertPolicy(rules)
    assert policy.decide(firing("a", kind="chat_slowed"), T0)
    assert policy.decide(firing("b", kind="probes_failing"), T0) == []  # kind not enabled
    assert policy.decide(firing("c", kind="heat_warning", severity="info"), T0) == []  # too low
    assert policy.decide(firing("d", kind="heat_warning"), T0)  # default severity: warning
    # A filtered event never fired, so its end says nothing either.
    assert policy.decide(resolved("b", kind="probes_failing"), T0 + 1) == []
    assert policy.decide(resolved("c", kind="heat_warning"), T0 + 1) == []


def test_rules_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="unknown severity 'loud'"):
        AlertRules(min_severity="loud")
    with pytest.raises(ValueError, match="max_per_window must be at least 1"):
        AlertRules(max_per_window=0)


def test_incoming_summary_state_is_refused() -> None:
    summary = AlertEvent("k", "chat_slowed", "summary", T0, "t", "m")
    with pytest.raises(ValueError, match="firing or resolved"):
        AlertPolicy().decide(summary, T0)


# -- rate limit --------------------------------------------------------------------------


def test_rate_limit_holds_extra_alerts_and_sums_them_up_when_the_window_has_room() -> None:
    policy = AlertPolicy(AlertRules(max_per_window=2, window_s=3600))
    sent = [a.key for k in "abcd" for a in policy.decide(firing(k, ts=T0), T0 + "abcd".index(k))]
    assert sent == ["a", "b"]
    # Another kind has its own budget.
    assert policy.decide(firing("h", kind="heat_warning"), T0 + 4)
    # One held event ends before the summary; its end sends nothing on its own.
    assert policy.decide(resolved("c", ts=T0 + 100), T0 + 100) == []
    # The window is still full just before "a" ages out.
    assert policy.due(T0 + 3599) == []
    assert policy.decide(firing("d", ts=T0 + 3599), T0 + 3599) == []  # duplicate of held "d"
    out = policy.due(T0 + 3600.5)
    assert len(out) == 1
    summary = out[0]
    assert summary.state == "summary" and summary.kind == "chat_slowed"
    assert summary.severity == "critical"
    assert summary.message == (
        "2 more chat slowed alerts held back by the rate limit (2 per 1 h) in the last 1 h; "
        "1 of them already ended. Latest: Chat slowed under heat (d)"
    )
    assert summary.fields == {"held": 2, "ended": 1, "held_keys": ["c", "d"]}
    assert policy.due(T0 + 3601) == []  # said once
    # A held event that ends later still sends nothing: its firing alert never went out.
    assert policy.decide(resolved("d"), T0 + 3700) == []
    # Sent ones still resolve normally.
    assert [a.state for a in policy.decide(resolved("a"), T0 + 3700)] == ["resolved"]


def test_summary_comes_before_a_new_alert_of_the_same_kind() -> None:
    policy = AlertPolicy(AlertRules(max_per_window=1, window_s=60))
    policy.decide(firing("a"), T0)
    assert policy.decide(firing("b"), T0 + 1) == []
    out = policy.decide(firing("c"), T0 + 61)
    assert [(a.state, a.key) for a in out] == [("summary", "chat_slowed:summary:1700000061"),
                                               ("firing", "c")]  # fmt: skip


# -- text --------------------------------------------------------------------------------


def test_chat_slowed_line_reads_like_the_example() -> None:
    line = chat_slowed_message(
        "thermal",
        1900,
        800,
        gpu_index=0,
        temp_c=86.2,
        sm_clock_mhz=1450,
        sm_clock_max_mhz=1980,
        throttle_reasons=0x20 | 0x1,  # SwThermalSlowdown and GpuIdle (not named: not a slowdown)
        throttled_s=7 * 60,
    )
    assert line == (
        "Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline; GPU 0 86 °C, "
        "SM 1450/1980 MHz, SwThermalSlowdown for 7 min"
    )


def test_chat_slowed_under_load_leaves_out_what_is_unknown() -> None:
    line = chat_slowed_message("load", 2400, 800, batch_inflight=7, baseline_batch_inflight=2)
    assert line == (
        "Chat slowed under batch load: p95 TTFT 2.4 s vs 0.8 s baseline; "
        "batch in flight 7 vs 2 at baseline"
    )
    assert chat_slowed_message(None, 450, 300) == "Chat slowed: p95 TTFT 450 ms vs 300 ms baseline"


def test_other_lines() -> None:
    assert heat_warning_message(81, 87, gpu_index=1, slope_c_per_min=1.24, eta_s=290) == (
        "GPU 1 heading for thermal slowdown: 81 °C rising 1.2 °C/min, slowdown at 87 °C "
        "in about 5 min; chat not slow yet"
    )
    assert baseline_invalidated_message(
        {"model": ("qwen2.5-7b", "qwen2.5-14b")}, samples_needed=300
    ) == (
        "Runtime changed: re-baselining (model qwen2.5-7b → qwen2.5-14b); "
        "drift checks resume after 300 warm probes"
    )
    assert (
        resolved_message("Heat warning", 95, "82 °C") == "Resolved after 2 min: Heat warning; 82 °C"
    )
    assert throttle_reason_names(0x4 | 0x40 | 0x100) == ["SwPowerCap", "HwThermalSlowdown"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.42, "0.4 s"),
        (3, "3 s"),
        (45.4, "45 s"),
        (59.6, "1 min"),
        (420, "7 min"),
        (3599, "1 h"),
        (4800, "1 h 20 min"),
        (7200, "2 h"),
        (86400 * 2 + 3 * 3600, "2 d 3 h"),
        (None, "?"),
        (-5, "0 s"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("ms", "scale_of", "text"),
    [
        (850, None, "850 ms"),
        (1900, None, "1.9 s"),
        (800, 1900, "0.8 s"),
        (12_400, None, "12 s"),
        (999.6, None, "1.0 s"),
        (9_960, None, "10 s"),
        (None, None, "?"),
    ],
)
def test_format_ms(ms: float | None, scale_of: float | None, text: str) -> None:
    assert format_ms(ms, scale_of=scale_of) == text
