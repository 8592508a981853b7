"""Which events become alerts, and when: the pure decision part of alerting.

No threads, sockets or clock here: `AlertPolicy.decide(event, now)` and `AlertPolicy.due(now)`
take the time and return the alerts to send.

- Rules: an event alerts when its kind is enabled and its severity is at least the minimum.
- Dedupe: one firing alert per event key while the event lasts; repeats of a firing key are
  updates of the same event and send nothing. A key that fires again after it resolved is a
  new episode and alerts again.
- Rate limit, per kind: at most `max_per_window` firing alerts in any rolling `window_s`.
  Firing events over the limit are held; when the window has room again, one summary alert
  says how many were held (and how many of those already ended), then alerting goes on.
- Resolved: a resolved alert is sent when an event ends, only if its firing alert was sent.
- Carried over: `restore(alert)` takes a firing alert an earlier run of the daemon sent, so
  the event's later updates stay quiet and its end sends one resolved alert.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llm_watchdog.alerts.events import SEVERITIES, AlertEvent, severity_rank
from llm_watchdog.durations import human_duration


@dataclass(frozen=True)
class AlertRules:
    enabled_kinds: frozenset[str] | None = None  # None: every kind alerts
    min_severity: str = "info"
    max_per_window: int = 5  # firing alerts per kind per window; 5 an hour stays readable
    window_s: float = 3600.0

    def __post_init__(self) -> None:
        severity_rank(self.min_severity)
        if self.max_per_window < 1:
            raise ValueError("max_per_window must be at least 1")
        if self.window_s <= 0:
            raise ValueError("window_s must be positive")

    def wants(self, event: AlertEvent) -> bool:
        if self.enabled_kinds is not None and event.kind not in self.enabled_kinds:
            return False
        return severity_rank(event.level) >= severity_rank(self.min_severity)


@dataclass
class _Active:
    event: AlertEvent
    sent: bool


@dataclass
class _Held:
    first_ts: float
    count: int = 0
    ended: int = 0
    severity: str = "info"
    latest: AlertEvent | None = None
    keys: set[str] = field(default_factory=set)


class AlertPolicy:
    """Dedupe, rate limit and resolve bookkeeping over a stream of AlertEvents."""

    def __init__(self, rules: AlertRules | None = None) -> None:
        self.rules = rules or AlertRules()
        self._active: dict[str, _Active] = {}
        self._sent: dict[str, deque[float]] = {}
        self._held: dict[str, _Held] = {}

    @property
    def active_keys(self) -> list[str]:
        """Keys of events that fired (sent or held) and have not resolved yet."""
        return list(self._active)

    def restore(self, alert: AlertEvent) -> bool:
        """Count `alert`, a firing alert sent before a restart, as sent and still active;
        False when its key is active here already. It takes no room in the rate limit: the
        window counts what this run sends."""
        if alert.state != "firing":
            raise ValueError(f"only a firing alert can be carried over, not {alert.state!r}")
        if alert.key in self._active:
            return False
        self._active[alert.key] = _Active(alert, sent=True)
        return True

    def decide(self, event: AlertEvent, now: float) -> list[AlertEvent]:
        """The alerts to send now for `event` (possibly none), due summaries first."""
        out = self.due(now)
        if event.state == "firing":
            out.extend(self._on_firing(event, now))
        elif event.state == "resolved":
            out.extend(self._on_resolved(event))
        else:
            raise ValueError(f"an incoming event is firing or resolved, not {event.state!r}")
        return out

    def due(self, now: float) -> list[AlertEvent]:
        """Summaries of held alerts whose kind has room in the window again."""
        out: list[AlertEvent] = []
        for kind in list(self._held):
            if self._has_room(kind, now):
                out.append(self._summary(kind, self._held.pop(kind), now))
        return out

    def _on_firing(self, event: AlertEvent, now: float) -> list[AlertEvent]:
        if not self.rules.wants(event) or event.key in self._active:
            return []
        if self._has_room(event.kind, now) and event.kind not in self._held:
            self._sent.setdefault(event.kind, deque()).append(now)
            self._active[event.key] = _Active(event, sent=True)
            return [event]
        held = self._held.setdefault(event.kind, _Held(first_ts=now))
        held.count += 1
        held.latest = event
        held.keys.add(event.key)
        if severity_rank(event.level) > severity_rank(held.severity):
            held.severity = event.level
        self._active[event.key] = _Active(event, sent=False)
        return []

    def _on_resolved(self, event: AlertEvent) -> list[AlertEvent]:
        active = self._active.pop(event.key, None)
        if active is None:
            return []
        if not active.sent:
            held = self._held.get(event.kind)
            if held is not None and event.key in held.keys:
                held.ended += 1
            return []
        firing = active.event
        message = event.message or resolved_message(firing.title, event.ts - firing.ts)
        return [
            AlertEvent(
                key=firing.key,
                kind=firing.kind,
                state="resolved",
                ts=event.ts,
                title=event.title or f"Resolved: {firing.title}",
                message=message,
                cause=firing.cause,
                severity=firing.severity,
                fields={**firing.fields, **event.fields, "started_ts": firing.ts},
            )
        ]

    def _has_room(self, kind: str, now: float) -> bool:
        sent = self._sent.get(kind)
        if sent is None:
            return True
        while sent and sent[0] <= now - self.rules.window_s:
            sent.popleft()
        return len(sent) < self.rules.max_per_window

    def _summary(self, kind: str, held: _Held, now: float) -> AlertEvent:
        label = kind.replace("_", " ")
        n = held.count
        limit = f"{self.rules.max_per_window} per {human_duration(self.rules.window_s)}"
        message = (
            f"{n} more {label} alert{'s' if n != 1 else ''} held back by the rate limit "
            f"({limit}) in the last {human_duration(now - held.first_ts)}"
        )
        if held.ended:
            message += f"; {held.ended} of them already ended"
        if held.latest is not None:
            message += f". Latest: {held.latest.message}"
        return AlertEvent(
            key=f"{kind}:summary:{now:.0f}",
            kind=kind,
            state="summary",
            ts=now,
            title=f"{n} {label} alert{'s' if n != 1 else ''} held back",
            message=message,
            cause=held.latest.cause if held.latest is not None else None,
            severity=held.severity if held.severity in SEVERITIES else "warning",
            fields={"held": n, "ended": held.ended, "held_keys": sorted(held.keys)},
        )


def resolved_message(title: str, duration_s: float | None, detail: str | None = None) -> str:
    """The line of a resolved alert: how long it lasted, and what it was."""
    line = f"Resolved after {human_duration(duration_s)}: {title}"
    return line + (f"; {detail}" if detail else "")
