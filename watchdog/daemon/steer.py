"""The daemon's control loop: chat latency and GPU state in, the batch allowance out.

Glue between the pure `llm_watchdog.control.law.AllowanceController`, an actuator (the gateway by
default) and the store. Each step reads back what the serving layer has in force, asks the
law, writes the result with a lease (so a dead daemon's last cut runs out and the default
returns), records the decision with its inputs and reason, and a drain time after a write
checks that it took effect: the flag set is not always the behaviour got.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from llm_watchdog.actuators.base import (
    Actuator,
    ActuatorError,
    effective_event,
    not_effective_event,
    not_effective_key,
)
from llm_watchdog.actuators.gateway import GatewayActuator
from llm_watchdog.control.headroom import observation_from
from llm_watchdog.control.law import (
    AllowanceController,
    ControlAction,
    ControlConfig,
    ControlInput,
    GpuState,
)
from llm_watchdog.durations import human_duration
from llm_watchdog.errors import StorageError
from llm_watchdog.models import GpuSample, ProbeResult
from llm_watchdog.store.control import (
    action_row,
    record_action,
    record_verification,
    save_surge_memory,
    surge_memory,
    verification_row,
)
from llm_watchdog.store.db import Store
from llm_watchdog.store.headroom import probe_states

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("llm_watchdog.daemon.steer")

# Holds are the law's most common answer; one stored per minute is enough to show it ran.
HOLD_RECORD_EVERY_S = 60.0
REPEAT_S = 300.0  # how often a failure that lasts is said again
# The stored probes the headroom map starts from: the week `llm-watchdog headroom` reads.
MAP_SEED_S = 7 * 86400.0


class ChatObserver(Protocol):
    """Where real chat traffic is seen (the gateway): `observed(since_ts)` answers the
    `GET /control/observed` object, or raises ActuatorError."""

    def observed(self, since_ts: float) -> dict[str, Any]: ...


class Repeating:
    """Says a failure that repeats: when it starts, when its error changes, every `REPEAT_S`
    while it lasts ("still …, for 10 min"), and once when it ends."""

    def __init__(self, failing: str, again: str) -> None:
        self.failing, self.again = failing, again
        self.state: tuple[str, float, float] | None = None  # (error, since, said at)

    def failed(self, error: str, now_s: float) -> None:
        last = self.state
        if last is None or last[0] != error:
            log.warning("%s: %s", self.failing, error)
            self.state = (error, now_s if last is None else last[1], now_s)
        elif now_s - last[2] >= REPEAT_S:
            log.warning(
                "still %s, for %s: %s", self.failing, human_duration(now_s - last[1]), error
            )
            self.state = (error, last[1], now_s)

    def ok(self, now_s: float) -> None:
        if self.state is not None:
            log.info("%s, after %s", self.again, human_duration(now_s - self.state[1]))
            self.state = None


class Steer:
    """One control loop over one actuator."""

    def __init__(
        self,
        config: ControlConfig,
        actuator: Actuator,
        store: Store,
        *,
        alerts: Any | None = None,
        observer: ChatObserver | None = None,
        canaries_via_gateway: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        dry_run: bool = False,
    ) -> None:
        self.config = config
        # Read back and decide, never write (config `control.dry_run`).
        self.dry_run = dry_run
        self.law = AllowanceController(config)
        self.actuator = actuator
        self.store = store
        self.alerts = alerts
        self.clock = clock
        self.monotonic = monotonic
        # The gateway sees every chat request, canaries included: its TTFTs are the signal.
        self._observer = observer
        # When the canaries go through the gateway it has already seen them: do not count
        # them twice. When they go to the engine directly, both are signal.
        self._canaries_via_gateway = canaries_via_gateway
        self._observed_since: float | None = None
        self._chat_requests_total: int | None = None
        self._lock = threading.Lock()
        self._canary_ttfts: deque[float] = deque(maxlen=1000)
        self._failed_canaries = 0
        self._gpu: GpuSample | None = None
        self._onset_c: float | None = None
        self._pending: tuple[float, int, int] | None = None  # (check at, row id, allowance)
        self._last_write_s: float | None = None
        self._last_hold_record_s = -1e18
        # The last refused write kept in the history: (answer, when). A write refused at every
        # step (a wrong token) is tried again at every step, but kept as a row only when the
        # answer changes, or once a HOLD_RECORD_EVERY_S, as holds are: a day of refusals is
        # ~1,400 rows, not 86,400. What was asked need not match: a law that sees its cut
        # not in force decides it again, so a refused cut alternates with a refused renewal.
        self._last_refusal: tuple[str, float] | None = None
        # A read-back or a write that keeps failing (the gateway down, a token refused) is said
        # when it starts, when its error changes, and every REPEAT_S while it lasts, not at
        # every control step.
        self._reads = Repeating(
            "cannot read the batch allowance", "reads the batch allowance again"
        )
        self._writes = Repeating(
            "could not set the batch allowance", "sets the batch allowance again"
        )
        # The engine whose surge memory this run keeps (seed_headroom), and what was last kept.
        self._fingerprint_id: str | None = None
        self._surge_kept: dict[str, Any] | None = None
        self.allowance: int | None = None
        self.inflight: int | None = None
        self.last_action: ControlAction | None = None
        self.action_counts: dict[str, int] = {}  # by the law's kind, for /metrics
        self.not_effective = False
        # A not-effective alert fires (this run, or carried on from before a restart): the
        # next verification that passes resolves it.
        key = not_effective_key(actuator.name)
        self._alert_firing = key in getattr(alerts, "carried_keys", ())

    # ---- inputs, from the daemon's other jobs -------------------------------------------

    def canary(self, result: ProbeResult) -> None:
        with self._lock:
            if result.ok and result.ttft_ms is not None and not result.cold:
                self._canary_ttfts.append(result.ttft_ms)
            elif not result.ok and result.error_class in (
                "first_token_timeout",
                "total_timeout",
                "http_status",
                "server_error",
                "connect_refused",
                "connect_timeout",
            ):
                self._failed_canaries += 1

    def gpu(self, sample: GpuSample | None, onset_c: float | None = None) -> None:
        """The GPU the engine runs on, and where its clocks start to fall for heat (the
        lowest of its target, GPU_MAX and SLOWDOWN, nvml/thresholds.py); None: SLOWDOWN."""
        self._gpu = sample
        self._onset_c = onset_c

    def seed_headroom(self, fingerprint_id: str | None) -> int:
        """Start the law from what this engine taught it before a restart: the headroom map
        from its stored probes of the last week, so the first time the card turns hot after
        a restart the map already knows that state; and the surge cap the last run held, so
        the next burst is not met from a level one was missed from. Returns how many probes
        it kept (MAP_PRIOR_PER_CELL per state and load at most)."""
        since = self.clock() - MAP_SEED_S
        self._fingerprint_id = fingerprint_id
        # This engine's row holds what the law holds from the next step on.
        self._surge_kept = None
        memory = surge_memory(self.store, fingerprint_id, since)
        if memory is not None and self.law.seed_surge(memory):
            self._surge_kept = memory
            log.info(
                "surge cap starts at %d batch requests, as the last run on this engine left it",
                memory["cap"],
            )
        if not self.law.config.headroom:
            return 0
        rows = probe_states(self.store, since, fingerprint_id)
        kept = self.law.seed_map(observation_from(r) for r in rows)
        if kept:
            log.info("headroom map starts from %d stored probes of this engine", kept)
        return kept

    def engine_slots(self, slots: int | None) -> None:
        """The engine's slot count as detected; used only where the config gives none."""
        if not slots or self.config.engine_slots or self.law.config.engine_slots == slots:
            return
        log.info("engine runs %d sequences at once: batch kept off the slots chat needs", slots)
        self.law.config = replace(self.law.config, engine_slots=slots)

    def _serving_ramps(self, ramp_per_s: float | None) -> None:
        """Whether the serving layer ramps a raise, as it reports; the law regrows on it."""
        ramps = bool(ramp_per_s and ramp_per_s > 0)
        if ramp_per_s is None or self.law.config.serving_ramps == ramps:
            return
        if ramps:
            log.info(
                "the serving layer lets batch in at %g a second after a raise: "
                "what a passing chat surge shed comes back in one write",
                ramp_per_s,
            )
        self.law.config = replace(self.law.config, serving_ramps=ramps)

    def _serving_slots(self, slot_line: int | None, engine_slots: int | None) -> None:
        """Whether the serving layer holds batch under the engine's slots, as it reports;
        the law then makes no slot cut of its own."""
        holds = slot_line is not None
        self.engine_slots(engine_slots)
        if self.law.config.serving_slots == holds:
            return
        if holds:
            log.info(
                "the serving layer holds batch under %d engine slots (chat + batch in flight): "
                "no allowance cut for slots",
                slot_line,
            )
        self.law.config = replace(self.law.config, serving_slots=holds)

    # ---- one step ---------------------------------------------------------------------

    def _chat_seen(self) -> tuple[list[float], int, int | None, int | None]:
        """Chat since the last step: (TTFTs, failed canaries, arrivals, in flight now).

        Arrivals and in-flight come from the gateway only (None without it): the first
        reading, and one after the gateway restarted (its counter went back), has no
        difference to take.
        """
        with self._lock:
            canaries = list(self._canary_ttfts)
            failed = self._failed_canaries
            self._canary_ttfts.clear()
            self._failed_canaries = 0
        if self._observer is None:
            return canaries, failed, None, None
        since = self._observed_since if self._observed_since is not None else self.clock() - 30
        try:
            data = self._observer.observed(since)
            chat = data["ttft"]["chat"]
            self._observed_since = float(data.get("now", self.clock()))
            seen = [float(x["ttft_ms"]) for x in chat]
        except (ActuatorError, ValueError, KeyError, TypeError) as exc:
            log.debug("gateway TTFTs unavailable (%s); using canaries", exc)
            return canaries, failed, None, None
        ttfts = seen if self._canaries_via_gateway and seen else seen + canaries
        arrivals = inflight = None
        try:  # older gateways have no counts: TTFTs alone still steer
            total = int(data["work_requests_total"]["chat"])
            inflight = int(data["inflight"]["chat"])
        except (KeyError, TypeError, ValueError):
            total = None
        last, self._chat_requests_total = self._chat_requests_total, total
        if total is not None and last is not None and total >= last:
            arrivals = total - last
        return ttfts, failed, arrivals, inflight

    def step(self) -> ControlAction:
        now_s = self.monotonic()
        self._verify_due(now_s)
        try:
            rb = self.actuator.read_back()
            in_force, inflight, queued = rb.allowance, rb.inflight, rb.queued
            self.inflight = inflight
            self._serving_ramps(rb.ramp_per_s)
            self._serving_slots(rb.slot_line, rb.engine_slots)
            self._reads.ok(now_s)
        except ActuatorError as exc:
            self._reads.failed(str(exc), now_s)
            in_force, inflight, queued = self.allowance, None, None
        ttfts, failed, arrivals, chat_inflight = self._chat_seen()
        g = self._gpu
        gpu = (
            GpuState(
                g.throttle_reasons,
                g.sm_clock_mhz,
                g.sm_clock_max_mhz,
                temp_c=g.temp_c,
                temp_slowdown_c=self._onset_c if self._onset_c is not None else g.temp_slowdown_c,
            )
            if g is not None
            else None
        )
        action = self.law.step(
            ControlInput(
                now_s=now_s,
                chat_ttfts_ms=tuple(ttfts),
                failed_canaries=failed,
                gpu=gpu,
                batch_inflight=inflight,
                allowance=in_force,
                chat_arrivals=arrivals,
                chat_inflight=chat_inflight,
                batch_queued=queued,
            )
        )
        self.last_action = action
        self.action_counts[action.kind] = self.action_counts.get(action.kind, 0) + 1
        self._keep_surge_memory()
        target = action.allowance_after
        if self.dry_run:
            if action.changed:
                self._record_dry(action)
            else:
                self._record_hold(action, now_s)
            # The law judges the next step from what is really in force.
            self.allowance = in_force
            return action
        # Write on a change, when the serving layer has drifted from the law (a lease ran
        # out, the gateway restarted), and in time to renew the lease.
        renew = self._last_write_s is None or now_s - self._last_write_s > self.config.lease_s / 3
        if action.changed or in_force != target or renew:
            self._write(action, target, now_s)
        else:
            self._record_hold(action, now_s)
        self.allowance = target
        return action

    def _keep_surge_memory(self) -> None:
        """Store the law's surge memory when it changes, for a restart to start from."""
        memory = self.law.surge_memory()
        if memory == self._surge_kept:
            return
        try:
            save_surge_memory(self.store, self._fingerprint_id, memory, self.clock())
        except StorageError as exc:  # the next change tries again; steering goes on
            log.warning("could not keep the surge cap for a restart: %s", exc)
            return
        self._surge_kept = memory

    def _record_hold(self, action: ControlAction, now_s: float) -> None:
        if now_s - self._last_hold_record_s >= HOLD_RECORD_EVERY_S:
            self._last_hold_record_s = now_s
            record_action(self.store, action_row(action, ts=self.clock()))

    def _record_dry(self, action: ControlAction) -> None:
        # A decision as designed: `history --control` keeps it, the journal's WARNING is for
        # what needs a look.
        log.info(
            "dry run: would set batch allowance %d -> %d: %s",
            action.allowance_before,
            action.allowance_after,
            action.reason,
        )
        row = action_row(
            action,
            ts=self.clock(),
            actuator=self.actuator.name,
            apply_detail="dry run: not written",
        )
        record_action(self.store, row)

    def _write(self, action: ControlAction, target: int, now_s: float) -> None:
        res = self.actuator.apply(target, self.config.lease_s, action.reason)
        if not res.ok:
            self._writes.failed(res.detail, now_s)
            last = self._last_refusal
            if last is not None and last[0] == res.detail and now_s - last[1] < HOLD_RECORD_EVERY_S:
                return
            self._last_refusal = (res.detail, now_s)
        else:
            self._last_refusal = None
        row = action_row(
            action,
            ts=self.clock(),
            actuator=self.actuator.name,
            lease_s=self.config.lease_s,
            applied=res.ok,
            apply_detail=res.detail,
        )
        row_id = record_action(self.store, row)
        if res.ok:
            self._writes.ok(now_s)
            self._last_write_s = now_s
            if action.changed:
                log.info(
                    "batch allowance %d -> %d: %s", action.allowance_before, target, action.reason
                )
                self._pending = (now_s + self.config.drain_time_s, row_id, target)

    def _verify_due(self, now_s: float) -> None:
        if self._pending is None or now_s < self._pending[0]:
            return
        _, row_id, expected = self._pending
        self._pending = None
        v = self.actuator.verify(expected)
        rb = v.read_back
        done = verification_row(
            ts=self.clock(),
            kind=v.kind,
            detail=v.detail,
            allowance=rb.allowance if rb else None,
            inflight=rb.inflight if rb else None,
            queued=rb.queued if rb else None,
        )
        record_verification(self.store, row_id, done)
        self.not_effective = not v.ok
        if not v.ok:
            log.warning("%s", v.detail)
            alert = not_effective_event(v, ts=self.clock(), target=self.actuator.name)
        elif self._alert_firing:
            log.info("%s: control takes effect again", v.detail)
            alert = effective_event(v, ts=self.clock(), target=self.actuator.name)
        else:
            alert = None
        if alert is not None and self.alerts is not None:
            self.alerts.submit(alert)
            self._alert_firing = alert.state == "firing"

    def snapshot(self) -> dict[str, Any]:
        a = self.last_action
        return {
            "actuator": self.actuator.name,
            "allowance": self.allowance,
            "inflight": self.inflight,
            "actions": dict(self.action_counts),
            "not_effective": self.not_effective,
            "last": None
            if a is None
            else {
                "kind": a.kind,
                "before": a.allowance_before,
                "after": a.allowance_after,
                "reason": a.reason,
                "p95_est_ms": a.p95_est_ms,
            },
        }

    def close(self) -> None:
        """Stop steering. The last write stays in force until its lease runs out (a restart
        picks up from it), and then the serving layer goes back to its default: said, so
        that a cut still in force after a stop is not a mystery."""
        default = self.config.default_allowance
        if self._last_write_s is not None and self.allowance not in (None, default):
            log.info(
                "stopped steering: the batch allowance stays %s for up to %.0f s (its lease), "
                "then the serving layer's default %d",
                self.allowance,
                self.config.lease_s,
                default,
            )
        self.actuator.close()


def gateway_steer(
    config: ControlConfig,
    url: str,
    token: str | None,
    store: Store,
    *,
    transport: httpx.BaseTransport | None = None,
    **kwargs: Any,
) -> Steer:
    """A loop over the project's gateway, which is also where chat's own TTFTs come from."""
    gateway = GatewayActuator(url, token, transport)
    return Steer(config, gateway, store, observer=gateway, **kwargs)
