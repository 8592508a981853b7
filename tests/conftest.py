"""Fixtures for every test package. The plain fakes and builders behind them are in
tests/helpers/builders.py, for tests that build their own (a clock at another time, say)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlite_utils

from llm_watchdog.store.db import Store
from tests.helpers.builders import T0, FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at T0; the test moves it with `clock.now`."""
    return FakeClock(T0)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the test's database file goes; nothing is there yet."""
    return tmp_path / "watchdog.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    """The project's store on a fresh file at `db_path`, migrated, closed after the test."""
    with Store(db_path) as s:
        yield s


@pytest.fixture
def db(db_path: Path) -> Iterator[sqlite_utils.Database]:
    """A plain database at `db_path` with no tables: the test migrates what it needs."""
    database = sqlite_utils.Database(db_path)
    try:
        yield database
    finally:
        database.close()
