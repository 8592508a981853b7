"""The headroom map's reads: each stored probe carries chat's rate from the control loop's
newest decision before it, so an earlier day's answer is read at the rate it was made at."""

from __future__ import annotations

from pathlib import Path

from llm_watchdog.control.headroom import observation_from
from llm_watchdog.control.law import ControlAction
from llm_watchdog.store.control import action_row, record_action
from llm_watchdog.store.db import Store
from llm_watchdog.store.headroom import MAX_RATE_AGE_S, probe_states
from tests.helpers.builders import probe_result


def decision(store: Store, ts: float, chat_per_s: float | None) -> None:
    action = ControlAction(ts, 4, 4, "hold 4", {"chat_per_s": chat_per_s}, kind="hold")
    record_action(store, action_row(action, ts=ts))


def test_a_probe_reads_chats_rate_from_the_newest_decision_before_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    decision(store, 900.0, 0.25)
    decision(store, 990.0, 0.75)  # the newest before the first probe
    decision(store, 1010.0, 2.0)  # after it: not its rate
    store.record_probe(probe_result(ts=1000.0, ttft_ms=400.0, batch_inflight=3), None)
    # The next decision before this one is too old to speak for it.
    store.record_probe(
        probe_result(ts=1010.0 + MAX_RATE_AGE_S + 5.0, ttft_ms=400.0, batch_inflight=3), None
    )
    decision(store, 3000.0, None)  # a decision with no rate yet
    store.record_probe(probe_result(ts=3001.0, ttft_ms=400.0, batch_inflight=3), None)
    rows = probe_states(store, 0.0)
    assert [r["chat_per_s"] for r in rows] == [0.75, None, None]
    assert [observation_from(r).chat_per_s for r in rows] == [0.75, None, None]
