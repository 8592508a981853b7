"""Durations as text, in the project's two spellings; the one copy of each.

Config style, as people write a duration in a config file and as `config show` prints it back:
`10s`, `5m`, `2h`, `1d`, `250ms`, `1h30m` (parse_duration, format_duration).

Message style, for a person reading an alert or a drift event: "0.4 s", "7 min",
"1 h 20 min" (human_duration), and a latency: "850 ms", "1.9 s" (human_ms).
"""

from __future__ import annotations

import math
import re

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


# ---- config style ---------------------------------------------------------------------------


def parse_duration(text: str | int | float) -> float:
    """Seconds in `text`. A bare number is seconds. Raises ValueError with what is expected."""
    if isinstance(text, bool):
        raise ValueError("expected a duration like 10s, 5m or 2h, got a boolean")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"expected a non-negative duration, got {text}")
        return float(text)
    s = str(text).strip().lower().replace(" ", "")
    if not s:
        raise ValueError("expected a duration like 10s, 5m or 2h, got an empty string")
    try:
        return parse_duration(float(s))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS_S[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"expected a duration like 10s, 5m, 2h or 1h30m, got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest plain form: 90 -> '1m30s', 0.25 -> '250ms'; what parse_duration reads.

    Durations are never negative here (parse_duration refuses them): below 0 is "0ms".
    """
    ms = round(max(0.0, seconds) * 1000)
    if ms < 1000:  # 0.9996 s is "1s", not "1000ms"
        return f"{ms}ms"
    out, rest = [], round(ms / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            n, rest = divmod(rest, size)
            out.append(f"{n}{unit}")
    return "".join(out)


# ---- message style --------------------------------------------------------------------------


def human_duration(seconds: float | None) -> str:
    """A duration the way a person says it: "0.4 s", "75 s", "7 min", "1 h 20 min", "2 d 3 h".

    Whole seconds up to a minute and a half ("1 min" would hide half of 89 s). None or NaN
    is "?"; a negative duration is "0 s".
    """
    if seconds is None or math.isnan(seconds):
        return "?"
    s = max(0.0, float(seconds))
    if s < 10:
        text = f"{s:.1f}".rstrip("0").rstrip(".")
        return f"{text} s"
    if s < 89.5:
        return f"{round(s)} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    if s < 86400 - 30:
        hours, rest = divmod(minutes, 60)
        return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"
    hours_total = round(s / 3600)
    days, hours = divmod(hours_total, 24)
    return f"{days} d" if hours == 0 else f"{days} d {hours} h"


def human_ms(ms: float | None, *, scale_of: float | None = None) -> str:
    """A latency: "850 ms", "1.9 s", "12 s"; None or NaN is "?".

    The unit is picked from the larger of `ms` and `scale_of`, so two figures compared in one
    sentence share a unit: human_ms(800, scale_of=1900) == "0.8 s".
    """
    if ms is None or math.isnan(ms):
        return "?"
    scale = max(abs(ms), abs(scale_of)) if scale_of is not None else abs(ms)
    if scale < 999.5:  # what would round to "1000 ms" reads better as "1.0 s"
        return f"{round(ms)} ms"
    s = ms / 1000
    # Tenths below 10 s even beside a larger figure: "30 s vs 0.8 s", not "30 s vs 1 s".
    if scale < 9_950 or abs(ms) < 9_950:
        return f"{s:.1f} s"
    return f"{round(s)} s"
