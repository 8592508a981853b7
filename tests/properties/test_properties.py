"""Properties of everything that reads outside input: the SSE and NDJSON stream parsers, the
config loader, the replay reader, the control API's JSON and the CLI's time arguments. Each
gives a result or its own clean error, never another exception.

Marked slow: the tier runs again with `HYPOTHESIS_PROFILE=thorough` (10,000 examples each,
tests/properties/conftest.py); the default run uses the quick profile.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_watchdog.cli.timeargs import parse_when
from llm_watchdog.config import Settings, settings_from_dict
from llm_watchdog.drift.replay import OPTIONAL, REQUIRED, ReplayError, parse_trace
from llm_watchdog.drift.values import Observation
from llm_watchdog.errors import ConfigError
from llm_watchdog.gateway.control import parse_put
from llm_watchdog.logs import printable
from llm_watchdog.probe.streams import (
    CHUNK,
    DONE,
    PROTOCOL_ERROR,
    SERVER_ERROR,
    StreamEvent,
    parse_all,
    parser_for,
)
from tests.properties.conftest import THOROUGH_EXAMPLES

pytestmark = pytest.mark.slow

KINDS = {CHUNK, DONE, SERVER_ERROR, PROTOCOL_ERROR}

# ---- streams -----------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
# Pieces a real stream is made of, and noise around them, so that examples reach deep into
# the parsers rather than stopping at the first byte.
chunk_objects = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "delta": st.dictionaries(
                        st.sampled_from(["content", "reasoning_content", "role", "tool_calls"]),
                        json_values,
                        max_size=3,
                    ),
                    "finish_reason": json_values,
                    "message": json_values,
                },
            )
            | json_values,
            max_size=3,
        ),
        "usage": st.dictionaries(
            st.sampled_from(["completion_tokens", "prompt_tokens"]), json_values, max_size=2
        ),
        "error": json_values,
        "object": st.sampled_from(["error", "chat.completion.chunk"]),
        "message": json_values,
        "done": json_values,
        "eval_count": json_values,
        "load_duration": json_values,
        "done_reason": json_values,
    },
)
sse_lines = st.one_of(
    chunk_objects.map(lambda o: "data: " + json.dumps(o)),
    st.just("data: [DONE]"),
    st.just(": keep-alive"),
    st.just("event: error"),
    st.just(""),
    st.text(max_size=30).map(lambda t: "data:" + t),
    st.text(max_size=30),
)
eols = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def sse_bodies(draw: Any) -> bytes:
    lines = draw(st.lists(st.tuples(sse_lines, eols), max_size=12))
    text = "".join(line + eol for line, eol in lines)
    raw = text.encode("utf-8", errors="surrogatepass")
    if draw(st.booleans()):
        raw += draw(st.binary(max_size=20))  # broken UTF-8, stray bytes
    return raw


@st.composite
def ndjson_bodies(draw: Any) -> bytes:
    lines = draw(
        st.lists(
            chunk_objects.map(json.dumps) | st.text(max_size=30) | json_values.map(json.dumps),
            max_size=10,
        )
    )
    raw = "\n".join(lines).encode("utf-8", errors="surrogatepass")
    if draw(st.booleans()):
        raw += draw(st.binary(max_size=20))
    return raw


def splits(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    start = 0
    for p in points:
        yield data[start:p]
        start = p
    yield data[start:]


def parse_in_pieces(data: bytes, api: str, cuts: list[int]) -> list[StreamEvent]:
    parser = parser_for(api)
    out: list[StreamEvent] = []
    for piece in splits(data, cuts):
        out.extend(parser.feed(piece))
    return out + parser.close()


def check_events(events: list[StreamEvent]) -> None:
    for e in events:
        assert e.kind in KINDS
        assert e.completion_tokens is None or e.completion_tokens >= 0
        assert e.load_duration_ms is None or e.load_duration_ms >= 0
        assert "\n" not in e.message and "\x1b" not in e.message  # one inert line
        assert len(e.message) <= 200


@given(sse_bodies() | st.binary(max_size=300), st.lists(st.integers(0, 10_000), max_size=8))
def test_sse_parser_gives_the_same_events_however_the_bytes_are_split(
    data: bytes, cuts: list[int]
) -> None:
    whole = parse_all(data, "openai")
    check_events(whole)
    assert parse_in_pieces(data, "openai", cuts) == whole


@given(ndjson_bodies() | st.binary(max_size=300), st.lists(st.integers(0, 10_000), max_size=8))
def test_ndjson_parser_gives_the_same_events_however_the_bytes_are_split(
    data: bytes, cuts: list[int]
) -> None:
    whole = parse_all(data, "ollama")
    check_events(whole)
    assert parse_in_pieces(data, "ollama", cuts) == whole


# ---- config -------------------------------------------------------------------------------

KNOWN = Settings().to_dict()
config_values = st.one_of(
    json_scalars,
    st.sampled_from(["1s", "10m", "0s", "-1s", "1e308s", "inf", "nan", "5x", "", "auto", "all"]),
    st.lists(json_scalars, max_size=3),
    st.dictionaries(st.text(max_size=6), json_scalars, max_size=2),
)


@st.composite
def config_dicts(draw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from([*KNOWN, "nonsense"]), max_size=4, unique=True)):
        keys = list(KNOWN.get(section) or {}) + ["unknown_key", "type", "name"]
        table = draw(st.dictionaries(st.sampled_from(keys), config_values, max_size=5))
        out[section] = draw(st.just(table) | config_values) if section != "alerts" else table
    return out


@given(config_dicts())
def test_config_loader_gives_settings_or_a_config_error(data: dict[str, Any]) -> None:
    try:
        s = settings_from_dict(data, "fuzz.toml")
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith("fuzz.toml") and "\n" not in msg
        return
    assert isinstance(s, Settings)
    assert s.probe.interval_s > 0 and math.isfinite(s.probe.interval_s)


# ---- the replay reader ---------------------------------------------------------------------

cells = st.one_of(
    st.sampled_from(["", " ", "0", "1", "true", "no", "nan", "inf", "-1", "1e308", "0x20", "x"]),
    st.floats(allow_nan=True).map(repr),
    st.integers(-10, 10**12).map(str),
    st.text(max_size=8),
)


@st.composite
def traces(draw: Any) -> str:
    columns = draw(
        st.lists(st.sampled_from([*REQUIRED, *OPTIONAL, "extra", ""]), min_size=1, max_size=8)
    )
    rows = draw(st.lists(st.lists(cells, min_size=0, max_size=len(columns) + 1), max_size=12))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns)
    w.writerows(rows)
    text = buf.getvalue()
    return draw(st.just(text) | st.text(max_size=200))


@given(traces())
def test_replay_reader_gives_observations_or_a_replay_error(text: str) -> None:
    fd, name = tempfile.mkstemp(suffix=".csv")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass", newline="") as f:
            f.write(text)
        try:
            observations = parse_trace(Path(name))
        except ReplayError as exc:
            assert "\n" not in str(exc)
            return
    finally:
        os.unlink(name)
    assert all(isinstance(o, Observation) for o in observations)
    stamps = [o.ts for o in observations]
    assert stamps == sorted(stamps) and all(math.isfinite(t) for t in stamps)


# ---- the control API's JSON ------------------------------------------------------------------


@given(
    st.dictionaries(
        st.sampled_from(["allowance", "lease_s", "reason", "other"]), json_values, max_size=4
    )
    | json_values,
    st.integers(0, 1024),
)
def test_control_put_gives_a_change_or_a_one_line_error(data: Any, ceiling: int) -> None:
    out = parse_put(data, ceiling)
    if isinstance(out, str):
        assert out and "\n" not in printable(out)
        return
    value, lease_s, reason = out
    assert isinstance(value, int) and 0 <= value <= ceiling
    assert lease_s is None or (math.isfinite(lease_s) and lease_s > 0)
    assert isinstance(reason, str)


# ---- the CLI's time arguments ----------------------------------------------------------------


@given(
    st.one_of(
        st.text(max_size=30),
        st.floats().map(repr),
        st.integers().map(str),
        st.sampled_from(["1e308", "-1e308", "inf", "nan", "9999-12-31", "0001-01-01", "24h"]),
    )
)
def test_time_arguments_give_a_time_since_1970_or_a_value_error(text: str) -> None:
    try:
        ts = parse_when(text, 1_764_000_000.0)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(ts) and ts >= 0


def test_the_thorough_profile_runs_10000_examples() -> None:
    assert settings.get_profile("thorough").max_examples >= THOROUGH_EXAMPLES == 10_000


def test_a_config_key_holding_a_newline_is_named_on_one_line() -> None:
    # Found by the thorough profile: an unknown key "\n" made a two-line error.
    with pytest.raises(ConfigError) as err:
        settings_from_dict({"server": {"\n": None}}, "fuzz.toml")
    assert "\n" not in str(err.value) and "[server] \\n: unknown key" in str(err.value)
