"""`llm-watchdog replay TRACE.csv`: the daemon's drift monitor over a recorded trace.

The trace is the replay-trace CSV (README.md, "Replay traces"; docs/drift.md): a header row,
one row per canary probe, `ts` and `ttft_ms` required, every other column optional and any
cell but `ts` may be empty. A bad row is reported with its line number and no event is
reported when any row is bad. `replay_file` checks and replays in one streaming pass: rows
are read, checked and handed to the monitor one at a time, so memory does not grow with the
trace (a 300k-row trace held as a list took 372 MB).

When the trace has no `cold` column, cold starts are classified the way the daemon does it
(`classify_cold`): the first probe, and the first after a gap longer than `idle_after_s`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from llm_watchdog.drift.cold import classify_cold
from llm_watchdog.drift.monitor import DriftMonitor
from llm_watchdog.drift.values import DriftConfig, DriftEvent, Observation
from llm_watchdog.errors import WatchdogError

REQUIRED = ("ts", "ttft_ms")
# The replay trace contract (README.md, "Replay traces"), in its order.
CONTRACT_COLUMNS = (
    *REQUIRED,
    "ok",
    "cold",
    "quality_pass",
    "gpu_temp_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "power_w",
    "power_limit_w",
    "throttle_reasons",
    "batch_inflight",
    "batch_allowance",
)
# Beyond the contract: NVML reports its thresholds once per GPU; with them a replay gives the
# heat warnings the daemon gave. `temp_target_c` is where the clocks start to fall (the target
# temperature, or the learned one), `temp_slowdown_c` NVML's SLOWDOWN; the warning aims at the
# lower of the two.
THRESHOLD_COLUMNS = ("temp_target_c", "temp_slowdown_c")
# Also beyond it: a failed probe that got no first token within the timeout, how long it
# waited. With it a replay judges those canaries as the daemon did (a TTFT over the wait).
WAIT_COLUMNS = ("ttft_over_ms",)
OPTIONAL = (*CONTRACT_COLUMNS[2:], *THRESHOLD_COLUMNS, *WAIT_COLUMNS)
FLOAT_COLUMNS = (
    "gpu_temp_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "power_w",
    "power_limit_w",
    "batch_inflight",
    "batch_allowance",
    "temp_slowdown_c",
    "temp_target_c",
)
MAX_LISTED = 5  # bad rows named in the error; the rest are counted


class ReplayError(WatchdogError):
    """The trace cannot be replayed. str(err) is one line; `line` is the first bad line."""

    def __init__(self, message: str, line: int | None = None, lines: list[int] | None = None):
        super().__init__(message)
        self.line = line
        self.lines = lines or ([line] if line is not None else [])


class _Bad(ValueError):
    pass


def _float(text: str, column: str, *, minimum: float | None = None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _Bad(f"{column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise _Bad(f"{column} {text!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise _Bad(f"{column} {text!r} is below {minimum:g}")
    return value


def _flag(text: str, column: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes"):
        return True
    if t in ("0", "false", "no"):
        return False
    raise _Bad(f"{column} {text!r} is not 0 or 1")


def _bitmask(text: str, column: str) -> int:
    t = text.strip().lower()
    try:
        value = int(t, 16) if t.startswith("0x") else int(t)
    except ValueError:
        raise _Bad(f"{column} {text!r} is not an integer bitmask") from None
    if value < 0:
        raise _Bad(f"{column} {text!r} is negative")
    return value


def _ts(ts: float) -> str:
    return f"{ts:.0f}" if ts == int(ts) else f"{ts:.3f}"


def _row(cells: dict[str, str]) -> tuple[dict[str, Any], bool]:
    """Field values of one row, and whether its `cold` cell was given."""
    get = {k: v.strip() for k, v in cells.items()}
    if not get.get("ts"):
        raise _Bad("ts is empty")
    out: dict[str, Any] = {"ts": _float(get["ts"], "ts")}
    ttft = get.get("ttft_ms", "")
    out["ttft_ms"] = _float(ttft, "ttft_ms", minimum=0.0) if ttft else None
    over = get.get("ttft_over_ms", "")
    out["ttft_over_ms"] = _float(over, "ttft_over_ms", minimum=0.0) if over else None
    ok = get.get("ok", "")
    out["ok"] = _flag(ok, "ok") if ok else out["ttft_ms"] is not None
    cold = get.get("cold", "")
    out["cold"] = _flag(cold, "cold") if cold else False
    quality = get.get("quality_pass", "")
    out["quality_pass"] = _flag(quality, "quality_pass") if quality else None
    for column in FLOAT_COLUMNS:
        text = get.get(column, "")
        out[column] = _float(text, column) if text else None
    reasons = get.get("throttle_reasons", "")
    out["throttle_reasons"] = _bitmask(reasons, "throttle_reasons") if reasons else None
    return out, bool(cold)


def parse_trace(path: str | Path, *, idle_after_s: float = 300.0) -> list[Observation]:
    """Every row of a trace as an Observation; ReplayError naming the bad lines, if any.

    `idle_after_s` is the gap that makes a probe cold when the trace has no `cold` column.
    """
    problems = _Problems()
    with _reading(path) as reader:
        observations = list(_observations(reader, str(path), idle_after_s, problems))
    problems.raise_any(str(path))
    return observations


class _Problems:
    """Bad rows: the first MAX_LISTED named, the rest counted, however many there are."""

    def __init__(self) -> None:
        self.listed: list[tuple[int, str]] = []
        self.lines: list[int] = []
        self.count = 0

    def add(self, line: int, message: str) -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append((line, message))
        if len(self.lines) < 10_000:
            self.lines.append(line)

    def raise_any(self, name: str) -> None:
        if not self.count:
            return
        listed = "; ".join(f"line {ln}: {msg}" for ln, msg in self.listed)
        more = f" (and {self.count - MAX_LISTED} more)" if self.count > MAX_LISTED else ""
        count = "1 bad row" if self.count == 1 else f"{self.count} bad rows"
        raise ReplayError(
            f"{name}: {count}, nothing replayed: {listed}{more}; fix the rows and run replay again",
            self.listed[0][0],
            self.lines,
        )


class _reading:
    """A csv reader over the trace; the ways a file cannot be read become ReplayError."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.name = str(path)
        self._file: Any = None

    def __enter__(self) -> Any:
        try:
            self._file = open(self.path, newline="", encoding="utf-8-sig")
        except FileNotFoundError:
            raise ReplayError(f"{self.name}: no such file; check the path") from None
        except IsADirectoryError:
            raise ReplayError(f"{self.name}: is a directory, not a CSV trace") from None
        return csv.reader(self._file)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._file.close()
        if isinstance(exc, UnicodeDecodeError):
            raise ReplayError(
                f"{self.name}: not UTF-8 text ({exc.reason}); export the trace again as CSV"
            ) from None
        if isinstance(exc, csv.Error):
            raise ReplayError(f"{self.name}: not a readable CSV file ({exc})") from None


