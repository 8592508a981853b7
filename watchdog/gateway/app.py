"""The gateway's state and the Starlette app around it.

`Gateway` holds what lives as long as the server: one gate per class, the observer, the
connections to the engines (upstream.py), and the lease timer. `create_app(config)` wires
it into a Starlette app whose lifespan closes the connections at the end. The control API
and /metrics answer from here (see control.py); every other path goes to the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from starlette.applications import Starlette
from starlette.routing import Route

from llm_watchdog.gateway import control
from llm_watchdog.gateway.admission import Allowance, Change, ClassGate
from llm_watchdog.gateway.config import (
    BATCH,
    CHAT,
    CLASSES,
    ENGINE_SLOTS_AUTO,
    GatewayConfig,
    slot_line,
)
from llm_watchdog.gateway.observe import Observer, metrics_registry
from llm_watchdog.gateway.proxy import Proxy, is_own_path, retry_after_from
from llm_watchdog.gateway.upstream import Upstream
from llm_watchdog.probe.engine import (
    UNKNOWN,
    UNREACHABLE,
    detect_engine,
    engine_slots,
    slots_from_launch,
)

log = logging.getLogger("llm_watchdog.gateway")

# With `engine_slots` auto: how often the engine is asked for its slots until it answers,
# and after (an engine restarted with another --parallel), and how long one answer may take.
SLOTS_ASK_UNTIL_KNOWN_S = 10.0
SLOTS_ASK_KNOWN_S = 60.0
SLOTS_ASK_TIMEOUT_S = 2.0


class Gateway:
    """Everything one running gateway knows. Methods run on the server's event loop."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall
        # Control writes refused for want of the token: counted, and logged at most once a
        # REFUSED_LOG_EVERY_S (a guessing client would flood the journal otherwise).
        self.refused_writes = 0
        self.refused_logged_at = -math.inf
        # The slots the line is drawn from: given, or (auto) what the engine last said.
        self.engine_slots = max(config.engine_slots, 0)
        holds_line = config.engine_slots != 0
        self._slots_task: asyncio.Task[None] | None = None
        # The engine's systemd unit, where its command line is read when its process cannot.
        self.engine_unit = ""
        self.gates = {
            CHAT: ClassGate(CHAT, None, None, 0, clock),
            BATCH: ClassGate(
                BATCH,
                Allowance(
                    config.batch_default_allowance,
                    config.batch_ceiling,
                    config.batch_ramp_per_s,
                    config.batch_ramp_idle_s,
                ),
                config.max_queue_wait_s,
                config.max_queued,
                clock,
                # Without a line no admission pays for the check.
                room=self._under_slot_line if holds_line else None,
            ),
        }
        if holds_line:
            # Chat giving back a slot may let a batch request under the line.
            self.gates[CHAT].on_release = self.gates[BATCH].wake
        self.observer = Observer(CLASSES, config.ttft_ring_size)
        self.registry = metrics_registry(self.observer, self.metric_gauges)
        self.changes: deque[dict[str, object]] = deque(maxlen=100)
        self.lease_expirations = dict.fromkeys(CLASSES, 0)
        self.control_changes = dict.fromkeys(CLASSES, 0)
        self.preempted = dict.fromkeys(CLASSES, 0)
        # Request-body bytes held now, across every connection, under max_body_total_bytes:
        # from the first byte (or the declared length) until the body goes upstream.
        self.body_bytes = 0
        self._lease_timers: dict[str, asyncio.TimerHandle] = {}
        self.primary: Upstream
        self.secondary: Upstream | None = None

    def hold_body(self, more: int) -> bool:
        """Take `more` bytes of request body into the budget; False, taking none, when they
        would go past max_body_total_bytes."""
        if self.body_bytes + more > self.config.max_body_total_bytes:
            return False
        self.body_bytes += more
        return True

    def let_body_go(self, n: int) -> None:
        """`n` bytes held are upstream now, or dropped: back to the budget."""
        self.body_bytes -= n

    @property
    def slot_line(self) -> int | None:
        """Batch and chat in flight together under which batch is let in (None: no line)."""
        return slot_line(self.engine_slots)

    def _under_slot_line(self) -> bool:
        line = self.slot_line
        return line is None or sum(gate.inflight for gate in self.gates.values()) < line

    async def start(self) -> None:
        config = self.config
        self.primary = Upstream(config.upstream_url, config)
        if config.secondary_upstream_url:
            self.secondary = Upstream(config.secondary_upstream_url, config)
        if config.engine_slots == ENGINE_SLOTS_AUTO:
            self._slots_task = asyncio.create_task(self._ask_engine_slots())

    async def _ask_engine_slots(self) -> None:
        """Keep `engine_slots` to what the engine says (llama.cpp's /props, SGLang's
        /get_server_info), else to what its launch command sets (vLLM's --max-num-seqs, read
        from its process or its systemd unit); an engine that says neither, or does not
        answer, leaves the last."""
        while True:
            try:
                answered = await self._ask_engine_slots_once()
            except Exception as exc:  # one bad read must not end the asking for good
                log.warning("engine slots not read this time: %s", exc)
                answered = False
            # An engine that answered has said what it will say: ask it again only as often
            # as a restart with another --parallel needs.
            await asyncio.sleep(
                SLOTS_ASK_KNOWN_S if self.engine_slots or answered else SLOTS_ASK_UNTIL_KNOWN_S
            )

    async def _ask_engine_slots_once(self) -> bool:
        """One round of `_ask_engine_slots`; whether the engine answered at all."""
        info = await asyncio.to_thread(
            detect_engine, self.config.upstream_url, timeout_s=SLOTS_ASK_TIMEOUT_S
        )
        said, why = engine_slots(info), f"{info.engine} says so"
        if said is None and info.engine not in (UNREACHABLE, UNKNOWN):
            argv, _, _ = await asyncio.to_thread(
                control.upstream_launch, self.config.upstream_url, self.engine_unit
            )
            said = slots_from_launch(info.engine, shlex.join(argv) if argv else None)
            why = f"{info.engine}'s launch command sets it"
        if said is not None and said != self.engine_slots:
            self.set_engine_slots(said, why)
        return info.engine != UNREACHABLE

    def set_engine_slots(self, slots: int, why: str) -> None:
        was, self.engine_slots = self.slot_line, slots
        log.info(
            "engine slots %d (%s): batch let in while batch + chat in flight stay under %s",
            slots,
            why,
            self.slot_line,
        )
        if was is not None and self.slot_line is not None and self.slot_line > was:
            self.gates[BATCH].wake()

    async def close(self) -> None:
        if self._slots_task is not None:
            self._slots_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._slots_task
        for timer in self._lease_timers.values():
            timer.cancel()
        for gate in self.gates.values():
            gate.close()
        await self.primary.aclose()
        if self.secondary is not None:
            await self.secondary.aclose()

    # -- control -------------------------------------------------------------------------

    def authorized(self, header: str | None) -> bool:
        """Bearer token check in constant time; no token configured means no one is."""
        token = self.config.control_token
        if not token or not header:
            return False
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), token.encode())

    def set_allowance(self, cls: str, value: int, lease_s: float | None, reason: str) -> None:
        gate = self.gates[cls]
        assert gate.allowance is not None
        change = gate.allowance.set(
            value, lease_s, reason, self.clock(), self.wall(), gate.inflight
        )
        self._record(cls, change)
        self.control_changes[cls] += 1
        lease = "no lease" if lease_s is None else f"lease {lease_s:g} s"
        log.info(
            "%s allowance %d -> %d (%s): %s", cls, change.before, change.after, lease, reason or "-"
        )
        old = self._lease_timers.pop(cls, None)
        if old is not None:
            old.cancel()
        if lease_s is not None:
            self._arm_lease_timer(cls, lease_s)
        gate.wake()  # a raise lets queued requests in now
        self.preempt(cls)  # a cut under what runs ends the newest, where that is on

    def _arm_lease_timer(self, cls: str, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._lease_timers[cls] = loop.call_later(delay_s, self._on_lease_timer, cls)

    def _on_lease_timer(self, cls: str) -> None:
        self._lease_timers.pop(cls, None)
        allowance = self.gates[cls].allowance
        assert allowance is not None
        if not self.expire_leases():
            left = allowance.seconds_left(self.clock())
            if left is not None:  # the loop's timer fired a hair before our clock agreed
                self._arm_lease_timer(cls, left + 0.001)

    def expire_leases(self) -> bool:
        """Restore the default where a lease has run out; True if any did."""
        expired = False
        for cls, gate in self.gates.items():
            if gate.allowance is None:
                continue
            change = gate.allowance.expire(self.clock(), self.wall(), gate.inflight)
            if change is None:
                continue
            expired = True
            self._record(cls, change)
            self.lease_expirations[cls] += 1
            log.info(
                "%s allowance lease ran out: %d -> default %d (it was set for: %s)",
                cls,
                change.before,
                change.after,
                change.reason or "-",
            )
            timer = self._lease_timers.pop(cls, None)
            if timer is not None:
                timer.cancel()
            gate.wake()
            self.preempt(cls)  # a lease that had raised the allowance ends in a cut
        return expired

    def preempts(self, cls: str) -> bool:
        """Whether a cut of `cls` ends what runs: batch only, with --preempt-batch."""
        return cls == BATCH and self.config.preempt_batch

    def preempt(self, cls: str) -> int:
        """End the newest requests of `cls` in flight over its allowance, where the class
        pre-empts; returns how many. Chat is never pre-empted."""
        gate = self.gates[cls]
        allowance = gate.allowance
        if allowance is None or not self.preempts(cls) or gate.inflight <= allowance.value:
            return 0
        before = gate.inflight
        ended = gate.preempt(allowance.value)
        if ended:
            self.preempted[cls] += ended
            # One line per cut, not per request: a cut may end dozens at once.
            log.info(
                "pre-empted %d %s requests: allowance %d, in flight %d",
                ended,
                cls,
                allowance.value,
                before,
            )
        return ended

    def preempt_retry_after_s(self, cls: str) -> int:
        """Retry-After for a pre-empted request: 1 s, or the lease's end while paused.

        A retry waits in the gateway's queue, not at the engine, and the queue lets it in
        in order as places free up, so retrying soon costs the engine nothing. Only while
        the class is paused (allowance 0 under a lease) would a retry just wait out its
        queue wait; then it is told when the lease ends, as a 429 is.
        """
        allowance = self.gates[cls].allowance
        if allowance is None:
            return 1
        return retry_after_from(0.0, allowance.seconds_left(self.clock()), allowance.value)

    def _record(self, cls: str, change: Change) -> None:
        self.changes.append(change.to_dict(cls))

    def retry_after_s(self, cls: str) -> int:
        gate = self.gates[cls]
        allowance = gate.allowance
        if allowance is None:
            return 1
        left = allowance.seconds_left(self.clock())
        return retry_after_from(gate.max_queue_wait_s or 0.0, left, allowance.value)

    def priority_for(self, cls: str) -> int | None:
        rank = self.config.priorities.get(cls)
        if rank is None:
            return None
        return -rank if self.config.priority_higher_first else rank

    # -- what readers see ----------------------------------------------------------------

    def class_state(self, cls: str) -> dict[str, Any]:
        gate = self.gates[cls]
        a = gate.allowance
        return {
            "allowance": None if a is None else a.value,
            # What the ramp lets in now, on its way up to the allowance after a raise.
            "admitting": gate.limit(),
            "ramp_per_s": None if a is None else a.ramp_per_s,
            # An allowance left unused this long, with nobody waiting, ramps again (0: never).
            "ramp_idle_s": None if a is None else a.ramp_idle_s,
            "default_allowance": None if a is None else a.default,
            "ceiling": None if a is None else a.ceiling,
            "inflight": gate.inflight,
            "queued": gate.queued,
            "max_queue_wait_s": gate.max_queue_wait_s,
            "lease_expires_at": None if a is None else a.lease_expires_at,
            "reason": None if a is None else a.reason,
            "set_at": None if a is None else a.set_at,
            # Whether a cut ends what runs over it, and how many it ended since the start.
            "preempt": self.preempts(cls),
            # Batch is let in only while batch and chat in flight stay under this (None: no
            # line; the engine's slots are not known).
            "slot_line": self.slot_line if cls == BATCH else None,
            "engine_slots": (self.engine_slots or None) if cls == BATCH else None,
            "preempted": self.preempted[cls],
            "observed": self.observer[cls].summary(self.wall(), self.config.observed_window_s),
        }

    def control_state(self) -> dict[str, Any]:
        self.expire_leases()
        return {
            "now": self.wall(),
            "default_class": self.config.default_class,
            "upstream": self.config.upstream_url,
            "secondary_upstream": self.config.secondary_upstream_url,
            "classes": {cls: self.class_state(cls) for cls in CLASSES},
            "changes": list(self.changes)[-20:],
        }

    def ttft_since(self, cls: str, since: float) -> list[tuple[float, float]]:
        """(unix seconds, TTFT ms) of streamed answers whose first chunk came after `since`."""
        return self.observer[cls].ttft_since(since)

    def metrics_text(self) -> str:
        return generate_latest(self.registry).decode()

    def metric_gauges(self) -> dict[str, dict[str, float | None]]:
        self.expire_leases()
        gauges: dict[str, dict[str, float | None]] = {
            "inflight": {},
            "admitting": {},
            "queued": {},
            "allowance": {},
            "allowance_default": {},
            "allowance_ceiling": {},
            "lease_expires_timestamp_seconds": {},
            "lease_expirations": {},
            "control_changes": {},
            "preempted": {},
            "slot_line": {},
        }
        for cls, gate in self.gates.items():
            gauges["inflight"][cls] = gate.inflight
            gauges["admitting"][cls] = gate.limit()
            gauges["queued"][cls] = gate.queued
            a = gate.allowance
            if a is not None:
                gauges["allowance"][cls] = a.value
                gauges["allowance_default"][cls] = a.default
                gauges["allowance_ceiling"][cls] = a.ceiling
                gauges["lease_expires_timestamp_seconds"][cls] = a.lease_expires_at
                gauges["lease_expirations"][cls] = self.lease_expirations[cls]
                gauges["control_changes"][cls] = self.control_changes[cls]
                gauges["preempted"][cls] = self.preempted[cls]
                gauges["slot_line"][cls] = self.slot_line
        return gauges


def create_app(config: GatewayConfig) -> Starlette:
    """The gateway as an ASGI app; `app.state.gateway` is its `Gateway`."""
    gateway = Gateway(config)
    proxy = Proxy(gateway)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.close()

    routes = [
        Route("/control", control.get_control, methods=["GET"]),
        Route("/control/observed", control.get_observed, methods=["GET"]),
        Route("/control/identity", control.get_identity, methods=["GET"]),
        Route("/control/classes/{name}", control.get_class, methods=["GET"]),
        Route("/control/classes/{name}", control.put_class, methods=["PUT"]),
        Route("/metrics", MetricsEndpoint(gateway.registry), methods=["GET", "HEAD"]),
    ]
    app = GatewayApp(proxy, routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app


class _IdentityOnScrape:
    """Starts a read of the upstream's identity when a scrape finds the engine unnamed; the
    scrape itself never waits for it (its answer names the engine from the next one on)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._last_try = -math.inf

    def kick(self, app: Any) -> None:
        gw: Gateway = app.state.gateway
        now = time.monotonic()
        if gw.observer.engine != "unknown" or self._task is not None:
            return
        if now - self._last_try < control.IDENTITY_TTL_S:
            return
        self._last_try = now

        async def read() -> None:
            try:
                await control.read_identity(app.state, gw)
            except Exception as exc:  # an engine that will not say is "unknown", not a crash
                log.debug("upstream identity for the metrics labels: %s", exc)
            finally:
                self._task = None

        self._task = asyncio.get_running_loop().create_task(read())


class MetricsEndpoint:
    """prometheus-client's ASGI app over the gateway's registry, as a Starlette endpoint.

    A class instance, because Starlette wraps plain functions as request handlers and
    passes only instances through as ASGI apps.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.app = make_asgi_app(registry)
        self.identity = _IdentityOnScrape()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = scope.get("app")
        if app is not None:
            self.identity.kick(app)
        await self.app(scope, receive, send)


class GatewayApp(Starlette):
    """Starlette for the gateway's own paths; every other request goes to the proxy directly.

    The proxy skips Starlette's router and its two middlewares, which wrap `send` and so
    cost a call on every relayed chunk. Its own paths are /control... and /metrics; an
    engine's /metrics is read on the engine itself.
    """

    def __init__(self, proxy: Proxy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.proxy = proxy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not is_own_path(scope["path"]):
            await self.proxy(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
