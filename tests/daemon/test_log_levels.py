"""The daemon's journal at WARNING holds what needs a look: a failed write, not a decision."""

from __future__ import annotations

import logging

import pytest

from llm_watchdog.actuators.base import ActuatorError, ApplyResult, ReadBack, verify_with
from llm_watchdog.control.law import ControlConfig
from llm_watchdog.daemon.steer import Steer
from tests.helpers.builders import FakeClock, probe_result

CFG = ControlConfig(target_p95_ms=100.0, default_allowance=8, drain_time_s=10.0)


class Actuator:
    """A serving layer that keeps what it is told, or refuses every write (`refuse`)."""

    name = "scripted"

    def __init__(self, refuse: str | None = None) -> None:
        self.allowance = 8
        self.refuse = refuse

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        if self.refuse is not None:
            return ApplyResult(ok=False, allowance=allowance, detail=self.refuse)
        self.allowance = allowance
        return ApplyResult(ok=True, allowance=allowance, detail="ok", lease_s=lease_s)

    def read_back(self) -> ReadBack:
        return ReadBack(allowance=self.allowance, inflight=0)

    def verify(self, expected: int, *, check_inflight: bool = True):
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        pass


def slow_chat(steer: Steer, clock: FakeClock, steps: int = 8) -> None:
    """Chat at 4x the target: the law cuts the allowance."""
    for _ in range(steps):
        for _ in range(3):
            steer.canary(probe_result(ttft_ms=400.0))
        clock.now += 5
        steer.step()


def steer_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name.startswith("llm_watchdog.daemon")
    ]


@pytest.mark.parametrize("dry_run", [False, True], ids=["written", "dry-run"])
def test_a_routine_allowance_decision_logs_at_info(store, caplog, dry_run) -> None:
    clock = FakeClock(1000.0)
    actuator = Actuator()
    steer = Steer(CFG, actuator, store, dry_run=dry_run, clock=clock, monotonic=clock)
    with caplog.at_level(logging.DEBUG):
        slow_chat(steer, clock)
    lines = steer_lines(caplog)
    said = "dry run: would set batch allowance 8 -> " if dry_run else "batch allowance 8 -> "
    assert any(level == logging.INFO and line.startswith(said) for level, line in lines), lines
    assert [line for level, line in lines if level >= logging.WARNING] == []
    assert (actuator.allowance < 8) is not dry_run


def test_a_failed_allowance_write_logs_at_warning(store, caplog) -> None:
    clock = FakeClock(1000.0)
    refused = "gateway at http://127.0.0.1:8090 answered 401: check control.token_file"
    steer = Steer(CFG, Actuator(refuse=refused), store, clock=clock, monotonic=clock)
    with caplog.at_level(logging.DEBUG):
        slow_chat(steer, clock)
    warned = [line for level, line in steer_lines(caplog) if level == logging.WARNING]
    assert warned and warned[0] == f"could not set the batch allowance: {refused}"


class Unreachable(Actuator):
    """A gateway that stops answering reads, then answers again."""

    def __init__(self) -> None:
        super().__init__()
        self.down: str | None = None

    def read_back(self) -> ReadBack:
        if self.down is not None:
            raise ActuatorError(self.down)
        return super().read_back()


def test_a_read_back_that_keeps_failing_is_said_when_it_starts_changes_and_every_5_min(
    store, caplog
) -> None:
    # The control loop steps every second: a gateway down for ten minutes must not write
    # 600 warnings to the journal.
    clock = FakeClock(1000.0)
    actuator = Unreachable()
    steer = Steer(CFG, actuator, store, clock=clock, monotonic=clock)
    refused = "cannot reach the gateway at http://127.0.0.1:8090: connection refused"
    with caplog.at_level(logging.DEBUG):
        steer.step()
        actuator.down = refused
        for _ in range(601):  # ten minutes, a step a second
            clock.now += 1
            steer.step()
        actuator.down = "the gateway at http://127.0.0.1:8090 answered 503"
        clock.now += 1
        steer.step()
        actuator.down = None
        clock.now += 1
        steer.step()
    lines = [(lv, m) for lv, m in steer_lines(caplog) if "read" in m and "the batch allowance" in m]
    assert lines == [
        (logging.WARNING, f"cannot read the batch allowance: {refused}"),
        (logging.WARNING, f"still cannot read the batch allowance, for 5 min: {refused}"),
        (logging.WARNING, f"still cannot read the batch allowance, for 10 min: {refused}"),
        (
            logging.WARNING,
            "cannot read the batch allowance: the gateway at http://127.0.0.1:8090 answered 503",
        ),
        (logging.INFO, "reads the batch allowance again, after 10 min"),
    ], lines


def test_a_write_refused_at_every_step_is_said_once_then_every_5_min(store, caplog) -> None:
    # A gateway that refuses every write (a wrong token) reads back the old allowance, so the
    # loop writes again at every step: one warning, not one a second.
    clock = FakeClock(1000.0)
    refused = "gateway at http://127.0.0.1:8090 answered 401: check control.token_file"
    actuator = Actuator(refuse=refused)
    steer = Steer(CFG, actuator, store, clock=clock, monotonic=clock)
    with caplog.at_level(logging.DEBUG):
        slow_chat(steer, clock)  # the cut, refused
        for _ in range(400):
            clock.now += 1
            steer.step()
        actuator.refuse = None
        clock.now += 1
        steer.step()
    lines = [(lv, m) for lv, m in steer_lines(caplog) if "the batch allowance" in m]
    assert [lv for lv, _ in lines] == [logging.WARNING, logging.WARNING, logging.INFO], lines
    assert lines[0][1] == f"could not set the batch allowance: {refused}"
    assert lines[1][1].startswith("still could not set the batch allowance, for 5 min")
    assert lines[2][1].startswith("sets the batch allowance again, after 7 min")


def test_a_write_refused_at_every_step_is_kept_once_a_minute_not_once_a_step(store) -> None:
    # The refusal is tried again at every step, but a day of a wrong token must not grow
    # the history by a row a second: one row when it starts, when what is asked or the
    # answer changes, and once a minute while it lasts.
    clock = FakeClock(1000.0)
    refused = "gateway at http://127.0.0.1:8090 answered 401: check control.token_file"
    actuator = Actuator(refuse=refused)
    steer = Steer(CFG, actuator, store, clock=clock, monotonic=clock)
    slow_chat(steer, clock)  # the cut, refused
    for _ in range(600):
        clock.now += 1
        steer.step()
    rows = store.rows(
        "SELECT ts, applied, apply_detail FROM control_actions WHERE applied = 0 ORDER BY ts"
    )
    assert 10 <= len(rows) <= 16, len(rows)  # 640 s of refusals
    assert {r["apply_detail"] for r in rows} == {refused}
    actuator.refuse = "gateway at http://127.0.0.1:8090 answered 503: it is restarting"
    clock.now += 1
    steer.step()
    last = store.rows("SELECT applied, apply_detail FROM control_actions ORDER BY id DESC LIMIT 1")
    assert last[0]["apply_detail"] == actuator.refuse  # a new answer is kept at once
    actuator.refuse = None
    clock.now += 1
    steer.step()
    last = store.rows("SELECT applied FROM control_actions ORDER BY id DESC LIMIT 1")
    assert last[0]["applied"] == 1