def _observations(
    reader: Any, name: str, idle_after_s: float, problems: _Problems
) -> Iterator[Observation]:
    """The good rows as Observations, one at a time; bad ones go to `problems`."""
    rows = iter(reader)
    header: list[str] | None = None
    for cells in rows:
        if any(c.strip() for c in cells):
            header = [c.strip() for c in cells]
            break
    if header is None:
        raise ReplayError(f"{name}: empty file; a trace starts with a header row (ts,ttft_ms,...)")
    header_line = getattr(reader, "line_num", 1)
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ReplayError(
            f"{name} line {header_line}: header lacks {', '.join(missing)}; the first row must "
            f"name the columns, e.g. ts,ttft_ms,ok,cold,...",
            header_line,
        )
    dupes = sorted({c for c in header if header.count(c) > 1 and c})
    if dupes:
        raise ReplayError(
            f"{name} line {header_line}: column {', '.join(dupes)} appears twice", header_line
        )
    known = set(REQUIRED) | set(OPTIONAL)
    keep = [(i, c) for i, c in enumerate(header) if c in known]
    has_cold = "cold" in header
    width = len(header)

    last_ts: float | None = None
    previous_ts: float | None = None  # cold classification when there is no `cold` column
    for cells in rows:
        line = getattr(reader, "line_num", 0)
        if len(cells) != width:
            if not any(c.strip() for c in cells):
                continue
            problems.add(line, f"expected {width} fields, found {len(cells)}")
            continue
        if not any(cells) or not any(c.strip() for c in cells):
            continue
        try:
            values, _ = _row({c: cells[i] for i, c in keep})
        except _Bad as exc:
            problems.add(line, str(exc))
            continue
        if last_ts is not None and values["ts"] < last_ts:
            problems.add(
                line, f"ts {_ts(values['ts'])} is earlier than the row before ({_ts(last_ts)})"
            )
            continue
        last_ts = values["ts"]
        if not has_cold:
            values["cold"] = classify_cold(
                ts=values["ts"], previous_ts=previous_ts, idle_after_s=idle_after_s
            ).cold
            previous_ts = values["ts"]
        yield Observation(**values)


def replay_observations(
    observations: Iterable[Observation],
    config: DriftConfig | None = None,
    *,
    fingerprint_id: str = "replay",
    on_event: Callable[[DriftEvent], None] | None = None,
    monitor: DriftMonitor | None = None,
) -> list[DriftEvent]:
    """Run a fresh DriftMonitor over the observations; the last snapshot of each event, in
    the order the events opened. `on_event` sees every snapshot as it happens; `monitor`, a
    fresh one the caller passes, can be read afterwards (what baseline it learned)."""
    if monitor is None:
        monitor = DriftMonitor(config, fingerprint_id=fingerprint_id)
    final: dict[str, DriftEvent] = {}
    for obs in observations:
        for event in monitor.observe(obs):
            final[event.id] = event
            if on_event is not None:
                on_event(event)
    return sorted(final.values(), key=lambda e: e.serial)


def replay_file(
    path: str | Path, config: DriftConfig | None = None, monitor: DriftMonitor | None = None
) -> list[DriftEvent]:
    """Check and replay the trace in one streaming pass. Raises ReplayError on a bad trace,
    with no events: the events of a trace with bad rows are thrown away."""
    cfg = config or DriftConfig()
    problems = _Problems()
    with _reading(path) as reader:
        found = replay_observations(
            _observations(reader, str(path), cfg.idle_after_s, problems), cfg, monitor=monitor
        )
    problems.raise_any(str(path))
    return found


def events_to_jsonl(events: Iterable[DriftEvent]) -> str:
    """`replay --json` output: one contract object per line, newline-terminated."""
    return "".join(e.to_json() + "\n" for e in events)
