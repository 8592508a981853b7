"""--since / --until: durations back from now, unix timestamps, ISO dates."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.cli.timeargs import parse_when

NOW = 1_800_000_000.0


def test_a_bare_unix_timestamp_is_an_absolute_time():
    assert parse_when("1795946400", NOW) == 1795946400.0
    assert parse_when("1795946400.5", NOW) == 1795946400.5
    assert parse_when(" 0 ", NOW) == 0.0


def test_durations_need_their_unit_and_go_back_from_now():
    assert parse_when("90s", NOW) == NOW - 90
    assert parse_when("1h30m", NOW) == NOW - 5400


def test_the_error_names_all_three_forms():
    with pytest.raises(ValueError, match=r"30m, 24h, 7d\), unix seconds \(1795946400\)"):
        parse_when("-5", NOW)


def test_history_takes_a_timestamp(tmp_path, monkeypatch):
    db = tmp_path / "watchdog.db"
    from llm_watchdog.store.db import Store

    Store(db).close()
    monkeypatch.setenv("LLM_WATCHDOG__STORAGE__PATH", str(db))
    config = tmp_path / "c.toml"
    config.write_text("")
    result = CliRunner().invoke(
        cli, ["--config", str(config), "history", "--since", "1795946400", "--json"]
    )
    assert result.exit_code == 0, result.output


def invoke_in(tmp_path, monkeypatch, *args: str):
    from llm_watchdog.store.db import Store

    db = tmp_path / "watchdog.db"
    Store(db).close()
    monkeypatch.setenv("LLM_WATCHDOG__STORAGE__PATH", str(db))
    config = tmp_path / "c.toml"
    config.write_text("")
    return CliRunner().invoke(cli, ["--config", str(config), *args])


@pytest.mark.parametrize("command", ["history", "drift"])
@pytest.mark.parametrize(
    ("since", "until"), [("1h", "2h"), ("1h", "1h"), ("2026-11-29", "2026-11-28")]
)
def test_a_range_the_wrong_way_round_is_a_usage_error_not_an_empty_history(
    tmp_path, monkeypatch, command: str, since: str, until: str
) -> None:
    out = invoke_in(tmp_path, monkeypatch, command, "--since", since, "--until", until)
    assert out.exit_code == 2, out.output
    assert f"Invalid value for --since: {since} is not before --until {until}" in out.output
    assert "(no rows)" not in out.output


def test_a_since_in_the_future_is_not_before_now(tmp_path, monkeypatch) -> None:
    out = invoke_in(tmp_path, monkeypatch, "history", "--since", "9000-01-01")
    assert out.exit_code == 2 and "9000-01-01 is not before now" in out.output


@pytest.mark.parametrize("option", ["--since", "--until"])
def test_a_time_that_cannot_be_read_names_its_option(tmp_path, monkeypatch, option) -> None:
    out = invoke_in(tmp_path, monkeypatch, "history", option, "yesterday")
    assert out.exit_code == 2
    assert f"Invalid value for {option}: cannot read 'yesterday' as a time" in out.output
