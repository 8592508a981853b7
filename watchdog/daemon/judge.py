"""The daemon's judging side: probes in, drift events and alerts out.

Glue between the pure `llm_watchdog.drift.DriftMonitor`, the store and the alert manager, so the
daemon only hands it what it measured. The monitor is the same code `replay` runs.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import replace
from typing import Any

from llm_watchdog.alerts import AlertEvent
from llm_watchdog.drift import DriftEvent, DriftMonitor, observation_from
from llm_watchdog.drift.messages import closed_message
from llm_watchdog.durations import human_ms
from llm_watchdog.models import GpuEvent, GpuSample, ProbeResult
from llm_watchdog.store.db import Store
from llm_watchdog.store.records import active_baseline, open_events, save_baseline, save_event

log = logging.getLogger("llm_watchdog.daemon.judge")

# Why an event left open by an earlier run, and not taken over by this one, ends.
RESTARTED = "daemon restarted"

# Drift event kinds as the alert rules name them.
ALERT_KIND = {
    "latency": "chat_slowed",
    "quality": "quality_failed",
    "heat_warning": "heat_warning",
    "cold_start_slow": "cold_start_slow",
    "probes_failing": "probes_failing",
    "baseline_invalidated": "baseline_invalidated",
}
TITLES = {
    "chat_slowed": "Chat slowed",
    "quality_failed": "Canary answers changed",
    "heat_warning": "GPU close to throttling",
    "cold_start_slow": "Slow cold start",
    "probes_failing": "Canary probes failing",
    "baseline_invalidated": "Runtime changed: re-baselining",
    "telemetry_lost": "GPU telemetry lost",
    "control_not_effective": "Batch allowance not applied",
}


def alert_for(event: DriftEvent, target_p95_ms: float | None = None) -> AlertEvent | None:
    """The alert a drift snapshot raises: opening fires, closing resolves, updates are quiet.

    `target_p95_ms` is the chat TTFT p95 promised to users (`control.target_p95`): a chat
    slowdown that still keeps it is a warning, one past it critical (see `chat_severity`).
    """
    kind = ALERT_KIND.get(event.kind)
    if kind is None or event.change == "updated":
        return None
    state = "resolved" if event.change == "closed" else "firing"
    severity, message = None, event.message
    fields = event.to_dict()
    if kind == "chat_slowed" and state == "firing":
        # The opening message says the p95 it fired on (its peak so far): the clause does not
        # say it again.
        severity, said = chat_severity(event.peak_p95_ms, target_p95_ms, figure=False)
        message += said
        if target_p95_ms is not None:
            fields["target_p95_ms"] = target_p95_ms
    # A resolved alert needs no severity of its own: the policy sends it with its firing
    # alert's, so that it reaches the same sinks.
    return AlertEvent(
        key=f"drift:{event.id}",
        kind=kind,
        state=state,
        ts=event.end_ts if state == "resolved" and event.end_ts else event.start_ts,
        title=TITLES[kind],
        message=message,
        cause=event.cause,
        severity=severity,
        fields=fields,
    )


def chat_severity(
    p95_ms: float | None, target_p95_ms: float | None, figure: bool = True
) -> tuple[str, str]:
    """The severity of a chat slowdown and the clause that says why; without `figure` the
    clause leaves the p95 out, for a message that has just said it.

    Drift is measured against the baseline, but the promise is the target: chat that has
    slowed yet still answers within it warns rather than pages, so that a page at night
    always means users wait longer than promised. Without a target or a p95 it stays
    critical, the kind's default.
    """
    if target_p95_ms is None or p95_ms is None:
        return "critical", ""
    # Each figure in its own unit: "0.8 s" beside "1.5 s" hides the 20 ms that matter.
    p95, target = human_ms(p95_ms), human_ms(target_p95_ms)
    said = f"p95 {p95}," if figure else "p95"
    if p95_ms <= target_p95_ms:
        return "warning", f"; {said} within the {target} target"
    return "critical", f"; {said} over the {target} target"


# What each failure kind (llm_watchdog.models.ERROR_CLASSES) says about the server, for the
# "probes failing" alert.
FAILURE_MEANS = {
    "connect_refused": "nothing listens at {url}",
    "connect_timeout": "no connection to {url} within the connect timeout",
    "first_token_timeout": "{url} accepts the request but sends no token in time",
    "total_timeout": "answers from {url} do not finish in time",
    "http_status": "{url} answers with an HTTP error",
    "protocol_error": "the stream from {url} cannot be read",
    "server_error": "{url} sends an error inside its stream",
    "stale_connection": "{url} closes kept-alive connections before answering",
    "over_length": "answers from {url} run past the probe's bound",
}


def failing_alert(alert: AlertEvent, failures: deque[tuple[str, str]]) -> AlertEvent:
    """A "probes failing" alert that names the failure most of the recent probes had: the
    drift monitor counts failures, the probe results say what kind they were."""
    kinds = Counter(kind for kind, _ in failures)
    if not kinds:
        return alert
    kind, n = kinds.most_common(1)[0]
    url = next((u for k, u in reversed(failures) if k == kind), "the server")
    means = FAILURE_MEANS.get(kind, "{url}").format(url=url)
    share = f"{n} of the last {len(failures)} failures" if len(kinds) > 1 else "every failure"
    message = f"{alert.message}: {share} {kind}, {means}"
    # The cause stays the event's: it is a label in Alertmanager, and the resolved alert,
    # built from the event, must carry the same labels to end the firing one.
    return replace(alert, message=message, fields={**alert.fields, "failure": kind})


def telemetry_key(gpu_index: int | None) -> str:
    """The alert key of GPU telemetry lost: per GPU, or for NVML as a whole (None)."""
    return f"telemetry:{gpu_index}"


def telemetry_alert(ev: GpuEvent) -> AlertEvent | None:
    if ev.kind in ("gpu_lost", "nvml_timeout"):
        state = "firing"
    elif ev.kind == "gpu_recovered":
        state = "resolved"
    else:
        return None
    what = f"GPU {ev.gpu_index}" if ev.gpu_index is not None else "NVML"
    message = {
        "gpu_lost": f"{what} fell off the bus or stopped answering NVML: {ev.detail}",
        "nvml_timeout": f"an NVML call on {what} hung: {ev.detail}",
        "gpu_recovered": f"{what} answers NVML again",
    }[ev.kind]
    return AlertEvent(
        key=telemetry_key(ev.gpu_index),
        kind="telemetry_lost",
        state=state,
        ts=ev.ts,
        title=TITLES["telemetry_lost"],
        message=message,
    )


class Judge:
    """One DriftMonitor for the daemon's current fingerprint, persisted and alerting."""

    def __init__(
        self,
        store: Store,
        drift_config: Any,
        alerts: Any | None = None,
        *,
        target_p95_ms: float | None = None,
    ) -> None:
        self.store = store
        self.alerts = alerts
        self.target_p95_ms = target_p95_ms  # the chat SLO: sets chat_slowed's severity
        self.drift_config = drift_config
        self.monitor = DriftMonitor(drift_config)  # replaced once the fingerprint is known
        self.fingerprint_id: str | None = None
        # (error class, url) of the latest failed probes, as many as the failure window.
        self.failures: deque[tuple[str, str]] = deque(maxlen=drift_config.fail_window)
        self._answered: set[int | None] = set()  # GPUs (None: NVML) read since start
        # Chat slowdowns this run saw open within the target (a warning), and those of them
        # whose p95 has since passed it (paged once, as critical, under their own key).
        self._within: set[str] = set()
        self._over: set[str] = set()

    def set_fingerprint(self, fingerprint_id: str, ts: float) -> list[DriftEvent]:
        """Judge against the baseline of this runtime; a change of runtime re-baselines."""
        if fingerprint_id == self.fingerprint_id:
            return []
        first = self.fingerprint_id is None
        self.fingerprint_id = fingerprint_id
        if first:
            self.monitor = DriftMonitor(self.drift_config, fingerprint_id=fingerprint_id)
            events: list[DriftEvent] = []
        else:
            events = self.monitor.set_fingerprint(fingerprint_id, ts)
        stored = active_baseline(self.store, fingerprint_id)
        if stored is not None:
            events += self.monitor.load_baseline(stored, ts)
            log.info(
                "baseline for %s: p50 %.0f ms, p95 %.0f ms from %d probes (%s)",
                fingerprint_id,
                stored.ttft_p50_ms,
                stored.ttft_p95_ms,
                stored.n,
                stored.source,
            )
        self._publish(events)
        if first:
            self.take_over(ts)
        return events

    def take_over(self, ts: float) -> list[DriftEvent]:
        """Carry on the events an earlier run left open, or close them, at start-up.

        Like an alert manager: one open event per condition, resolved when the condition
        clears. The newest open event of a kind the monitor can resume stays open under its
        id (see DriftMonitor.adopt); every other one (an older duplicate, a latency event
        whose detector starts over) ends now, "daemon restarted", and keeps its row. Returns
        the events closed.
        """
        closed: list[DriftEvent] = []
        left = open_events(self.store)
        newest = {event.kind: event.id for event, _ in left}  # oldest first: the last wins
        for event, fingerprint_id in left:
            same = fingerprint_id == self.fingerprint_id
            if newest[event.kind] == event.id and self.monitor.adopt(event, same_runtime=same):
                log.info("carrying on %s, open since an earlier run", event.id)
                continue
            end = max(ts, event.start_ts)
            done = replace(
                event,
                change="closed",
                end_ts=end,
                evidence=dict(event.evidence, ended_because=RESTARTED),
                message=closed_message(end - event.start_ts, event.message, RESTARTED),
                ts=end,
            )
            save_event(self.store, done, fingerprint_id)
            log.info("%s", done.message)
            alert = alert_for(done, self.target_p95_ms)
            if alert is not None and self.alerts is not None:
                self.alerts.submit(alert)
                over = self._past_target(done, None)  # its page past the target ends too
                if over is not None:
                    self.alerts.submit(over)
            closed.append(done)
        return closed

    def observe(
        self,
        result: ProbeResult,
        gpu: GpuSample | None,
        *,
        temp_slowdown_c: float | None = None,
        temp_target_c: float | None = None,
        temp_threshold: str | None = None,
        batch_inflight: float | None = None,
        batch_allowance: float | None = None,
    ) -> list[DriftEvent]:
        """Judge one probe beside the GPU it ran on; `temp_target_c` is where that GPU's clocks
        start to fall and `temp_threshold` which threshold that is (nvml.thresholds)."""
        if not result.ok:
            self.failures.append((result.error_class or "unknown", result.url))
        obs = observation_from(
            result,
            gpu,
            cold=result.cold,
            batch_inflight=batch_inflight,
            batch_allowance=batch_allowance,
            temp_slowdown_c=temp_slowdown_c,
            temp_target_c=temp_target_c,
            temp_threshold=temp_threshold,
        )
        events = self.monitor.observe(obs)
        learned = self.monitor.pop_new_baseline()
        if learned is not None:
            save_baseline(self.store, learned)
            log.info(
                "learned a baseline from %d warm probes: p50 %.0f ms, p95 %.0f ms",
                learned.n,
                learned.ttft_p50_ms,
                learned.ttft_p95_ms,
            )
        self._publish(events)
        return events

    def reload_baseline(self, ts: float) -> None:
        """Pick up a baseline captured or reset from the CLI while the daemon runs."""
        if self.fingerprint_id is None:
            return
        stored = active_baseline(self.store, self.fingerprint_id)
        current = self.monitor.baseline
        if stored is None and current is not None and current.source == "capture":
            self._publish(self.monitor.reset_baseline(ts))
        elif stored is not None and stored != current:
            self._publish(self.monitor.load_baseline(stored, ts))

    def gpu_event(self, ev: GpuEvent) -> None:
        alert = telemetry_alert(ev)
        if alert is not None and self.alerts is not None:
            self.alerts.submit(alert)

    def gpu_answered(self, samples: list[GpuSample]) -> None:
        """Resolve a telemetry alert an earlier run sent for a GPU that samples again.

        This run's reader never saw that GPU lost, so it tells no recovery: the first reading
        of each GPU after a restart is the recovery. Once per GPU and run."""
        if self.alerts is None or not samples:
            return
        seen = dict.fromkeys([*(s.gpu_index for s in samples), None])
        fresh = [i for i in seen if i not in self._answered]
        if not fresh:
            return
        self._answered.update(fresh)
        carried = set(getattr(self.alerts, "carried_keys", ()))
        for index in fresh:
            if telemetry_key(index) not in carried:
                continue
            alert = telemetry_alert(GpuEvent(samples[0].ts, "gpu_recovered", index, ""))
            if alert is not None:
                self.alerts.submit(alert)

    def _publish(self, events: list[DriftEvent]) -> None:
        for ev in events:
            save_event(self.store, ev, self.fingerprint_id)
            # An event opening or closing is the monitor working as designed, and its alert
            # carries the severity; the journal's WARNING is for faults of the watchdog.
            if ev.change != "updated":
                log.info("%s", ev.message)
            alert = alert_for(ev, self.target_p95_ms)
            if alert is not None and alert.kind == "probes_failing" and alert.state == "firing":
                alert = failing_alert(alert, self.failures)
            if alert is not None and self.alerts is not None:
                self.alerts.submit(alert)
            over = self._past_target(ev, alert)
            if over is not None and self.alerts is not None:
                self.alerts.submit(over)

    def _past_target(self, ev: DriftEvent, alert: AlertEvent | None) -> AlertEvent | None:
        """The page for a chat slowdown that opened within the target and has since passed
        it, and its resolution when the slowdown ends.

        Updates of an event send nothing, so without this a slowdown that opens as a warning
        and grows past the target would never reach a pager set to critical. It fires once,
        under its own key. Nothing is followed across a restart: a slowdown open then is
        closed at start-up (its detector's sums start over, see `take_over`), which resolves
        this page too where an earlier run sent it.
        """
        if ALERT_KIND.get(ev.kind) != "chat_slowed" or self.target_p95_ms is None:
            return None
        key = f"drift:{ev.id}:over_target"
        if ev.change == "opened":
            if alert is not None and alert.level == "warning":
                self._within.add(ev.id)
            return None
        if ev.change == "closed":
            self._within.discard(ev.id)
            # Paged by this run, or by an earlier one whose alert manager carried it over.
            carried = key in getattr(self.alerts, "carried_keys", ())
            if ev.id not in self._over and not carried:
                return None
            self._over.discard(ev.id)
            return AlertEvent(
                key=key,
                kind="chat_slowed",
                state="resolved",
                ts=ev.end_ts or ev.ts,
                title=TITLES["chat_slowed"],
                # Not the slowdown's own resolution word for word: a sink that shows both
                # (the demo's screen, a webhook taking every severity) would show it twice.
                message=(
                    f"The slowdown that passed the {human_ms(self.target_p95_ms)} target has "
                    f"ended: {ev.message}"
                ),
                cause=ev.cause,
                fields=ev.to_dict(),
            )
        peak = ev.peak_p95_ms
        if ev.id not in self._within or ev.id in self._over or peak is None:
            return None
        if peak <= self.target_p95_ms:
            return None
        self._over.add(ev.id)
        _, said = chat_severity(peak, self.target_p95_ms)
        return AlertEvent(
            key=key,
            kind="chat_slowed",
            state="firing",
            ts=ev.ts,
            title=TITLES["chat_slowed"],
            message=f"{ev.message}; now{said.removeprefix(';')}",
            cause=ev.cause,
            severity="critical",
            fields=dict(ev.to_dict(), target_p95_ms=self.target_p95_ms),
        )
