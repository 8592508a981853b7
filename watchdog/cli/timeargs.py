"""`--since 24h` / `--until 2026-11-29T10:00` / `--since 1795946400` arguments.

A duration with its unit is that long back from now; a bare number is a unix timestamp
(seconds, as `date +%s` prints and the JSON output carries); anything else an ISO date.
"""

from __future__ import annotations

import datetime as dt
import math
import re

from llm_watchdog.durations import parse_duration

_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?")

# Latest time a query may name: year 9999, the last that datetime and `stamp()` can print.
_MAX_TS = 253402300799.0


def parse_when(text: str, now_ts: float) -> float:
    """Unix seconds for `text`: "now", a unix timestamp ("1795946400"), a duration before
    `now_ts` ("24h"), or an ISO date."""
    text = text.strip()
    if text == "now":
        return now_ts
    if _NUMBER.fullmatch(text):
        # A bare number read as seconds back from now put 1795946400 57 years ago.
        ts = float(text)
        if not math.isfinite(ts) or ts > _MAX_TS:
            raise ValueError(f"cannot read {text!r} as a unix timestamp: it is past year 9999")
        return ts
    try:
        back_s = parse_duration(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(back_s) or back_s > now_ts:
            raise ValueError(
                f"{text!r} reaches back before 1970: use a duration like 30m, 24h or 7d, "
                "or an ISO date"
            )
        return now_ts - back_s
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise ValueError(
            f"cannot read {text!r} as a time: use a duration back from now (30m, 24h, 7d), "
            "unix seconds (1795946400) or an ISO date (2026-11-29 or 2026-11-29T14:00)"
        ) from None
    if when.tzinfo is None:
        try:
            when = when.astimezone()  # a date without a zone is local time, as people mean it
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"{text!r} is out of range: give a date from 1970 on") from None
    try:
        ts = when.timestamp()
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"{text!r} is out of range: give a date from 1970 on") from None
    if not 0 <= ts <= _MAX_TS:
        raise ValueError(f"{text!r} is out of range: give a date from 1970 on")
    return ts
