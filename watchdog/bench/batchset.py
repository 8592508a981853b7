"""Batch sets: the documents the bench's batch job sends, fixed so two runs load alike.

Without a file, the batch job sends the synthetic extraction documents of
`llm_watchdog.bench.loadgen.document` (seeded, so every run sends the same ones); its hash
names the generator and the document size. A batch set file is TOML:

    name = "invoices"                    # optional, defaults to the file name
    max_tokens = 64                      # optional, the answer's length
    instruction = "Extract every date…"  # optional, put before each document

    [[documents]]
    id = "inv-001"
    text = "…"

Unknown keys are errors, so a typo never silently changes the load.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_watchdog.bench.loadgen import extraction_messages
from llm_watchdog.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_INSTRUCTION = (
    "Extract every date, amount and party from this document as JSON "
    '{"dates": [], "amounts": [], "parties": []}.'
)
_KEYS = {"name", "max_tokens", "instruction", "documents"}
_DOC_KEYS = {"id", "text"}


class BatchSetError(ConfigError, ValueError):
    """A batch set that cannot be used; one line naming the file and what to fix."""


@dataclass(frozen=True)
class BatchSet:
    name: str
    sha256: str
    max_tokens: int
    messages: Callable[[int], list[dict[str, str]]]  # request number -> chat messages
    documents: int | None  # None: generated, one new document per request


def synthetic_batch_set(words: int = 700, max_tokens: int = 64) -> BatchSet:
    tag = f"synthetic-extraction words={words} max_tokens={max_tokens}"
    return BatchSet(
        name=f"synthetic-{words}w",
        sha256=hashlib.sha256(tag.encode()).hexdigest(),
        max_tokens=max_tokens,
        messages=lambda n: extraction_messages(n, words),
        documents=None,
    )


def load_batch_set(path_text: str) -> BatchSet:
    path = Path(path_text).expanduser()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BatchSetError(
            f"{path}: cannot read batch set ({exc.strerror or exc}); give a .toml file"
        ) from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BatchSetError(f"{path}: not a valid TOML batch set: {exc}") from None
    return _parse(doc, path, hashlib.sha256(raw).hexdigest())


def _parse(doc: dict[str, Any], path: Path, sha256: str) -> BatchSet:
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise BatchSetError(
            f"{path}: unknown key {unknown[0]!r} (expected: {', '.join(sorted(_KEYS))})"
        )
    name = doc.get("name", path.stem)
    max_tokens = doc.get("max_tokens", 64)
    instruction = doc.get("instruction", DEFAULT_INSTRUCTION)
    if not isinstance(name, str) or not name.strip():
        raise BatchSetError(f"{path}: 'name' must be a non-empty string")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens:
        raise BatchSetError(f"{path}: 'max_tokens' must be a positive integer")
    if not isinstance(instruction, str):
        raise BatchSetError(f"{path}: 'instruction' must be a string")
    items = doc.get("documents")
    if not isinstance(items, list) or not items:
        raise BatchSetError(f"{path}: no documents; add at least one [[documents]] table")
    texts: list[str] = []
    for n, item in enumerate(items, start=1):
        if not isinstance(item, dict) or set(item) - _DOC_KEYS or "text" not in item:
            raise BatchSetError(
                f"{path}: document #{n} must be a table with 'text' (and optionally 'id')"
            )
        text = item["text"]
        if not isinstance(text, str) or not text.strip():
            raise BatchSetError(f"{path}: document #{n}: 'text' must be a non-empty string")
        texts.append(text)
    frozen = tuple(texts)

    def messages(n: int) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "You extract data. Answer with JSON only."},
            {"role": "user", "content": f"{instruction}\n\n{frozen[n % len(frozen)]}"},
        ]

    return BatchSet(
        name=name, sha256=sha256, max_tokens=max_tokens, messages=messages, documents=len(frozen)
    )
