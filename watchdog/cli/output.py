"""Listings for the CLI: a table on a terminal, JSON lines or CSV on request.

Like sqlite-utils, one shared decorator gives every listing `--json` / `--csv`, so each
command only builds its rows.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import click

from llm_watchdog.logs import printable


def listing_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
    @click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row.")
    @click.option("--table", "as_table", is_flag=True, help="An aligned table (default).")
    @functools.wraps(fn)
    def wrapper(*args: Any, as_json: bool, as_csv: bool, as_table: bool, **kwargs: Any) -> Any:
        return fn(*args, fmt=one_of_flags(json=as_json, csv=as_csv, table=as_table), **kwargs)

    return wrapper


def one_of_flags(default: str = "table", **given: bool) -> str:
    """The one flag given of several that exclude each other (`default` when none); two are
    a usage error, not a silent pick of whichever click read last."""
    chosen = [name for name, on in given.items() if on]
    if len(chosen) > 1:
        raise click.UsageError(
            f"--{chosen[0]} and --{chosen[1]} exclude each other: give one",
            ctx=click.get_current_context(silent=True),
        )
    return chosen[0] if chosen else default


def stamp(ts: float | None) -> str:
    """Local wall time for a unix stamp, seconds precision."""
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def percent(share: float | None) -> str | None:
    """A share of 1 as a percentage for a person to read ("95%"); None stays None.

    Whole percents, but never 100% or 0% for a share that is not exactly that: one wrong
    answer in 300 reads 99.7%, not a perfect score."""
    if share is None or math.isnan(share):
        return None
    text = f"{share:.0%}"
    if text == "100%" and share < 1:
        return "<100%" if f"{share:.1%}" == "100.0%" else f"{share:.1%}"
    if text == "0%" and share > 0:
        return ">0%" if f"{share:.1%}" == "0.0%" else f"{share:.1%}"
    return text


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.1f}" if abs(value) < 1e6 else f"{value:.0f}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    # Stored text comes from engines and clients: an ANSI escape would drive the terminal.
    return printable(str(value))


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    # 1/0, as SQLite stores a flag and `history --csv` and `--export-trace` write it: pandas
    # and spreadsheets read a number, where Python's True/False is text to them.
    if isinstance(value, bool):
        return int(value)
    # JSON, not Python's repr: `json.loads` reads the cell back (None is null, not None).
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return printable(value) if isinstance(value, str) else value


def emit(
    rows: Iterable[dict[str, Any]],
    columns: Sequence[str],
    fmt: str,
    out: TextIO | None = None,
    headers: dict[str, str] | None = None,
) -> int:
    """Print rows; return how many. Table columns are `columns`; JSON/CSV keep them too."""
    out = out or sys.stdout
    rows = list(rows)
    if fmt == "json":
        for row in rows:
            out.write(json.dumps({c: row.get(c) for c in columns}, default=str) + "\n")
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_cell(row.get(c)) for c in columns])
    else:
        headers = headers or {}
        head = [headers.get(c, c) for c in columns]
        body = [[_cell(row.get(c)) for c in columns] for row in rows]
        widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(head)]
        out.write("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip() + "\n")
        for r in body:
            out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
        if not rows:
            out.write("(no rows)\n")
    return len(rows)
