"""`llm-watchdog headroom` and the `status` row over a database of stored probes."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.models import GpuSample
from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result
from tests.helpers.history import fill_headroom_history as fill


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env or {}, obj={})


def test_headroom_names_a_lower_allowance_once_the_card_is_hot(db_path):
    now = time.time()
    with Store(db_path) as store:
        fill(store, now)
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path), "LLM_WATCHDOG__CONTROL__TARGET_P95": "1s"}
    out = invoke("headroom", "--since", "3h", "--json", env=env)
    assert out.exit_code == 0, out.output
    rows = {r["state"]: r for r in map(json.loads, out.output.splitlines())}
    assert rows["cool"]["allowance"] == 6 and rows["hot"]["allowance"] == 3
    assert rows["hot"]["current"] and not rows["cool"]["current"]
    assert rows["cool"]["n"] + rows["hot"]["n"] > 600
    text = invoke("headroom", "--since", "3h", env=env)
    assert text.exit_code == 0 and "hot     3" in text.output and "← now" in text.output
    status = invoke("status", env=env)
    assert status.exit_code == 0, status.output
    assert "headroom     hot     3" in status.output


def test_headroom_without_load_counts_says_what_to_turn_on(db_path):
    with Store(db_path) as store:
        store.record_probe(probe_result(ts=time.time() - 60), None)
    out = invoke("headroom", env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)})
    assert out.exit_code == 0, out.output
    assert "not enough data yet" in out.output and "control.enabled" in out.output


def test_headroom_bad_since_is_a_usage_error(db_path):
    with Store(db_path):
        pass
    out = invoke(
        "headroom", "--since", "yesterday-ish", env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    )
    assert out.exit_code == 2 and "Traceback" not in out.output


def test_the_reports_headroom_table_covers_its_span_only(db_path, tmp_path):
    now = time.time()
    with Store(db_path) as store:
        fill(store, now)
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path), "LLM_WATCHDOG__CONTROL__TARGET_P95": "1s"}

    def page(*span: str) -> str:
        out_file = tmp_path / "r.html"
        out = invoke("report", *span, "--out", str(out_file), env=env)
        assert out.exit_code == 0, out.output
        return out_file.read_text()

    # The first, cool hour alone: the hot row is not in it.
    first_hour = page("--since", "2h", "--until", "1h")
    assert "<h2>Headroom</h2>" in first_hour
    assert ">hot<" not in first_hour and ">cool<" in first_hour
    # A span long before any probe: no table at all.
    assert "<h2>Headroom</h2>" not in page("--since", "2020-01-01", "--until", "2020-01-02")


def test_a_report_on_a_gpu_the_span_has_no_samples_of_is_a_usage_error(db_path, tmp_path):
    with Store(db_path) as store:
        fill(store, time.time())
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    out = invoke("report", "--gpu", "3", "--out", str(tmp_path / "r.html"), env=env)
    assert out.exit_code == 2, out.output
    assert "no samples of GPU 3 in this span; it has GPU 0" in out.output
    assert not (tmp_path / "r.html").exists()
    assert invoke("report", "--gpu", "0", "--out", str(tmp_path / "r.html"), env=env).exit_code == 0


def fill_few_slow(store: Store, now: float) -> None:
    """Six hours of probes every 10 s on a cool card, 0-6 batch in flight in turn: none slow
    at 0-2, one in 50 at 3-4 (a pooled p95 well within the target), one in 3 above."""
    ts, i = now - 6 * 3600.0, 0
    while ts < now - 10:
        inflight = i % 7
        every = 0 if inflight <= 2 else 50 if inflight <= 4 else 3
        slow = every and (i // 7) % every == 0
        store.record_gpu_samples(
            [
                GpuSample(
                    ts=ts - 1.0,
                    gpu_index=0,
                    temp_c=55.0,
                    sm_clock_mhz=1980.0,
                    sm_clock_max_mhz=1980.0,
                    throttle_reasons=0,
                    temp_slowdown_c=90.0,
                )
            ]
        )
        store.record_probe(
            probe_result(ts=ts, ttft_ms=2600.0 if slow else 350.0, batch_inflight=inflight), None
        )
        ts += 10.0
        i += 1


def test_headroom_judged_by_the_slos_minutes_names_less_than_the_pooled_p95(db_path):
    with Store(db_path) as store:
        fill_few_slow(store, time.time())
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path), "LLM_WATCHDOG__CONTROL__TARGET_P95": "1s"}
    pooled = invoke("headroom", "--since", "7h", "--json", env=env)
    minute = invoke("headroom", "--since", "7h", "--json", "--chat-per-minute", "24", env=env)
    assert pooled.exit_code == 0 and minute.exit_code == 0, pooled.output + minute.output
    (p,) = map(json.loads, pooled.output.splitlines())
    (m,) = map(json.loads, minute.output.splitlines())
    assert (p["state"], p["allowance"], p["exceed_share"]) == ("cool", 4, 0.05)
    assert (m["allowance"], m["confidence"]) == (2, "sure")
    assert 0.006 < m["exceed_share"] < 0.0066
    text = invoke("headroom", "--since", "7h", "--chat-per-minute", "24", env=env)
    assert text.exit_code == 0, text.output
    assert "groups: a group holds with at most 0.63 % of its probes over the target" in text.output
    assert "a minute of 24 chat answers" in text.output and "cool    2  (sure" in text.output
    # No control decision counted chat here: "auto" (the default) falls back to the pooled
    # p95 and says why.
    plain = invoke("headroom", "--since", "7h", env=env)
    assert "groups: a group holds with at most 5 % of its probes" in plain.output
    assert "the gateway counted no chat over this span; --chat-per-minute N" in plain.output


def test_headroom_chat_per_minute_not_auto_or_a_count_is_a_usage_error(db_path):
    with Store(db_path):
        pass
    for bad in ("-1", "lots", "2.5"):
        out = invoke(
            "headroom", "--chat-per-minute", bad, env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
        )
        assert out.exit_code == 2 and "--chat-per-minute" in out.output, out.output
        assert "give auto (the gateway's count), 0 (the pooled p95) or e.g. 24" in out.output
        assert "Traceback" not in out.output


def test_the_configs_chat_per_minute_rules_headroom_status_and_the_report(db_path, tmp_path):
    with Store(db_path) as store:
        fill_few_slow(store, time.time())
    env = {
        "LLM_WATCHDOG__STORAGE__PATH": str(db_path),
        "LLM_WATCHDOG__CONTROL__TARGET_P95": "1s",
        "LLM_WATCHDOG__CONTROL__CHAT_PER_MINUTE": "24",
    }
    (row,) = map(
        json.loads, invoke("headroom", "--since", "7h", "--json", env=env).output.splitlines()
    )
    assert row["allowance"] == 2 and row["exceed_share"] < 0.01
    # --chat-per-minute 0 asks for the pooled p95 whatever the config says.
    out = invoke("headroom", "--since", "7h", "--json", "--chat-per-minute", "0", env=env)
    (pooled,) = map(json.loads, out.output.splitlines())
    assert pooled["allowance"] == 4 and pooled["exceed_share"] == 0.05
    status = invoke("status", env=env)
    assert status.exit_code == 0 and "headroom     cool    2  (sure" in status.output
    page = tmp_path / "r.html"
    rep = invoke("report", "--since", "7h", "--out", str(page), env=env)
    assert rep.exit_code == 0, rep.output
    assert "<h2>Headroom</h2>" in page.read_text()
    assert "<td>2</td>" in page.read_text() and "<td>4</td>" not in page.read_text()
    assert "in 99 % of one-minute windows of 24 answers" in page.read_text()
    png = tmp_path / "r.png"
    assert invoke("report", "--since", "7h", "--out", str(png), env=env).exit_code == 0
    pooled_page = tmp_path / "pooled.html"
    pooled_env = {**env, "LLM_WATCHDOG__CONTROL__CHAT_PER_MINUTE": "0"}
    assert (
        invoke("report", "--since", "7h", "--out", str(pooled_page), env=pooled_env).exit_code == 0
    )
    assert "pooled over the probes" in pooled_page.read_text()
    assert "<td>4</td>" in pooled_page.read_text()
    for value in ("-3", "many"):
        bad = invoke("headroom", env={**env, "LLM_WATCHDOG__CONTROL__CHAT_PER_MINUTE": value})
        assert bad.exit_code != 0, bad.output
        assert "LLM_WATCHDOG__CONTROL__CHAT_PER_MINUTE" in bad.output
        assert 'expected "auto" (the gateway\'s count of chat), 0 (the pooled p95)' in bad.output
        assert "Traceback" not in bad.output


def test_headroom_judges_by_as_much_chat_as_the_gateway_counted(db_path, tmp_path):
    from llm_watchdog.control.law import ControlAction
    from llm_watchdog.store.control import action_row, record_action

    now = time.time()
    with Store(db_path) as store:
        fill_few_slow(store, now)
        # Decisions a minute apart: the usual rate climbs to 0.4 a second and stays; one
        # from a daemon without the gateway's count (None) says nothing.
        for i, rate in enumerate([0.1, 0.4, 0.4, 0.4, 0.41, None]):
            inputs = {"target_p95_ms": 1000.0, "chat_usual_per_s": rate}
            action = ControlAction(now - 600 + 60 * i, 4, 4, "hold 4", inputs)
            record_action(store, action_row(action, ts=now - 600 + 60 * i))
    env = {"LLM_WATCHDOG__STORAGE__PATH": str(db_path)}
    # The default, "auto": judged by minutes of as much chat as the gateway counted.
    text = invoke("headroom", "--since", "7h", env=env)
    assert text.exit_code == 0, text.output
    assert "at most 0.63 % of its probes over the target" in text.output
    assert "a minute of 24 chat answers (the gateway's count over this span)" in text.output
    assert "cool    2  (sure" in text.output and "chat: about" not in text.output
    (row,) = map(
        json.loads, invoke("headroom", "--since", "7h", "--json", env=env).output.splitlines()
    )
    assert (row["chat_per_minute_seen"], row["chat_per_minute"], row["allowance"]) == (24, 24, 2)
    auto = invoke("headroom", "--since", "7h", "--chat-per-minute", "AUTO", env=env)
    assert auto.output == text.output
    # status and the report judge alike.
    status = invoke("status", env=env)
    assert status.exit_code == 0 and "headroom     cool    2  (sure" in status.output
    page = tmp_path / "r.html"
    assert invoke("report", "--since", "7h", "--out", str(page), env=env).exit_code == 0
    assert "in 99 % of one-minute windows of 24 answers" in page.read_text()
    # Asked for the pooled p95: the count, the rule it would give, and how to ask for it.
    pooled = invoke("headroom", "--since", "7h", "--chat-per-minute", "0", env=env)
    assert "chat: about 24 answers a minute over this span (the gateway's count)" in pooled.output
    assert "allow 0.63 % over the target" in pooled.output
    assert "--chat-per-minute auto" in pooled.output and "cool    4" in pooled.output
    # A span with no counted decision: auto is the pooled p95, and the count null in JSON.
    early = invoke("headroom", "--since", "7h", "--until", "20m", "--json", env=env)
    (old,) = map(json.loads, early.output.splitlines())
    assert (old["chat_per_minute_seen"], old["chat_per_minute"]) == (None, 0)
    assert old["exceed_share"] == 0.05


def test_the_law_records_the_usual_chat_rate_only_where_chat_is_counted():
    from llm_watchdog.control.law import AllowanceController, ControlConfig, ControlInput

    def last_inputs(arrivals):
        law = AllowanceController(ControlConfig(target_p95_ms=1000.0))
        for t in range(120):
            action = law.step(
                ControlInput(now_s=float(t), chat_ttfts_ms=(300.0,), chat_arrivals=arrivals)
            )
        return action.inputs

    assert last_inputs(1)["chat_usual_per_s"] == 1.0
    assert last_inputs(None)["chat_usual_per_s"] is None
