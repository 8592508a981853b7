"""Hostile and clumsy input at the command line: every command given bad arguments exits 2
with one line; a foreign or missing database, an unwritable target, and engine text with
terminal escapes are one line too, and nothing the CLI reads changes a database."""

from __future__ import annotations

import hashlib
import socket
import sqlite3
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.store.db import Store
from tests.helpers.builders import probe_result

BAD_ARGUMENTS = [
    ("drift", "--since", "1e308"),
    ("drift", "--until", "inf"),
    ("baseline", "show", "--bogus"),
    ("baseline", "reset", "--bogus"),
    ("baseline", "capture", "--for", "forever"),
    ("baseline", "nosuch"),
    ("replay", "--bogus"),
    ("alerts", "--since", "nan"),
    ("alerts", "test", "--bogus"),
    ("status", "--bogus"),
    ("history", "--since", "1e308"),
    ("history", "--since", "-1e308"),
    ("history", "--until", "99999999999999999999d"),
    ("history", "--since", "9999-99-99"),
    ("history", "--since", "0001-01-01T00:00"),
    ("history", "--limit", "0"),
    ("history", "--limit", "1e9"),
    ("history", "--resolution", "5m"),
    ("history", "--since"),
    ("history", "--json", "--csv"),
    ("history", "--gpu", "--control"),
    ("drift", "--table", "--json"),
    ("sim", "serve", "--port", "abc"),
    ("sim", "run", "--seed", "x"),
    ("sim", "sweep", "--bogus"),
    ("gateway", "--max-queued", "abc"),
    ("bench", "--document-words", "0"),
    ("bench", "compare", "--bogus"),
    ("bench", "show", "--bogus"),
    ("bench", "list", "--bogus"),
    ("headroom", "--bogus"),
    ("report", "--bogus"),
    ("report", "--instance", "box:9101", "--out", "x.png"),
    ("baseline", "capture", "--from-history", "abc"),
    ("demo", "--time-scale", "0"),
    ("demo", "--duration", "0s"),
    ("demo", "--duration", "9s"),
    ("probe", "--rounds", "0"),
    ("probe", "--cache-mode", "sometimes"),
    ("check-config", "--bogus"),
    ("run", "--bogus"),
    ("install", "--bogus"),
    ("uninstall", "--bogus"),
    ("no-such-command",),
    ("--no-such-option",),
]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[storage]\npath = "{tmp_path / "watchdog.db"}"\n')
    return cfg


def invoke(config: Path, *args: str) -> click.testing.Result:
    return CliRunner().invoke(
        cli, ["--config", str(config), *args], env={}, obj={}, prog_name="llm-watchdog"
    )


def one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        found.append((*path, name))
        if isinstance(command, click.Group):
            found.extend(commands(command, (*path, name)))
    return found


@pytest.mark.parametrize("args", BAD_ARGUMENTS, ids=" ".join)
def test_bad_arguments_exit_2_with_one_line(config: Path, args: tuple[str, ...]) -> None:
    out = invoke(config, *args)
    assert out.exit_code == 2, out.output
    line = one_line(out.output)
    assert line.startswith("llm-watchdog") and "--help" in line


@pytest.mark.parametrize("args", [(), ("sim",), ("baseline",)], ids=" ".join)
def test_a_group_given_no_command_prints_its_help_as_help(args: tuple[str, ...]) -> None:
    out = CliRunner().invoke(cli, list(args), env={}, obj={}, prog_name="llm-watchdog")
    assert out.exit_code in (0, 2)  # click 8.1 exits 0, 8.2 on 2
    assert out.output.startswith(f"Usage: llm-watchdog {' '.join(args)}".rstrip() + " [OPTIONS]")
    assert "\\n" not in out.output and "Commands:\n" in out.output


def test_every_command_is_in_the_bad_argument_table() -> None:
    named = {a[: len(c)] for a in BAD_ARGUMENTS for c in commands(cli) if a[: len(c)] == c}
    assert set(commands(cli)) <= named


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("baseline", "capture", "--from-history", "abc"), "Invalid value for --from-history: "),
        (("baseline", "capture", "--for", "abc"), "Invalid value for --for: "),
        (("report", "--instance", "b:1", "--out", "x.png"), "--instance picks a box from Prom"),
    ],
)
def test_a_bad_value_names_its_option(config: Path, args: tuple[str, ...], words: str) -> None:
    out = invoke(config, *args)
    assert out.exit_code == 2 and words in one_line(out.output), out.output


