"""Probe sets: the shipped default, lookup by name or path, and one-line errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llm_watchdog.probe.sets import (
    ProbeSetError,
    Prompt,
    available_probe_sets,
    load_probe_set,
)
from llm_watchdog.resources import bundled_dir

# Answers SmolLM2-135M-Instruct (Q4_1, llama.cpp, temperature 0) gave to the default set, in
# the default cache-busting mode: the expectations must accept all of them.
SMOLLM2_ANSWERS = {
    "capital-france": "The capital of France is Paris.",
    "capital-japan": "The capital of Japan is Tokyo.",
    "week-days": "A week is 7 days.",
    "dog-legs": "A dog has four legs.",
    "two-plus-two": "2 + 2 = 4",
}
WRONG_ANSWERS = {
    "capital-france": "The capital of France is Lyon.",
    "capital-japan": "The capital of Japan is Kyoto.",
    "week-days": "A week has 70 days.",
    "dog-legs": "A dog has 14 legs.",
    "two-plus-two": "2 + 2 = 44",
}


def write(tmp_path: Path, text: str, name: str = "set.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_default_set_ships_short_checked_prompts() -> None:
    ps = load_probe_set("default")
    assert ps.name == "default"
    assert ps.path == bundled_dir("probesets") / "default.toml"
    assert len(ps) >= 5
    assert len({p.id for p in ps.prompts}) == len(ps)
    assert ps.sha256 == hashlib.sha256(ps.path.read_bytes()).hexdigest()
    for p in ps.prompts:
        assert p.max_tokens in range(1, 25)
        assert [m["role"] for m in p.messages] == ["user"]


def test_default_expectations_accept_a_small_models_answers_and_reject_wrong_ones() -> None:
    ps = load_probe_set("default")
    assert set(SMOLLM2_ANSWERS) == {p.id for p in ps.prompts}
    for p in ps.prompts:
        assert p.check(SMOLLM2_ANSWERS[p.id]), p.id
        assert not p.check(WRONG_ANSWERS[p.id]), p.id
        assert not p.check(""), p.id


def test_checks_are_case_insensitive() -> None:
    any_of = Prompt("a", ({"role": "user", "content": "q"},), expect_any_of=("Paris", "lutetia"))
    assert any_of.check("PARIS!") and any_of.check("Lutetia") and not any_of.check("Rome")
    regex = Prompt("b", ({"role": "user", "content": "q"},), expect_regex=r"\bfour\b")
    assert regex.check("It is FOUR.") and not regex.check("fourteen")
    assert regex.expectation == "regex '\\\\bfour\\\\b'"
    assert any_of.expectation == "any of 'Paris', 'lutetia'"


def test_prompts_hash_and_compare_by_value() -> None:
    ps = load_probe_set("default")
    again = load_probe_set("default")
    assert ps.prompts == again.prompts
    assert {p: p.id for p in ps.prompts}[again.prompts[0]] == again.prompts[0].id


def test_prompt_needs_exactly_one_expectation() -> None:
    with pytest.raises(ValueError, match="exactly one of expect_regex, expect_any_of"):
        Prompt("a", ({"role": "user", "content": "q"},))


def test_full_format_with_messages_defaults_and_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
name = "mine"
max_tokens = 12

[[prompts]]
id = "sys"
messages = [{role = "system", content = "Be brief."}, {role = "user", content = "2+2?"}]
regex = '\\b4\\b'
max_tokens = 20

[[prompts]]
id = "q"
question = "Capital of Italy?"
any_of = ["rome", "roma"]
""",
    )
    ps = load_probe_set(str(path))
    assert ps.name == "mine" and ps.path == path
    sys_prompt, q = ps.prompts
    assert sys_prompt.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
    )
    assert (sys_prompt.max_tokens, q.max_tokens) == (20, 12)
    assert q.messages == ({"role": "user", "content": "Capital of Italy?"},)
    assert ps.get("q") is q
    with pytest.raises(KeyError):
        ps.get("nope")


def test_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    path = write(tmp_path, '[[prompts]]\nid = "a"\nquestion = "q"\nany_of = ["x"]\n', "quick.toml")
    assert load_probe_set(str(path)).name == "quick"


def test_lookup_by_name_prefers_extra_dirs_over_bundled(tmp_path: Path) -> None:
    write(
        tmp_path,
        'name = "override"\n[[prompts]]\nid = "a"\nquestion = "q"\nany_of = ["x"]\n',
        "default.toml",
    )
    assert load_probe_set("default", [tmp_path]).name == "override"
    assert load_probe_set("default", [tmp_path / "missing"]).name == "default"
    assert available_probe_sets([tmp_path]) == ["default"]


