"""Numbered schema migrations and the runner that applies them.

Each migration is a module in this package named `mNNN_what.py` (three digits, then a name)
with one function `up(db: sqlite_utils.Database) -> None`. The runner finds them by file name,
applies every one the database has not recorded yet, in number order, each inside its own
transaction together with its row in `_migrations` (number, name, applied_at). A new file is
picked up without touching this module.

A migration, once released, never changes: a later schema change is a new file. A database
that records a migration this code does not have was written by a newer version; opening it
is refused with one line rather than guessed at.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlite_utils

from llm_watchdog.errors import StorageError

MIGRATIONS_TABLE = "_migrations"
_NAME = re.compile(r"^m(\d{3})_([a-z0-9_]+)$")


class MigrationError(StorageError):
    """The database cannot be brought to this version's schema. str(err) is one line."""


@dataclass(frozen=True)
class Migration:
    number: int
    name: str  # the module name, e.g. "m001_initial"
    up: Callable[[sqlite_utils.Database], None]


def discover(package: str = __name__) -> list[Migration]:
    """Every `mNNN_*` module of `package`, in number order."""
    pkg = importlib.import_module(package)
    found: dict[int, Migration] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        m = _NAME.match(info.name)
        if not m:
            continue
        number = int(m.group(1))
        if number in found:
            # Two colleagues picked the same number: a packaging mistake, caught in tests.
            raise MigrationError(
                f"migrations {found[number].name} and {info.name} share number {number}; "
                "renumber one of them"
            )
        module = importlib.import_module(f"{package}.{info.name}")
        found[number] = Migration(number, info.name, module.up)
    return [found[n] for n in sorted(found)]


def applied(db: sqlite_utils.Database) -> dict[int, str]:
    """Migrations recorded in the database: number -> name."""
    if MIGRATIONS_TABLE not in db.table_names():
        return {}
    return {
        row["number"]: row["name"]
        for row in db.query(f"SELECT number, name FROM {MIGRATIONS_TABLE} ORDER BY number")
    }


def migrate(
    db: sqlite_utils.Database,
    migrations: list[Migration] | None = None,
    *,
    where: str = "the database",
    now: Callable[[], float] = time.time,
) -> list[str]:
    """Apply the missing migrations; return the names applied (empty when up to date).

    An up-to-date database is only read, so a user who may read but not write it can still
    open it. Each missing migration runs in `BEGIN IMMEDIATE ... COMMIT`, checked again under
    the write lock, so two processes opening a new database at once cannot both apply it, and
    one that fails leaves no half-built table behind.
    """
    migrations = discover() if migrations is None else migrations
    known = {m.number: m.name for m in migrations}
    recorded = applied(db)
    _refuse_newer(recorded, known, where)
    done: list[str] = []
    for migration in migrations:
        if migration.number in recorded:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
                "number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            recorded = applied(db)
            _refuse_newer(recorded, known, where)
            if migration.number not in recorded:
                migration.up(db)
                db.execute(
                    f"INSERT INTO {MIGRATIONS_TABLE} (number, name, applied_at) VALUES (?, ?, ?)",
                    (migration.number, migration.name, now()),
                )
                done.append(migration.name)
            db.execute("COMMIT")
        except BaseException:
            if db.conn.in_transaction:
                db.execute("ROLLBACK")
            raise
    return done


def _refuse_newer(recorded: dict[int, str], known: dict[int, str], where: str) -> None:
    unknown = sorted(n for n in recorded if n not in known)
    if unknown:
        names = ", ".join(recorded[n] for n in unknown)
        raise MigrationError(
            f"{where} was written by a newer llm-watchdog (unknown migration {names}); "
            "upgrade llm-watchdog, or set storage.path to another file"
        )