def test_a_time_far_out_of_range_names_what_to_give(config: Path) -> None:
    line = one_line(invoke(config, "history", "--since", "1e308").output)
    assert "before 1970" in line


def test_export_trace_to_a_missing_folder_is_one_line(config: Path, tmp_path: Path) -> None:
    Store(tmp_path / "watchdog.db").close()
    target = tmp_path / "no" / "such" / "trace.csv"
    out = invoke(config, "history", "--export-trace", str(target))
    assert out.exit_code == 1
    line = one_line(out.output)
    assert str(target) in line and "folder exists" in line


def test_reading_commands_leave_a_foreign_database_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "other-app.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE accounts (id INTEGER, name TEXT); INSERT INTO accounts VALUES (1, 'a');"
    )
    conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[storage]\npath = "{path}"\n')
    for args in (("status",), ("history",), ("drift",), ("baseline", "show"), ("alerts",)):
        out = invoke(cfg, *args)
        assert out.exit_code == 1, (args, out.output)
        line = one_line(out.output)
        assert "not an llm-watchdog database" in line and "accounts" in line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "other-app.sqlite"]


def test_reading_commands_do_not_change_the_watchdog_database(config: Path, tmp_path: Path) -> None:
    db = tmp_path / "watchdog.db"
    with Store(db) as s:
        s.record_probe(probe_result(), None)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for args in (
        ("status",),
        ("history", "--since", "1970-01-02", "--resolution", "raw"),
        ("drift",),
        ("baseline", "show"),
    ):
        out = invoke(config, *args)
        assert out.exit_code == 0, (args, out.output)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_terminal_escapes_from_an_engine_are_printed_escaped(config: Path, tmp_path: Path) -> None:
    with Store(tmp_path / "watchdog.db") as s:
        s.record_probe(
            probe_result(
                ok=False,
                ttft_ms=None,
                error_class="http_status\x1b[2J",
                error_detail="boom \x1b]0;owned\x07 \x1b[31mred",
                prompt_id="p\x1b[1m",
            ),
            None,
        )
    for args in (
        ("status",),
        ("history", "--since", "1970-01-02", "--resolution", "raw"),
        ("history", "--csv", "--since", "1970-01-02", "--resolution", "raw"),
    ):
        out = invoke(config, *args)
        assert out.exit_code == 0, out.output
        assert "\x1b" not in out.output and "\x07" not in out.output, args
        assert "\\x1b" in out.output


def test_a_state_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[storage]\npath = "{blocker / "state" / "watchdog.db"}"\n')
    out = invoke(cfg, "baseline", "capture", "--for", "1s")
    assert out.exit_code == 1
    assert "cannot create the database folder" in one_line(out.output)


def test_a_server_that_takes_the_connection_and_never_answers_is_not_called_unreachable(
    config: Path,
) -> None:
    with socket.socket() as listener:  # the kernel accepts; nobody ever answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        out = invoke(config, "probe", "--url", url)
    assert out.exit_code == 1
    line = one_line(out.output)
    assert "cannot reach" not in line and "no answer from" in line and "hung or still" in line


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("drift",),
        ("history", "--resolution", "raw"),
        ("headroom",),
        ("baseline", "show"),
        ("alerts",),
    ],
    ids=" ".join,
)
def test_every_reading_command_takes_db_over_the_configs_database(
    config: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    other = tmp_path / "copied from another box.db"
    with Store(other) as store:
        store.record_probe(probe_result(ts=time.time() - 30, prompt_id="from-the-copy"), None)
    out = invoke(config, *args, "--db", str(other))
    assert out.exit_code == 0, out.output
    if args[0] in ("status", "history"):
        assert "from-the-copy" in out.output
    missing = invoke(config, *args, "--db", str(tmp_path / "nope.db"))
    assert missing.exit_code == 1 and f"no database at {tmp_path / 'nope.db'}" in missing.output
