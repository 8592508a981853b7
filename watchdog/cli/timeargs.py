"""`--since 24h` / `--until 2026-11-29T10:00` arguments: a duration back from now, or a date."""

from __future__ import annotations

import datetime as dt

from llm_watchdog.durations import parse_duration


def parse_when(text: str, now_ts: float) -> float:
    """Unix seconds for `text`: a duration before `now_ts` ("24h"), an ISO date or "now"."""
    text = text.strip()
    if text == "now":
        return now_ts
    try:
        return now_ts - parse_duration(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as a time: use a duration back from now (30m, 24h, 7d) "
            "or an ISO date (2026-11-29 or 2026-11-29T14:00)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a date without a zone is local time, as people mean it
    return when.timestamp()
