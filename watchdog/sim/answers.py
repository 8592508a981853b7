"""Deterministic answers for the lab's engine, so the quality gate has something to check.

The shipped probe sets (`probes/*.toml`) are read once: a chat whose last user message
contains one of their questions gets a short answer that meets that prompt's expectation
("The answer is paris." for the capital of France). Anything else gets a fixed filler text
whose length is drawn from the traffic class's output range with a seed taken from the
prompt, so the same request always gets the same answer.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from llm_watchdog.probe.sets import ProbeSetError, Prompt, available_probe_sets, load_probe_set

FILLER = (
    "The heat lab is answering with a fixed text so that every run is repeatable and every "
    "token costs the same, whatever the question was."
).split(" ")


def _candidates(prompt: Prompt) -> Iterable[str]:
    if prompt.expect_any_of:
        yield from prompt.expect_any_of
        return
    pattern = prompt.expect_regex or ""
    for group in re.findall(r"\(([^()]*)\)", pattern):
        yield from group.split("|")
    yield re.sub(r"\\[bBdDsSwW]|[\\^$.*+?()\[\]{}|]", "", pattern)


def answer_for(prompt: Prompt) -> str | None:
    """A short answer meeting `prompt`'s expectation, or None when none is found."""
    for cand in _candidates(prompt):
        cand = cand.strip()
        if not cand:
            continue
        for text in (f"The answer is {cand}.", cand[:1].upper() + cand[1:] + "."):
            if prompt.check(text):
                return text
    return None


class Answers:
    def __init__(self, probe_sets: Sequence[str] | None = None) -> None:
        self._by_question: dict[str, str] = {}
        names = available_probe_sets() if probe_sets is None else list(probe_sets)
        for name in names:
            try:
                ps = load_probe_set(name)
            except ProbeSetError:
                continue  # a broken user file must not stop the lab; the probe reports it
            for prompt in ps.prompts:
                text = answer_for(prompt)
                if text is not None:
                    self._by_question[_norm(prompt.messages[-1]["content"])] = text

    def __len__(self) -> int:
        return len(self._by_question)

    def tokens(
        self, messages: list[Any], out_min: int, out_max: int, max_tokens: int | None
    ) -> tuple[list[str], bool]:
        """The answer as token strings, and whether max_tokens cut it short."""
        last = _last_user(messages)
        folded = _norm(last)
        known = self._by_question.get(folded)
        if known is None:
            for question, text in self._by_question.items():
                if question in folded:  # a nonce prefixed to the question
                    known = text
                    break
        if known is not None:
            words = known.split(" ")
        else:
            seed = int.from_bytes(hashlib.sha256(repr(messages).encode()).digest()[:8], "big")
            n = random.Random(seed).randint(out_min, out_max)
            words = [FILLER[i % len(FILLER)] for i in range(n)]
        toks = [w if i == 0 else " " + w for i, w in enumerate(words)]
        if max_tokens is not None and 0 < max_tokens < len(toks):
            return toks[:max_tokens], True
        return toks, False


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _last_user(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # [{type: text, text: ...}]
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
