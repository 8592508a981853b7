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
