"""Durations as people write them in a config file: `10s`, `5m`, `2h`, `1d`, `250ms`, `1h30m`."""

from __future__ import annotations

import re

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


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
    """The shortest plain form: 90 -> '1m30s', 0.25 -> '250ms'."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = [], round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            n, rest = divmod(rest, size)
            out.append(f"{n}{unit}")
    return "".join(out) or "0s"
