"""The daemon's control loop against a real gateway over real sockets."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from llm_watchdog.actuators.base import ReadBack
from llm_watchdog.alerts import AlertConfig, AlertManager
from llm_watchdog.control.law import ControlConfig
from llm_watchdog.daemon.steer import Steer, gateway_steer
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.models import ProbeResult
from llm_watchdog.store.db import Store
from tests.daemon.test_start_up import RecordingSink
from tests.helpers.builders import FakeClock, probe_result
from tests.helpers.streamserver import StreamServer

TOKEN = "test-token"


def canary(ttft_ms: float) -> ProbeResult:
    return probe_result(ttft_ms=ttft_ms)


@contextlib.contextmanager
def rig(tmp_path: Path, **gateway: Any) -> Iterator[tuple[GatewayServer, Store]]:
    """A gateway (allowance 8 of 16, unless `gateway` says) before a stream server; a store."""
    settings: dict[str, Any] = {"batch_default_allowance": 8, "batch_ceiling": 16, **gateway}
    with (
        StreamServer(answer="ok") as upstream,
        GatewayServer(
            GatewayConfig(upstream_url=upstream.url, listen_port=0, control_token=TOKEN, **settings)
        ) as gw,
        Store(tmp_path / f"wd{len(list(tmp_path.glob('wd*.db')))}.db") as store,
    ):
        yield gw, store


def chat_at_4x_the_target(steer: Steer, clock: FakeClock) -> None:
    for _ in range(12):
        for _ in range(3):
            steer.canary(canary(400.0))
        clock.now += 5
        steer.step()


def test_slow_chat_cuts_the_allowance_at_the_gateway_and_the_write_is_verified(tmp_path):
    clock = FakeClock(1000.0)
    cfg = ControlConfig(
        target_p95_ms=100.0, default_allowance=8, ceiling=16, drain_time_s=10.0, lease_s=60.0
    )
    with rig(tmp_path) as (gw, store):
        steer = gateway_steer(cfg, gw.url, TOKEN, store, monotonic=clock, clock=clock)
        try:
            chat_at_4x_the_target(steer, clock)  # the law must cut
            state = httpx.get(f"{gw.url}/control").json()["classes"]["batch"]
            clock.now += 30  # a drain time later the next step verifies the last write
            steer.step()
        finally:
            steer.close()
        rows = store.rows("SELECT * FROM control_actions ORDER BY id")
    assert state["allowance"] < 8
    # every write carries a lease and the law's reason (the last one may be a renewal)
    assert state["lease_expires_at"] is not None and state["reason"].startswith(
        ("cut", "halve", "hold")
    )
    cuts = [r for r in rows if r["kind"] in ("cut", "halve")]
    assert cuts and all(r["applied"] == 1 for r in cuts)
    assert all(r["allowance_after"] < r["allowance_before"] for r in cuts)
    assert any(r["verify_kind"] == "ok" for r in rows)
    inputs = json.loads(cuts[0]["inputs"])
    assert inputs["samples"] == 3 and inputs["max_ttft_ms"] == 400.0
    assert inputs["latency_only"] is True  # no NVML here: the law runs on latency alone


def test_a_stop_with_a_cut_in_force_says_how_long_it_stays(tmp_path, caplog):
    import logging

    clock = FakeClock(1000.0)
    cfg = ControlConfig(
        target_p95_ms=100.0, default_allowance=8, ceiling=16, drain_time_s=10.0, lease_s=60.0
    )
    with rig(tmp_path) as (gw, store):
        steer = gateway_steer(cfg, gw.url, TOKEN, store, monotonic=clock, clock=clock)
        chat_at_4x_the_target(steer, clock)
        caplog.set_level(logging.INFO, logger="llm_watchdog")
        steer.close()
        state = httpx.get(f"{gw.url}/control").json()["classes"]["batch"]
    (line,) = [r.getMessage() for r in caplog.records if "stopped steering" in r.getMessage()]
    assert line == (
        f"stopped steering: the batch allowance stays {state['allowance']} for up to 60 s "
        "(its lease), then the serving layer's default 8"
    )


def test_a_dry_run_decides_and_records_but_leaves_the_gateway_alone(tmp_path):
    clock = FakeClock(1000.0)
    cfg = ControlConfig(target_p95_ms=100.0, default_allowance=8, ceiling=16, drain_time_s=10.0)
    with rig(tmp_path) as (gw, store):
        steer = gateway_steer(cfg, gw.url, TOKEN, store, monotonic=clock, clock=clock, dry_run=True)
        try:
            chat_at_4x_the_target(steer, clock)
            state = httpx.get(f"{gw.url}/control").json()["classes"]["batch"]
        finally:
            steer.close()
        rows = store.rows("SELECT * FROM control_actions ORDER BY id")
    assert state["allowance"] == 8 and state["lease_expires_at"] is None  # nothing written
    assert steer.allowance == 8 and steer.inflight == 0  # read back from the gateway
    cuts = [r for r in rows if r["kind"] in ("cut", "halve")]
    # Each cut is judged from what is really in force (8), so the law would cut again and
    # again, one drain time apart; none is applied, each says so.
    assert len(cuts) >= 2 and all(r["allowance_before"] == 8 for r in cuts)
    assert all(r["applied"] is None and r["apply_detail"] == "dry run: not written" for r in cuts)


class LyingActuator:
    """Says yes to every write and then reports something else."""

    name = "liar"

    def __init__(self, lying: bool = True) -> None:
        self.written: int | None = None
        self.lying = lying

    def apply(self, allowance: int, lease_s: float, reason: str):
        from llm_watchdog.actuators.base import ApplyResult

        self.written = allowance
        return ApplyResult(ok=True, allowance=allowance, detail="ok", lease_s=lease_s)

    def read_back(self) -> ReadBack:
        if not self.lying and self.written is not None:
            return ReadBack(allowance=self.written, inflight=0)
        return ReadBack(allowance=8, inflight=8)

    def verify(self, expected: int, *, check_inflight: bool = True):
        from llm_watchdog.actuators.base import verify_with

        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        pass


class Alerts:
    def __init__(self) -> None:
        self.sent: list = []

    def submit(self, alert) -> None:
        self.sent.append(alert)


def test_a_write_that_does_not_take_effect_raises_control_not_effective(store):
    clock = FakeClock(1000.0)
    alerts = Alerts()
    cfg = ControlConfig(target_p95_ms=100.0, default_allowance=8, drain_time_s=10.0)
    steer = Steer(cfg, LyingActuator(), store, alerts=alerts, clock=clock, monotonic=clock)
    for _ in range(12):
        for _ in range(3):
            steer.canary(canary(400.0))
        clock.now += 5
        steer.step()
    rows = store.rows(
        "SELECT verify_kind, verify_detail FROM control_actions WHERE verify_kind IS NOT NULL"
    )
    assert rows and rows[0]["verify_kind"] == "not_effective"
    assert "control not effective" in rows[0]["verify_detail"]
    assert [a.kind for a in alerts.sent][:1] == ["control_not_effective"]


def slow_chat(steer: Steer, clock: FakeClock, steps: int) -> None:
    for _ in range(steps):
        for _ in range(3):
            steer.canary(canary(400.0))
        clock.now += 5
        steer.step()


def control_alerts(sent: list) -> list[tuple[str, str, str | None]]:
    return [(a.state, a.key, a.cause) for a in sent if a.kind == "control_not_effective"]


def test_control_that_takes_effect_again_resolves_its_alert_once(store):
    clock = FakeClock(1000.0)
    alerts = Alerts()
    cfg = ControlConfig(target_p95_ms=100.0, default_allowance=8, drain_time_s=10.0)
    actuator = LyingActuator()
    steer = Steer(cfg, actuator, store, alerts=alerts, clock=clock, monotonic=clock)
    slow_chat(steer, clock, 6)
    assert control_alerts(alerts.sent)[:1] == [("firing", "control:not_effective:liar", "load")]
    actuator.lying = False  # the serving layer honours the writes again
    slow_chat(steer, clock, 12)
    fired = len([a for a in control_alerts(alerts.sent) if a[0] == "firing"])
    assert control_alerts(alerts.sent)[fired:] == [
        ("resolved", "control:not_effective:liar", "load")
    ]
    assert "allowance" in alerts.sent[-1].message and "in force" in alerts.sent[-1].message


def test_a_not_effective_alert_sent_before_a_restart_resolves_after_it(store):
    def run(actuator: LyingActuator, sink: RecordingSink) -> None:
        clock = FakeClock(1000.0)
        manager = AlertManager([sink], store, AlertConfig(tick_interval_s=None))
        try:
            cfg = ControlConfig(target_p95_ms=100.0, default_allowance=8, drain_time_s=10.0)
            steer = Steer(cfg, actuator, store, alerts=manager, clock=clock, monotonic=clock)
            slow_chat(steer, clock, 12)
            assert manager.flush(5)
        finally:
            manager.close()

    sink = RecordingSink()
    run(LyingActuator(), sink)
    assert control_alerts(sink.sent) == [("firing", "control:not_effective:liar", "load")]
    run(LyingActuator(lying=False), sink)  # restarted; the gateway honours writes now
    assert control_alerts(sink.sent) == [
        ("firing", "control:not_effective:liar", "load"),
        ("resolved", "control:not_effective:liar", "load"),  # the label Alertmanager matches
    ]


def test_chat_arrivals_and_in_flight_from_the_gateway_reach_the_law(tmp_path):
    clock = FakeClock(1000.0)
    cfg = ControlConfig(target_p95_ms=1000.0, default_allowance=8, ceiling=16, engine_slots=32)
    with rig(tmp_path) as (gw, store):
        steer = gateway_steer(cfg, gw.url, TOKEN, store, monotonic=clock, clock=clock)
        try:
            first = steer.step()  # no earlier count to take a difference from
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            for _ in range(3):
                httpx.post(f"{gw.url}/v1/chat/completions", json=body).raise_for_status()
            clock.now += 1
            second = steer.step()
            clock.now += 1
            third = steer.step()
        finally:
            steer.close()
    assert first.inputs["chat_arrivals"] is None and first.inputs["chat_inflight"] == 0
    assert (second.inputs["chat_arrivals"], second.inputs["chat_inflight"]) == (3, 0)
    assert second.inputs["samples"] == 3  # and their TTFTs, as before
    assert third.inputs["chat_arrivals"] == 0


def test_a_detected_slot_count_is_used_only_where_the_config_gives_none(tmp_path):
    with rig(tmp_path) as (gw, store):
        unset = gateway_steer(ControlConfig(target_p95_ms=1000.0), gw.url, TOKEN, store)
        given = gateway_steer(
            ControlConfig(target_p95_ms=1000.0, engine_slots=8), gw.url, TOKEN, store
        )
        try:
            unset.engine_slots(None)  # vLLM: not published
            assert unset.law.config.engine_slots == 0
            unset.engine_slots(4)  # llama.cpp /props total_slots
            given.engine_slots(4)
            assert (unset.law.config.engine_slots, given.law.config.engine_slots) == (4, 8)
        finally:
            unset.close()
            given.close()


def test_the_law_regrows_in_one_write_only_where_the_gateway_ramps(tmp_path):
    def after_one_step(ramp_per_s: float) -> tuple[bool, float | None]:
        with rig(tmp_path, batch_ramp_per_s=ramp_per_s) as (gw, store):
            steer = gateway_steer(ControlConfig(target_p95_ms=1000.0), gw.url, TOKEN, store)
            try:
                steer.step()
                ramp = httpx.get(f"{gw.url}/control").json()["classes"]["batch"]["ramp_per_s"]
                return steer.law.config.serving_ramps, ramp
            finally:
                steer.close()

    assert after_one_step(0.5) == (True, 0.5)  # the gateway's GET /control says it ramps
    assert after_one_step(0.0) == (False, 0.0)


def test_the_law_leaves_slot_cuts_to_a_gateway_that_holds_the_slot_line(tmp_path):
    def after_one_step(engine_slots: int) -> tuple[bool, int]:
        with rig(tmp_path, engine_slots=engine_slots) as (gw, store):
            steer = gateway_steer(ControlConfig(target_p95_ms=1000.0), gw.url, TOKEN, store)
            try:
                steer.step()
                return steer.law.config.serving_slots, steer.law.config.engine_slots
            finally:
                steer.close()

    # The gateway's GET /control names its line and the slots it was drawn from.
    assert after_one_step(16) == (True, 16)
    assert after_one_step(0) == (False, 0)


def daemon_settings(tmp_path: Path, gw: GatewayServer, target: str = "100ms") -> Any:
    from llm_watchdog.config import settings_from_dict

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return settings_from_dict(
        {
            "server": {"url": gw.url},
            "gpu": {"enabled": False},
            "storage": {"path": str(tmp_path / "unused.db")},
            "control": {"enabled": True, "gateway_url": gw.url, "token_file": str(token),
                        "target_p95": target, "drain_time": "10s"},
        },
        "test",
    )  # fmt: skip


def test_the_daemon_steps_its_control_loop_on_its_own_clock(tmp_path):
    from llm_watchdog.daemon.service import Daemon

    clock = FakeClock(5000.0)
    with rig(tmp_path) as (gw, store):
        daemon = Daemon(daemon_settings(tmp_path, gw), store, clock=clock, monotonic=clock)
        assert daemon.steer is not None
        try:
            chat_at_4x_the_target(daemon.steer, clock)
        finally:
            daemon.steer.close()
        rows = store.rows("SELECT ts, kind FROM control_actions ORDER BY id")
    cuts = [r for r in rows if r["kind"] in ("cut", "halve")]
    # A week simulated in minutes (tests/benchmarks/bench_soak.py --days) relies on this.
    assert cuts and all(5000.0 < r["ts"] <= clock.now for r in rows)


def test_a_restarted_daemon_starts_its_headroom_map_from_its_engines_stored_probes(tmp_path):
    import time

    from llm_watchdog.control.headroom import headroom_map
    from llm_watchdog.daemon.service import Daemon
    from tests.helpers.history import fill_headroom_history

    with rig(tmp_path) as (gw, store):
        settings = daemon_settings(tmp_path, gw, target="1s")
        first = Daemon(settings, store)
        first.refresh_identity()
        assert first.steer is not None and first.steer.law.map_prior == []  # nothing stored yet
        fill_headroom_history(store, time.time(), first.fingerprint_id)
        fill_headroom_history(store, time.time() - 7200, None)  # no engine named: not this one
        first.steer.close()
        again = Daemon(settings, store)  # the same engine, after a restart
        again.refresh_identity()
        assert again.steer is not None
        prior = again.steer.law.map_prior
        again.steer.close()
    assert again.fingerprint_id == first.fingerprint_id
    assert 600 < len(prior) < 720  # this engine's two hours, none of the other's
    rows = {r.state: r for r in headroom_map(prior, 1000.0)}
    assert (rows["cool"].allowance, rows["hot"].allowance) == (6, 3)


def test_the_law_judges_heat_against_where_the_cards_clocks_fall(store):
    from llm_watchdog.models import GpuSample

    clock = FakeClock(1000.0)
    cfg = ControlConfig(target_p95_ms=100.0, default_allowance=8)
    steer = Steer(cfg, LyingActuator(), store, clock=clock, monotonic=clock)
    seen: list = []
    step = steer.law.step
    steer.law.step = lambda inp: seen.append(inp.gpu) or step(inp)  # type: ignore[method-assign]
    sample = GpuSample(
        ts=1000.0, gpu_index=0, temp_c=75.0, sm_clock_mhz=1900.0, sm_clock_max_mhz=1900.0,
        throttle_reasons=0, temp_slowdown_c=93.0, temp_target_c=83.0,
    )  # fmt: skip
    steer.gpu(sample, onset_c=83.0)  # a GeForce card holding its 83 °C target
    steer.step()
    steer.gpu(sample)  # nothing known but NVML's SLOWDOWN
    steer.step()
    assert [g.temp_slowdown_c for g in seen] == [83.0, 93.0]
    assert [g.state for g in seen] == ["warm", "cool"]


COOL_CARD = dict(
    gpu_index=0, temp_c=60.0, sm_clock_mhz=1980.0, sm_clock_max_mhz=1980.0, throttle_reasons=0,
    temp_slowdown_c=90.0,
)  # fmt: skip


def steer_a_day(tmp_path: Path, yesterday: bool) -> tuple[int, list[str]]:
    """A restarted daemon steering a gateway whose batch job holds every request it is let
    run and queues more (demand 16), with fast chat through the gateway, 4 answers every 5 s,
    on a cool card, for five minutes (a fresh daemon reaches 16 in under two). With
    `yesterday`, its store holds this engine's probes of the day before
    (tests/helpers/history.py: chat slow at 7+ batch requests on the cool card). Returns the
    allowance the gateway ends at and the reasons the law recorded."""
    import threading
    import time

    from llm_watchdog.daemon.service import Daemon
    from llm_watchdog.models import GpuSample
    from tests.helpers.history import fill_headroom_history

    clock = FakeClock(time.time())
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    batch = {**chat, "model": "batch-job"}
    with (
        StreamServer(answer="ok", hold_model="batch-job") as upstream,
        GatewayServer(
            GatewayConfig(
                upstream_url=upstream.url, listen_port=0, control_token=TOKEN,
                batch_default_allowance=4, batch_ceiling=16, batch_ramp_per_s=0.0,
            )
        ) as gw,
        Store(tmp_path / f"{yesterday}.db") as store,
    ):  # fmt: skip
        settings = daemon_settings(tmp_path, gw, target="1s")
        settings = dataclasses.replace(
            settings,
            control=dataclasses.replace(settings.control, default_allowance=4, ceiling=16),
        )
        if yesterday:
            first = Daemon(settings, store, clock=clock, monotonic=clock)
            first.refresh_identity()
            fill_headroom_history(store, clock.now - 86400.0, first.fingerprint_id)
            assert first.steer is not None
            first.steer.close()
        daemon = Daemon(settings, store, clock=clock, monotonic=clock)
        daemon.refresh_identity()  # seeds the law's map from the stored probes, if any
        steer = daemon.steer
        assert steer is not None

        def batch_request() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{gw.url}/v1/chat/completions", json=batch, timeout=60,
                    headers={"x-traffic-class": "batch"},
                )  # fmt: skip

        for _ in range(16):
            threading.Thread(target=batch_request, daemon=True).start()
        try:
            with httpx.Client(base_url=gw.url, timeout=10) as client:
                for _ in range(60):
                    for _ in range(4):
                        client.post("/v1/chat/completions", json=chat).raise_for_status()
                    for _ in range(3):
                        steer.canary(canary(300.0))
                    steer.gpu(GpuSample(ts=clock.now, **COOL_CARD))
                    clock.now += 5
                    steer.step()
            allowance = httpx.get(f"{gw.url}/control").json()["classes"]["batch"]["allowance"]
        finally:
            steer.close()
            upstream.close()  # ends the held batch requests, so the gateway stops at once
        reasons = [r["reason"] for r in store.rows("SELECT reason FROM control_actions")]
    return allowance, reasons


def test_a_restarted_daemon_holds_growth_under_the_level_its_engine_failed_at_the_day_before(
    tmp_path,
):
    held, reasons = steer_a_day(tmp_path, yesterday=True)
    fresh, _ = steer_a_day(tmp_path, yesterday=False)
    assert fresh == 16  # with no earlier days, growth goes up to the batch job's demand
    assert held == 6, reasons[-5:]
    assert any(
        "held at the cool headroom map: chat surely misses the SLO's minutes at 7+ batch "
        "requests (earlier days' answers counted for another" in r
        for r in reasons
    ), reasons[-5:]


def test_a_restarted_steer_starts_from_the_surge_cap_its_engine_last_held(store):
    from llm_watchdog.store.control import surge_memory

    clock = FakeClock(1_000_000.0)
    cfg = ControlConfig(target_p95_ms=1000.0, default_allowance=8, surge_cap_retest_s=600.0)
    memory = {"cap": 6, "ratio": 3.0, "missed_at": 12, "hot": False, "clock_ratio": 0.98}

    def started(fingerprint_id: str) -> Steer:
        steer = Steer(cfg, LyingActuator(lying=False), store, clock=clock, monotonic=clock)
        steer.seed_headroom(fingerprint_id)
        return steer

    first = started("engine-a")
    assert first.law.seed_surge(memory)  # as if learned from a missed burst
    first.step()
    first.close()
    assert surge_memory(store, "engine-a", 0.0) == memory  # kept, under its engine
    clock.now += 3600.0
    again, other = started("engine-a"), started("engine-b")
    assert again.law.surge_cap == 6 and other.law.surge_cap is None
    moved = started("engine-a")
    moved.seed_headroom("engine-c")  # another engine behind the gateway, mid-run
    moved.step()
    assert surge_memory(store, "engine-c", 0.0) == memory  # its row holds what the law holds
    for _ in range(70):  # no surge for the retest time after the restart: the cap goes
        clock.now += 10.0
        again.step()
    assert again.law.surge_cap is None
    assert surge_memory(store, "engine-a", 0.0) is None  # and is not brought back
    assert started("engine-a").law.surge_cap is None
    # A cap kept more than a week ago is not started from.
    first = started("engine-a")
    assert first.law.seed_surge(memory)
    first.step()
    clock.now += 8 * 86400.0
    assert started("engine-a").law.surge_cap is None
