"""The stream parsers on real llama.cpp captures, documented engine shapes and odd streams."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_watchdog.probe.streams import (
    CHUNK,
    DONE,
    PROTOCOL_ERROR,
    SERVER_ERROR,
    NdjsonParser,
    SseParser,
    StreamEvent,
    parse_all,
    parser_for,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ANSWER = "The capital of France is Paris."


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def api_of(name: str) -> str:
    return "ollama" if name.endswith(".ndjson") else "openai"


def feed_in_pieces(data: bytes, api: str, cuts: list[int]) -> list[StreamEvent]:
    parser = parser_for(api)
    events: list[StreamEvent] = []
    last = 0
    for cut in [*sorted(cuts), len(data)]:
        events += parser.feed(data[last:cut])
        last = cut
    return events + parser.close()


@dataclass(frozen=True, kw_only=True)
class Summary:
    """What a probe reads from a whole stream. The defaults are what a stream without that
    part (no reasoning, no tool call, no usage, no load time, no error) reads as, so an
    expectation names only what its stream has; equality still compares every field."""

    content: str
    reasoning: str = ""
    tokens: int  # events that carry a token
    tool_call: bool = False
    completion_tokens: int | None = None
    load_duration_ms: float | None = None
    kinds: tuple[str, ...]  # distinct kinds in order of first appearance
    first_is_token: bool  # False when a role-only or empty chunk comes first
    done: bool
    finish: str | None
    error: str = ""


def summarize(events: list[StreamEvent]) -> Summary:
    kinds: list[str] = []
    for e in events:
        if e.kind not in kinds:
            kinds.append(e.kind)
    usage = [e.completion_tokens for e in events if e.completion_tokens is not None]
    loads = [e.load_duration_ms for e in events if e.load_duration_ms is not None]
    finish = [e.finish_reason for e in events if e.finish_reason]
    errors = [e.message for e in events if e.kind in (SERVER_ERROR, PROTOCOL_ERROR)]
    return Summary(
        content="".join(e.content for e in events),
        reasoning="".join(e.reasoning for e in events),
        tokens=sum(e.has_token for e in events),
        tool_call=any(e.tool_call for e in events),
        completion_tokens=usage[-1] if usage else None,
        load_duration_ms=loads[-1] if loads else None,
        kinds=tuple(kinds),
        first_is_token=events[0].has_token,
        done=events[-1].kind == DONE,
        finish=finish[-1] if finish else None,
        error=errors[0] if errors else "",
    )


# fixture -> what a probe must read from it
EXPECTED = {
    "llamacpp/chat_stream_usage.sse": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="stop",
    ),
    "llamacpp/chat_stream_plain.sse": Summary(
        content="1. Red\n2. Blue\n3. Green",
        tokens=11,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="stop",
    ),
    "vllm/chat_stream_usage.sse": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="stop",
    ),
    "vllm/chat_stream_reasoning.sse": Summary(
        content=" Paris.",
        reasoning="Okay, the user asks for a capital.",
        tokens=11,
        completion_tokens=18,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="stop",
    ),
    "vllm/chat_stream_tool_call.sse": Summary(
        content="",
        tokens=4,
        tool_call=True,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="tool_calls",
    ),
    "vllm/chat_stream_error.sse": Summary(
        content="The capital",
        tokens=2,
        kinds=(CHUNK, SERVER_ERROR, DONE),
        first_is_token=False,
        done=True,
        finish=None,
        error=(
            "The decoder prompt (length 33000) is longer than the maximum model length of "
            "32768. (BadRequestError)"
        ),
    ),
    "sglang/chat_stream_usage.sse": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="stop",
    ),
    "sglang/chat_stream_reasoning.sse": Summary(
        content=" Paris.",
        reasoning="Okay, the user asks for a capital.",
        tokens=11,
        completion_tokens=18,
        kinds=(CHUNK, DONE),
        first_is_token=False,
        done=True,
        finish="stop",
    ),
    "sglang/chat_stream_error.sse": Summary(
        content="The",
        tokens=1,
        kinds=(CHUNK, SERVER_ERROR, DONE),
        first_is_token=False,
        done=True,
        finish=None,
        error=(
            "Requested token count exceeds the model's maximum context length of 32768 "
            "tokens. (BadRequestError)"
        ),
    ),
    "tgi/chat_stream_usage.sse": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        kinds=(CHUNK, DONE),
        first_is_token=True,
        done=True,
        finish="stop",
    ),
    "tgi/chat_stream_error.sse": Summary(
        content="The capital",
        tokens=2,
        kinds=(CHUNK, SERVER_ERROR),
        first_is_token=True,
        done=False,
        finish=None,
        error=(
            "Request failed during generation: Server error: CUDA out of memory. "
            "Tried to allocate 20.00 MiB"
        ),
    ),
    "ollama/v1_chat_stream_usage.sse": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        kinds=(CHUNK, DONE),
        first_is_token=True,
        done=True,
        finish="stop",
    ),
    "ollama/v1_chat_stream_reasoning.sse": Summary(
        content="Paris.",
        reasoning="Okay, France's capital.",
        tokens=8,
        kinds=(CHUNK, DONE),
        first_is_token=True,
        done=True,
        finish="stop",
    ),
    "ollama/v1_chat_stream_error.sse": Summary(
        content="The",
        tokens=1,
        kinds=(CHUNK, SERVER_ERROR, DONE),
        first_is_token=True,
        done=True,
        finish=None,
        error="an error was encountered while running the model: unexpected EOF (api_error)",
    ),
    "ollama/api_chat_stream.ndjson": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        load_duration_ms=1.334875,
        kinds=(CHUNK, DONE),
        first_is_token=True,
        done=True,
        finish="stop",
    ),
    "ollama/api_chat_cold.ndjson": Summary(
        content=ANSWER,
        tokens=7,
        completion_tokens=8,
        load_duration_ms=5534.986708,
        kinds=(CHUNK, DONE),
        first_is_token=True,
        done=True,
        finish="stop",
    ),
    "ollama/api_chat_thinking.ndjson": Summary(
        content="Paris.",
        reasoning="Okay, the capital.",
        tokens=7,
        completion_tokens=7,
        load_duration_ms=1.334875,
        kinds=(CHUNK, DONE),
        first_is_token=True,
        done=True,
        finish="stop",
    ),
    "ollama/api_chat_error.ndjson": Summary(
        content="The",
        tokens=1,
        kinds=(CHUNK, SERVER_ERROR),
        first_is_token=True,
        done=False,
        finish=None,
        error="an error was encountered while running the model: unexpected EOF",
    ),
}


def test_every_stream_fixture_has_an_expectation() -> None:
    on_disk = {
        str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*") if p.suffix in (".sse", ".ndjson")
    }
    assert on_disk == set(EXPECTED)


def test_llamacpp_captures_are_the_recorded_ones_byte_for_byte() -> None:
    # The parsers are checked byte for byte against these files, so an editor that rewrites
    # line ends or trailing spaces would test something no engine sent. SHA256SUMS holds the
    # digests of the files as captured (`sha256sum -c SHA256SUMS` checks them by hand too).
    folder = FIXTURES / "llamacpp"
    recorded: dict[str, str] = {}  # file name -> hex digest
    for line in (folder / "SHA256SUMS").read_text(encoding="ascii").splitlines():
        digest, name = line.split("  ", 1)
        recorded[name] = digest
    assert sorted(recorded) == sorted(p.name for p in folder.iterdir() if p.name != "SHA256SUMS")
    for name, digest in recorded.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


def test_every_written_fixture_folder_names_its_source() -> None:
    for folder in ("vllm", "sglang", "tgi", "ollama"):
        text = (FIXTURES / folder / "SOURCE.md").read_text()
        for name in EXPECTED:
            if name.startswith(folder + "/"):
                assert name.split("/", 1)[1] in text, f"{name} not described in {folder}/SOURCE.md"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_parses_to_what_a_probe_needs(name: str) -> None:
    assert summarize(parse_all(fixture(name), api_of(name))) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_split_at_random_points_gives_the_same_events(name: str) -> None:
    data = fixture(name)
    whole = parse_all(data, api_of(name))
    rng = random.Random(name)
    for _ in range(25):
        cuts = [rng.randrange(0, len(data) + 1) for _ in range(rng.randrange(1, 40))]
        assert feed_in_pieces(data, api_of(name), cuts) == whole


@pytest.mark.parametrize(
    "name", ["llamacpp/chat_stream_usage.sse", "llamacpp/chat_stream_plain.sse"]
)
def test_real_llamacpp_capture_fed_one_byte_at_a_time(name: str) -> None:
    data = fixture(name)
    assert feed_in_pieces(data, "openai", list(range(len(data)))) == parse_all(data)


@pytest.mark.parametrize("eol", ["\r\n", "\r"])
def test_crlf_and_cr_line_ends_read_like_lf(eol: str) -> None:
    data = fixture("llamacpp/chat_stream_usage.sse")
    converted = data.decode().replace("\n", eol).encode()
    assert parse_all(converted) == parse_all(data)
    # CR and LF arriving in different reads must not make an extra blank line
    cuts = [i + 1 for i, b in enumerate(converted) if b == 0x0D]
    assert feed_in_pieces(converted, "openai", cuts) == parse_all(data)


def test_role_only_chunk_and_empty_content_are_events_without_a_token() -> None:
    events = parse_all(
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    )
    assert [e.kind for e in events] == [CHUNK, CHUNK, CHUNK]
    assert [e.has_token for e in events] == [False, False, True]


def test_comments_are_counted_not_dispatched() -> None:
    parser = SseParser()
    events = parser.feed(b": keep-alive\n\n:\n\n: ping\ndata: [DONE]\n\n")
    assert [e.kind for e in events] == [DONE]
    assert parser.comments == 3


def test_multi_line_data_is_joined_with_newlines() -> None:
    events = parse_all(b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"Paris"}}]}\n\n')
    assert [(e.kind, e.content) for e in events] == [(CHUNK, "Paris")]


def test_data_without_space_after_colon_and_unknown_fields() -> None:
    events = parse_all(
        b'id: 7\nretry: 1000\nfoo: bar\ndata:{"choices":[{"delta":{"content":"a"}}]}\n\n'
        b"data:[DONE]\n\n"
    )
    assert [(e.kind, e.content) for e in events] == [(CHUNK, "a"), (DONE, "")]


def test_missing_done_gives_no_done_event_and_a_missing_last_blank_line_still_counts() -> None:
    events = parse_all(
        b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"b"}}]}'
    )
    assert [(e.kind, e.content) for e in events] == [(CHUNK, "a"), (CHUNK, "b")]
    assert events[0].finish_reason == "stop"


def test_non_json_line_is_a_protocol_error_and_parsing_goes_on() -> None:
    events = parse_all(
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b"data: <html>502 Bad Gateway</html>\n\n"
        b"data: [1, 2]\n\n"
        b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert [e.kind for e in events] == [CHUNK, PROTOCOL_ERROR, PROTOCOL_ERROR, CHUNK, DONE]
    assert events[1].message == "data is not JSON: <html>502 Bad Gateway</html>"
    assert events[2].message == "data is not an object: [1, 2]"
    assert events[3].content == "b"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'data: {"error": "boom"}\n\n', "boom"),
        (
            b'data: {"error": {"message": "oom", "type": "InternalServerError"}}\n\n',
            "oom (InternalServerError)",
        ),
        (b'data: {"error": {"code": 500}}\n\n', '{"code": 500}'),
        (
            b'data: {"object": "error", "message": "bad", "type": "BadRequestError"}\n\n',
            "bad (BadRequestError)",
        ),
        (b"event: error\ndata: upstream failed\n\n", "upstream failed"),
        (b'event: error\ndata: {"detail": "x"}\n\n', '{"detail": "x"}'),
    ],
)
def test_error_shapes_inside_a_200_stream(data: bytes, message: str) -> None:
    events = parse_all(data)
    assert [(e.kind, e.message) for e in events] == [(SERVER_ERROR, message)]


def test_error_false_or_null_is_not_an_error() -> None:
    events = parse_all(b'data: {"error": null, "choices": [{"delta": {"content": "a"}}]}\n\n')
    assert [(e.kind, e.content) for e in events] == [(CHUNK, "a")]


def test_utf8_split_inside_a_character() -> None:
    data = 'data: {"choices":[{"delta":{"content":"Zürich 🚀"}}]}\n\n'.encode()
    every_byte = feed_in_pieces(data, "openai", list(range(len(data))))
    assert [e.content for e in every_byte] == ["Zürich 🚀"]


def test_reasoning_field_names_and_tool_calls_count_as_tokens() -> None:
    events = parse_all(
        b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n'
        b'data: {"choices":[{"delta":{"reasoning":"ok"}}]}\n\n'
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}\n\n'
        b'data: {"choices":[{"delta":{"tool_calls":[]}}]}\n\n'
    )
    assert [(e.reasoning, e.tool_call, e.has_token) for e in events] == [
        ("hm", False, True),
        ("ok", False, True),
        ("", True, True),
        ("", False, False),
    ]


def test_usage_chunk_with_empty_choices() -> None:
    (event,) = parse_all(
        b'data: {"choices":[],"usage":{"completion_tokens":8,"prompt_tokens":42}}\n\n'
    )
    assert (event.kind, event.has_token, event.completion_tokens, event.prompt_tokens) == (
        CHUNK,
        False,
        8,
        42,
    )


def test_ollama_final_line_counters_and_done() -> None:
    data = fixture("ollama/api_chat_cold.ndjson")
    final = json.loads(data.splitlines()[-1])
    events = parse_all(data, "ollama")
    assert events[-1].kind == DONE
    assert events[-2].completion_tokens == final["eval_count"] == 8
    assert events[-2].prompt_tokens == final["prompt_eval_count"]
    assert events[-2].load_duration_ms == pytest.approx(final["load_duration"] / 1e6)


def test_ollama_non_json_line_and_crlf() -> None:
    parser = NdjsonParser()
    events = parser.feed(b'{"message":{"content":"a"},"done":false}\r\nnot json\r\n\r\n[1]\n')
    events += parser.feed(b'{"message":{"content":"b"},"done":true,"eval_count":2}')
    events += parser.close()
    assert [(e.kind, e.content) for e in events] == [
        (CHUNK, "a"),
        (PROTOCOL_ERROR, ""),
        (PROTOCOL_ERROR, ""),
        (CHUNK, "b"),
        (DONE, ""),
    ]
    assert events[1].message == "line is not JSON: not json"


def test_long_error_text_is_one_short_line() -> None:
    (event,) = parse_all(b'data: {"error": "' + b"x\\n" * 300 + b'"}\n\n')
    assert "\n" not in event.message
    assert len(event.message) <= 120


def test_parser_for_unknown_api() -> None:
    with pytest.raises(ValueError, match="unknown api 'grpc': expected 'openai' or 'ollama'"):
        parser_for("grpc")
