"""Probe sets: the fixed canary prompts and what a right answer looks like.

A probe set is a plain-text TOML file (`probes/default.toml` ships with the package):

    name = "default"                 # optional, defaults to the file name
    description = "..."              # optional
    max_tokens = 16                  # optional default for every prompt

    [[prompts]]
    id = "capital-france"
    question = "What is the capital of France? Answer in one word."
    any_of = ["paris"]               # case-insensitive substrings, any one must occur

    [[prompts]]
    id = "two-plus-two"
    messages = [{role = "user", content = "What is 2 + 2?"}]
    regex = '\\b(4|four)\\b'          # case-insensitive `re.search`
    max_tokens = 16

Each prompt has an `id`, either `question` (one user message) or `messages`, exactly one
expectation (`regex` or `any_of`), and optionally `max_tokens`. Unknown keys are errors, so a
typo never silently turns a check off. Every error is a `ProbeSetError` whose one-line message
names the file, the prompt and what was expected.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_watchdog.errors import ConfigError
from llm_watchdog.resources import bundled_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096  # a canary is short; a larger value is almost certainly a typo
ROLES = ("system", "user", "assistant")
_SET_KEYS = {"name", "description", "max_tokens", "prompts"}
_PROMPT_KEYS = {"id", "question", "messages", "regex", "any_of", "max_tokens"}
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ProbeSetError(ConfigError, ValueError):
    """A probe set that cannot be used. The message is one line: file, prompt, what to fix."""


@dataclass(frozen=True)
class Prompt:
    """One canary prompt. `messages` are OpenAI-style dicts with `role` and `content`."""

    id: str
    messages: tuple[dict[str, str], ...]
    expect_regex: str | None = None
    expect_any_of: tuple[str, ...] = ()
    max_tokens: int = DEFAULT_MAX_TOKENS
    _pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.expect_regex is None) == (not self.expect_any_of):
            raise ValueError(f"prompt {self.id!r}: give exactly one of expect_regex, expect_any_of")
        if self.expect_regex is not None and self._pattern is None:
            object.__setattr__(self, "_pattern", re.compile(self.expect_regex, re.IGNORECASE))

    def __hash__(self) -> int:  # messages are dicts: hash what they say
        pairs = tuple((m["role"], m["content"]) for m in self.messages)
        return hash((self.id, pairs, self.expect_regex, self.expect_any_of, self.max_tokens))

    @property
    def expectation(self) -> str:
        """The expectation as a person reads it, for reports and error details."""
        if self.expect_regex is not None:
            return f"regex {self.expect_regex!r}"
        return "any of " + ", ".join(repr(s) for s in self.expect_any_of)

    def check(self, answer: str) -> bool:
        """True when the answer meets the expectation (case-insensitive)."""
        if self._pattern is not None:
            return self._pattern.search(answer) is not None
        folded = answer.casefold()
        return any(s.casefold() in folded for s in self.expect_any_of)


@dataclass(frozen=True)
class ProbeSet:
    name: str
    path: Path
    prompts: tuple[Prompt, ...]
    sha256: str  # of the file's bytes: part of the fingerprint, so an edited set is a new one

    def __len__(self) -> int:
        return len(self.prompts)

    def get(self, prompt_id: str) -> Prompt:
        for p in self.prompts:
            if p.id == prompt_id:
                return p
        raise KeyError(prompt_id)


def load_probe_set(name_or_path: str, extra_dirs: Sequence[Path] = ()) -> ProbeSet:
    """Load a probe set from a path, or by name from `extra_dirs`, then the bundled sets.

    A value containing a path separator or ending in `.toml` is a path. A name `foo` is looked
    up as `foo.toml` in each extra dir in order, then in `bundled_dir("probesets")`.
    """
    path = _find(name_or_path, extra_dirs)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProbeSetError(f"{path}: cannot read probe set ({exc.strerror or exc})") from exc
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ProbeSetError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProbeSetError(f"{path}: not valid TOML: {exc}") from exc
    return _parse(doc, path, hashlib.sha256(raw).hexdigest())


def available_probe_sets(extra_dirs: Sequence[Path] = ()) -> list[str]:
    """Names of the probe sets found in `extra_dirs` and the bundled folder."""
    names: set[str] = set()
    for d in (*extra_dirs, bundled_dir("probesets")):
        if Path(d).is_dir():
            names.update(p.stem for p in Path(d).glob("*.toml"))
    return sorted(names)


def _find(name_or_path: str, extra_dirs: Sequence[Path]) -> Path:
    if not name_or_path.strip():
        raise ProbeSetError("probe set: empty name; give a name like 'default' or a .toml path")
    looks_like_path = "/" in name_or_path or "\\" in name_or_path or name_or_path.endswith(".toml")
    if looks_like_path:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ProbeSetError(f"{path}: probe set file not found")
        return path
    dirs = [Path(d) for d in extra_dirs] + [bundled_dir("probesets")]
    for d in dirs:
        candidate = d / f"{name_or_path}.toml"
        if candidate.is_file():
            return candidate
    known = ", ".join(available_probe_sets(extra_dirs)) or "none"
    searched = ", ".join(str(d) for d in dirs)
    raise ProbeSetError(
        f"probe set {name_or_path!r} not found in {searched} (known: {known}); "
        "give a name or a path to a .toml file"
    )


def _parse(doc: dict[str, Any], path: Path, sha256: str) -> ProbeSet:
    unknown = sorted(set(doc) - _SET_KEYS)
    if unknown:
        raise ProbeSetError(
            f"{path}: unknown key {unknown[0]!r} at top level "
            f"(expected: {', '.join(sorted(_SET_KEYS))})"
        )
    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ProbeSetError(f"{path}: 'name' must be a non-empty string")
    default_max = _max_tokens(doc.get("max_tokens", DEFAULT_MAX_TOKENS), path, "top level")
    items = doc.get("prompts")
    if items is None or (isinstance(items, list) and not items):
        raise ProbeSetError(f"{path}: no prompts; add at least one [[prompts]] table")
    if not isinstance(items, list):
        raise ProbeSetError(f"{path}: 'prompts' must be an array of tables ([[prompts]])")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for n, item in enumerate(items, start=1):
        prompt = _parse_prompt(item, n, path, default_max)
        if prompt.id in seen:
            raise ProbeSetError(f"{path}: prompt {prompt.id!r}: duplicate id; ids must be unique")
        seen.add(prompt.id)
        prompts.append(prompt)
    return ProbeSet(name=name, path=path, prompts=tuple(prompts), sha256=sha256)


def _parse_prompt(item: Any, n: int, path: Path, default_max: int) -> Prompt:
    where = f"prompt #{n}"
    if not isinstance(item, dict):
        raise ProbeSetError(f"{path}: {where}: must be a table with id, question and any_of/regex")
    pid = item.get("id")
    if not isinstance(pid, str) or not _ID_RE.match(pid):
        raise ProbeSetError(
            f"{path}: {where}: 'id' must be a string of letters, digits, '-', '_' or '.'"
        )
    where = f"prompt {pid!r}"
    unknown = sorted(set(item) - _PROMPT_KEYS)
    if unknown:
        raise ProbeSetError(
            f"{path}: {where}: unknown key {unknown[0]!r} "
            f"(expected: {', '.join(sorted(_PROMPT_KEYS))})"
        )
    messages = _messages(item, path, where)
    has_regex, has_any = "regex" in item, "any_of" in item
    if has_regex == has_any:
        raise ProbeSetError(
            f"{path}: {where}: give exactly one expectation, 'regex' or 'any_of' (case-insensitive)"
        )
    regex: str | None = None
    any_of: tuple[str, ...] = ()
    if has_regex:
        regex = item["regex"]
        if not isinstance(regex, str) or not regex:
            raise ProbeSetError(f"{path}: {where}: 'regex' must be a non-empty string")
        try:
            re.compile(regex, re.IGNORECASE)
        except re.error as exc:
            raise ProbeSetError(f"{path}: {where}: 'regex' is not a valid pattern: {exc}") from exc
    else:
        raw_any = item["any_of"]
        if (
            not isinstance(raw_any, list)
            or not raw_any
            or not all(isinstance(s, str) and s.strip() for s in raw_any)
        ):
            raise ProbeSetError(
                f"{path}: {where}: 'any_of' must be a non-empty list of non-empty strings"
            )
        any_of = tuple(raw_any)
    max_tokens = _max_tokens(item.get("max_tokens", default_max), path, where)
    return Prompt(pid, messages, regex, any_of, max_tokens)


def _messages(item: dict[str, Any], path: Path, where: str) -> tuple[dict[str, str], ...]:
    has_q, has_m = "question" in item, "messages" in item
    if has_q == has_m:
        raise ProbeSetError(f"{path}: {where}: give exactly one of 'question' or 'messages'")
    if has_q:
        q = item["question"]
        if not isinstance(q, str) or not q.strip():
            raise ProbeSetError(f"{path}: {where}: 'question' must be a non-empty string")
        return ({"role": "user", "content": q},)
    raw = item["messages"]
    if not isinstance(raw, list) or not raw:
        raise ProbeSetError(
            f"{path}: {where}: 'messages' must be a non-empty list of {{role, content}} tables"
        )
    out: list[dict[str, str]] = []
    for i, m in enumerate(raw, start=1):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise ProbeSetError(
                f"{path}: {where}: message {i} must have exactly the keys 'role' and 'content'"
            )
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise ProbeSetError(
                f"{path}: {where}: message {i} role {role!r} must be one of {', '.join(ROLES)}"
            )
        if not isinstance(content, str) or not content.strip():
            raise ProbeSetError(f"{path}: {where}: message {i} content must be a non-empty string")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise ProbeSetError(f"{path}: {where}: the last message must have role 'user'")
    return tuple(out)


def _max_tokens(value: Any, path: Path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKENS_LIMIT:
        raise ProbeSetError(
            f"{path}: {where}: 'max_tokens' must be an integer from 1 to {MAX_TOKENS_LIMIT}, "
            f"got {value!r}"
        )
    return value
