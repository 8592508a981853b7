"""Bookkeeping of drift events: the open ones (mutable records) and their frozen snapshots.

Each event is opened once and closed once; in between it may be reported again ("updated")
when its cause or peak changes. Ids are "<kind>-<start in unix ms>", so the same trace gives
the same ids and a restarted daemon does not reuse one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_watchdog.drift import messages
from llm_watchdog.drift.values import DriftEvent


@dataclass
class OpenEvent:
    """The mutable record behind an open event (DriftEvent snapshots are frozen copies)."""

    id: str
    serial: int
    kind: str
    start_ts: float
    cause: str
    baseline_p95_ms: float | None
    peak_p95_ms: float | None
    evidence: dict[str, Any]
    message: str
    candidate: str | None = None  # a cause waiting to replace `cause` (see monitor)
    candidate_n: int = 0
    reported_peak: float | None = None


def snapshot(rec: OpenEvent, change: str, ts: float, end_ts: float | None = None) -> DriftEvent:
    return DriftEvent(
        id=rec.id,
        serial=rec.serial,
        kind=rec.kind,
        change=change,
        start_ts=rec.start_ts,
        end_ts=end_ts,
        cause=rec.cause,
        baseline_p95_ms=rec.baseline_p95_ms,
        peak_p95_ms=rec.peak_p95_ms,
        evidence=dict(rec.evidence),
        message=rec.message,
        ts=ts,
    )


class EventBook:
    """At most one open event per kind, and the serial numbers of all events."""

    def __init__(self) -> None:
        self.open: dict[str, OpenEvent] = {}
        self.serial = 0

    def new(
        self,
        kind: str,
        ts: float,
        cause: str,
        baseline_p95_ms: float | None,
        peak_p95_ms: float | None,
        evidence: dict[str, Any],
    ) -> OpenEvent:
        self.serial += 1
        rec = OpenEvent(
            id=f"{kind}-{round(ts * 1000)}",
            serial=self.serial,
            kind=kind,
            start_ts=ts,
            cause=cause,
            baseline_p95_ms=baseline_p95_ms,
            peak_p95_ms=peak_p95_ms,
            evidence=evidence,
            message="",
        )
        self.open[kind] = rec
        return rec

    def adopt(self, event: DriftEvent) -> OpenEvent:
        """Keep an event that an earlier run of the daemon opened and left open: its id and
        start stay, so the one event resolves when its condition clears."""
        self.serial += 1
        rec = OpenEvent(
            id=event.id,
            serial=self.serial,
            kind=event.kind,
            start_ts=event.start_ts,
            cause=event.cause,
            baseline_p95_ms=event.baseline_p95_ms,
            peak_p95_ms=event.peak_p95_ms,
            evidence=dict(event.evidence),
            message=event.message,
            reported_peak=event.peak_p95_ms,
        )
        self.open[event.kind] = rec
        return rec

    def instant(
        self,
        kind: str,
        ts: float,
        *,
        evidence: dict[str, Any],
        message: str,
        baseline_p95_ms: float | None,
    ) -> DriftEvent:
        """An event that begins and ends at one observation (a slow cold start, say)."""
        self.serial += 1
        return DriftEvent(
            id=f"{kind}-{round(ts * 1000)}",
            serial=self.serial,
            kind=kind,
            change="instant",
            start_ts=ts,
            end_ts=ts,
            cause="unknown",
            baseline_p95_ms=baseline_p95_ms,
            peak_p95_ms=None,
            evidence=evidence,
            message=message,
            ts=ts,
        )

    def close(self, kind: str, ts: float, why: str | None = None) -> DriftEvent:
        """Close the open event of `kind`; `why` says what ended it, in the message."""
        rec = self.open.pop(kind)
        why = why or rec.evidence.get("ended_because")
        rec.message = messages.closed_message(ts - rec.start_ts, rec.message, why)
        return snapshot(rec, "closed", ts, end_ts=ts)
