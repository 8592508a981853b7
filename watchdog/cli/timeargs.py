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


def parse_when(text: str, now_ts: float) -> float:
    """Unix seconds for `text`: "now", a unix timestamp ("1795946400"), a duration before
    `now_ts` ("24h"), or an ISO date."""
    text = text.strip()
    if text == "now":
        return now_ts
    if _NUMBER.fullmatch(text):
        # A bare number read as seconds back from now put 1795946400 57 years ago.
        ts = float(text)
        if not math.isfinite(ts):
            raise ValueError(f"cannot read {text!r} as a unix timestamp")
        return ts
    try:
        return now_ts - parse_duration(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a time: use a duration back from now (30m, 24h, 7d), "
            "unix seconds (1795946400) or an ISO date (2026-11-29 or 2026-11-29T14:00)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a date without a zone is local time, as people mean it
    return when.timestamp()
