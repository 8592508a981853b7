"""What the alerts package takes in: one event-like value, and the catalogue of kinds.

The daemon maps everything that can page a person (drift events, GPU telemetry events,
control events, baseline invalidation, probe failures) onto `AlertEvent`. The alerts package
never imports those producers; this value is the whole interface.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "critical")

# States an incoming event may have. The manager also sends "summary" (alerts held back by
# the rate limit) and "test" (`llm-watchdog alerts test`); sinks render all four.
EVENT_STATES = ("firing", "resolved")
ALERT_STATES = ("firing", "resolved", "summary", "test")

# kind -> (default severity, what it means). Kinds outside this table are accepted too
# (alerting is open to new producers); they default to "warning".
KINDS: dict[str, tuple[str, str]] = {
    "chat_slowed": ("critical", "chat TTFT drifted above its baseline (cause: heat, power, load)"),
    "heat_warning": ("warning", "GPU temperature heading for thermal slowdown, chat not slow yet"),
    "quality_failed": ("critical", "canary answers stopped matching their expectation"),
    "cold_start_slow": ("warning", "a cold start took longer than its configured limit"),
    "baseline_invalidated": ("info", "runtime changed (model, driver, engine): re-baselining"),
    "telemetry_lost": ("warning", "NVML telemetry lost (GPU gone, NVML hung or missing)"),
    "probes_failing": ("critical", "canary probes failing (server down, timeouts, errors)"),
    "control_not_effective": ("critical", "the batch allowance did not take effect"),
    "storage_failing": ("critical", "the database cannot be written (disk full, deleted, gone)"),
    "test": ("info", "a test alert from `llm-watchdog alerts test`"),
}


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical; ValueError for anything else."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise ValueError(
            f"unknown severity {severity!r}: expected one of {', '.join(SEVERITIES)}"
        ) from None


def default_severity(kind: str) -> str:
    return KINDS.get(kind, ("warning", ""))[0]


def one_line(text: str) -> str:
    """Collapse whitespace (newlines included) so every message is one line for a person."""
    return " ".join(text.split())


@dataclass(frozen=True)
class AlertEvent:
    """One thing worth telling a person about, as it starts ("firing") or ends ("resolved").

    `key` is the stable id of the underlying event (e.g. "drift:chat_slowed:1718000000"):
    every update of one event carries the same key, so the alert fires once per key.
    `message` is one line for a person; `fields` holds the figures behind it (JSON-able).
    """

    key: str
    kind: str
    state: str
    ts: float  # UTC unix seconds when the event started (firing) or ended (resolved)
    title: str
    message: str
    cause: str | None = None  # "thermal" | "power" | "load" | "unknown" | None
    severity: str | None = None  # None: the kind's default from KINDS
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("AlertEvent.key must be a non-empty stable id of the event")
        if self.state not in ALERT_STATES:
            raise ValueError(
                f"unknown alert state {self.state!r}: expected one of {', '.join(ALERT_STATES)}"
            )
        severity = self.severity if self.severity is not None else default_severity(self.kind)
        severity_rank(severity)
        # Frozen dataclass: normalise in place once, at construction.
        object.__setattr__(self, "severity", severity)
        object.__setattr__(self, "title", one_line(self.title))
        object.__setattr__(self, "message", one_line(self.message))

    @property
    def level(self) -> str:
        """The severity, typed as str (it is never None after construction)."""
        return self.severity or "warning"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
