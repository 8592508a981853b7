"""`llm-watchdog headroom --target` reads a duration (400ms, 1.5s) as `report --target` does,
and a plain number as milliseconds."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.store.db import Store
from tests.helpers.history import fill_headroom_history as fill


def targets(db_path, *args: str) -> set[float]:
    out = CliRunner().invoke(
        cli,
        ["headroom", "--since", "3h", "--json", *args],
        env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)},
        obj={},
    )
    assert out.exit_code == 0, out.output
    return {json.loads(line)["target_ms"] for line in out.output.splitlines()}


@pytest.mark.parametrize(
    ("given", "ms"), [("400ms", 400.0), ("1.5s", 1500.0), ("1000", 1000.0), ("250.5", 250.5)]
)
def test_headroom_target_takes_a_duration_or_plain_milliseconds(db_path, given, ms):
    with Store(db_path) as store:
        fill(store, time.time())
    assert targets(db_path, "--target", given) == {ms}


@pytest.mark.parametrize("given", ["0.5", "0ms", "soon", "-3s"])
def test_headroom_target_below_a_millisecond_or_unreadable_is_a_usage_error(db_path, given):
    with Store(db_path):
        pass
    out = CliRunner().invoke(
        cli,
        ["headroom", "--target", given],
        env={"LLM_WATCHDOG__STORAGE__PATH": str(db_path)},
        obj={},
    )
    assert out.exit_code == 2, out.output
    assert "--target" in out.output and "Traceback" not in out.output