def test_unknown_name_lists_what_exists(tmp_path: Path) -> None:
    with pytest.raises(ProbeSetError) as info:
        load_probe_set("nightly", [tmp_path])
    msg = str(info.value)
    assert msg.startswith("probe set 'nightly' not found in ")
    assert str(tmp_path) in msg and "known: default" in msg and "\n" not in msg


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ProbeSetError, match="probe set file not found"):
        load_probe_set(str(tmp_path / "nope.toml"))


HEADER = '[[prompts]]\nid = "p1"\n'
BAD_SETS = [
    (
        "top-key",
        'nmae = "x"\n' + HEADER + 'question = "q"\nany_of = ["x"]\n',
        "unknown key 'nmae' at top level",
    ),
    (
        "prompt-key",
        HEADER + 'question = "q"\nany_of = ["x"]\nexpect = "x"\n',
        "prompt 'p1': unknown key 'expect'",
    ),
    (
        "bad-regex",
        HEADER + 'question = "q"\nregex = "(unclosed"\n',
        "prompt 'p1': 'regex' is not a valid pattern",
    ),
    (
        "duplicate",
        HEADER + 'question = "q"\nany_of = ["x"]\n' + HEADER + 'question = "r"\nany_of = ["y"]\n',
        "prompt 'p1': duplicate id",
    ),
    ("empty", 'name = "x"\n', "no prompts; add at least one [[prompts]] table"),
    ("empty-list", "prompts = []\n", "no prompts; add at least one [[prompts]] table"),
    ("not-tables", 'prompts = "x"\n', "'prompts' must be an array of tables"),
    (
        "two-texts",
        HEADER + 'question = "q"\nmessages = [{role = "user", content = "q"}]\nany_of = ["x"]\n',
        "prompt 'p1': give exactly one of 'question' or 'messages'",
    ),
    (
        "no-text",
        HEADER + 'any_of = ["x"]\n',
        "prompt 'p1': give exactly one of 'question' or 'messages'",
    ),
    (
        "two-expect",
        HEADER + 'question = "q"\nany_of = ["x"]\nregex = "x"\n',
        "prompt 'p1': give exactly one expectation, 'regex' or 'any_of'",
    ),
    ("no-expect", HEADER + 'question = "q"\n', "prompt 'p1': give exactly one expectation"),
    ("empty-any", HEADER + 'question = "q"\nany_of = []\n', "'any_of' must be a non-empty list"),
    ("blank-any", HEADER + 'question = "q"\nany_of = [" "]\n', "'any_of' must be a non-empty list"),
    (
        "zero-tokens",
        HEADER + 'question = "q"\nany_of = ["x"]\nmax_tokens = 0\n',
        "'max_tokens' must be an integer from 1 to 4096, got 0",
    ),
    (
        "bool-tokens",
        "max_tokens = true\n" + HEADER + 'question = "q"\nany_of = ["x"]\n',
        "top level: 'max_tokens' must be an integer",
    ),
    (
        "bad-role",
        HEADER + 'messages = [{role = "bot", content = "q"}]\nany_of = ["x"]\n',
        "message 1 role 'bot' must be one of system, user, assistant",
    ),
    (
        "last-not-user",
        HEADER
        + 'messages = [{role = "user", content = "q"}, {role = "assistant", content = "a"}]\n'
        + 'any_of = ["x"]\n',
        "the last message must have role 'user'",
    ),
    (
        "message-keys",
        HEADER + 'messages = [{role = "user", content = "q", name = "n"}]\nany_of = ["x"]\n',
        "message 1 must have exactly the keys 'role' and 'content'",
    ),
    (
        "blank-question",
        HEADER + 'question = "  "\nany_of = ["x"]\n',
        "'question' must be a non-empty string",
    ),
    ("no-id", '[[prompts]]\nquestion = "q"\nany_of = ["x"]\n', "prompt #1: 'id' must be a string"),
    (
        "bad-id",
        '[[prompts]]\nid = "a b"\nquestion = "q"\nany_of = ["x"]\n',
        "prompt #1: 'id' must be a string",
    ),
    ("not-toml", "[[prompts]\n", "not valid TOML"),
]


@pytest.mark.parametrize(("case", "text", "expected"), BAD_SETS, ids=[c[0] for c in BAD_SETS])
def test_bad_probe_sets_give_one_line_naming_file_and_prompt(
    tmp_path: Path, case: str, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProbeSetError) as info:
        load_probe_set(str(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}: ")
    assert expected in msg
    assert "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b"name = '\xff'\n")
    with pytest.raises(ProbeSetError, match="not UTF-8 text"):
        load_probe_set(str(path))
