"""The pure part of alerting: rules, dedupe, rate limit with summary, resolved."""

from __future__ import annotations

import pytest

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.policy import AlertPolicy, AlertRules, resolved_message

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
    e = AlertEvent(
        key="k",
        kind="chat_slowed",
        state="firing",
        ts=T0,
        title="Chat\nslowed",
        message="line one\n  line two",
    )
    assert e.severity == "critical"
    assert e.message == "line one line two"
    assert e.title == "Chat slowed"
    unknown = AlertEvent(key="k", kind="new_kind", state="firing", ts=T0, title="t", message="m")
    assert unknown.severity == "warning"


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
    summary = AlertEvent(
        key="k", kind="chat_slowed", state="summary", ts=T0, title="t", message="m"
    )
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


def test_resolved_line() -> None:
    assert (
        resolved_message("Heat warning", 75, "82 °C") == "Resolved after 75 s: Heat warning; 82 °C"
    )
    assert resolved_message("Chat slowed", 7 * 60) == "Resolved after 7 min: Chat slowed"
