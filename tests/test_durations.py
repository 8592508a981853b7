"""llm_watchdog.durations: both spellings of a duration, and a latency, pinned value by value.

Alert and drift lines are built from these; a change here changes what people read.
"""

from __future__ import annotations

import pytest

from llm_watchdog.durations import (
    format_duration,
    human_duration,
    human_ms,
    parse_duration,
)

NAN = float("nan")

# ---- config style ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("10s", 10),
        ("5m", 300),
        ("2h", 7200),
        ("1h30m", 5400),
        ("250ms", 0.25),
        (7, 7),
        ("1d", 86400),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "10x", "s10", "-5", "ten seconds", True])
def test_bad_durations_say_what_is_expected(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0ms"),
        (0.25, "250ms"),
        (1, "1s"),
        (59.6, "1m"),
        (60, "1m"),
        (90, "1m30s"),
        (3600, "1h"),
        (3661, "1h1m1s"),
        (86400, "1d"),
        (86400 * 14, "14d"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(round(seconds) if seconds >= 1 else seconds)


def test_format_duration_edges() -> None:
    assert format_duration(0.9996) == "1s"  # not "1000ms"
    assert format_duration(-5) == "0ms"  # parse_duration would refuse "-5000ms"


# ---- message style --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (0.04, "0 s"),
        (0.42, "0.4 s"),
        (3, "3 s"),
        (9.96, "10 s"),
        (45.4, "45 s"),
        (59.4, "59 s"),
        (59.6, "60 s"),
        (60, "60 s"),
        (75, "75 s"),
        (89.4, "89 s"),
        (90, "2 min"),
        (420, "7 min"),
        (3599, "1 h"),
        (4800, "1 h 20 min"),
        (7200, "2 h"),
        (86369, "23 h 59 min"),
        (86400, "1 d"),
        (86400 * 2 + 3 * 3600, "2 d 3 h"),
        (None, "?"),
        (NAN, "?"),
        (-5, "0 s"),
    ],
)
def test_human_duration(seconds: float | None, text: str) -> None:
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    ("ms", "scale_of", "text"),
    [
        (0, None, "0 ms"),
        (850, None, "850 ms"),
        (999.4, None, "999 ms"),
        (999.6, None, "1.0 s"),
        (1900, None, "1.9 s"),
        (800, 1900, "0.8 s"),
        (800, 30_000, "0.8 s"),  # a small figure beside a large one keeps its tenths
        (30_000, 800, "30 s"),
        (300, 0, "300 ms"),
        (9_949, None, "9.9 s"),
        (9_960, None, "10 s"),
        (12_400, None, "12 s"),
        (None, None, "?"),
        (NAN, 800, "?"),
    ],
)
def test_human_ms(ms: float | None, scale_of: float | None, text: str) -> None:
    assert human_ms(ms, scale_of=scale_of) == text


# ---- drift event lines: their own spelling, kept -------------------------------------------
