"""What produced a number: assembling a Fingerprint, saying how two differ, hashing the config.

Pure: the daemon gathers the facts (engine version over HTTP, driver from NVML, the launch
command from `procinfo`) and passes them in. A baseline belongs to one fingerprint; when the
fingerprint changes, `describe_change` says why in words for the "runtime changed:
re-baselining" event.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from llm_watchdog.models import Fingerprint

UNKNOWN = "unknown"

# Key substrings that mark a secret (server.api_key_file, gateway.token, ...): never hashed,
# so the hash can be logged and stored, and rotating a key is not a new fingerprint.
SECRET_MARKERS = ("key", "token", "secret", "password")

# The sections that shape a canary and its measurement: what it asks of which server, and
# how. The rest cannot change a measured number: moving the database, raising the log level,
# a new alert sink, control on or off, a drift setting or the API's port must not throw
# away a baseline (changing control.dry_run alone relearned it, with no word said).
MEASURING_SECTIONS = ("server", "probe")
# Keys that say where the engine's identity is read from, not what it is (the launch command
# itself is a fingerprint field): adding one must not throw away a baseline either.
IGNORED_KEYS = (("server", "engine_unit"),)

_LABELS = {
    "engine": "engine",
    "engine_version": "engine version",
    "model": "model",
    "launch_command": "launch command",
    "driver_version": "driver",
    "gpu_name": "GPU",
    "gpu_uuid": "GPU UUID",
    "probe_set_hash": "probe set",
    "config_hash": "config",
}
_SHOW_MAX = 80  # characters of each side shown for a long value (a launch command)

REDACTED = "***"
# Words that mark a secret in an option or variable name, split at "-" and "_": --api-key,
# --hf-token, --ssl-keyfile-password, HF_TOKEN, OPENAI_API_KEY. Whole words only, so
# --tokenizer, --max-tokens and MAX_TOKENS (which shape the numbers) are kept.
_SECRET_WORDS = {"key", "apikey", "token", "secret", "password", "passwd", "credential"}
_OPTION = re.compile(r"^--?[A-Za-z][\w-]*$")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
# user:password@ in a URL.
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@]*):[^/\s@]+@", re.I)


def _secret_name(name: str) -> bool:
    return any(w in _SECRET_WORDS for w in re.split(r"[-_]+", name.lower().lstrip("-")))


def redact_command(argv: list[str]) -> list[str]:
    """argv with secrets replaced by "***": the values of --api-key, --hf-token and other
    secret-named options (both `--opt value` and `--opt=value`), NAME=value pairs whose name
    says key, token, secret or password, and the password of any URL."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if _OPTION.match(name) and _secret_name(name):
            out.append(f"{name}={REDACTED}" if eq else arg)
            hide_next = not eq
            continue
        m = _ASSIGN.match(arg)
        if m and _secret_name(m.group(1)):
            out.append(f"{m.group(1)}={REDACTED}")
            continue
        out.append(_URL_PASSWORD.sub(rf"\1:{REDACTED}@", arg))
    return out


def redact_command_text(command: str) -> str:
    """A command line as text, redacted as `redact_command` does (split as a shell would).

    A line a shell could not split (an open quote) is cut after its first secret-named
    option: where its value ends cannot be told.
    """
    try:
        return shlex.join(redact_command(shlex.split(command)))
    except ValueError:
        pass
    words = command.split()
    for i, word in enumerate(words):
        name = word.partition("=")[0]
        if _OPTION.match(name) and _secret_name(name):
            return " ".join([*words[:i], name, REDACTED])
    return " ".join(redact_command(words))


def build_fingerprint(
    engine: str | None,
    engine_version: str | None,
    model: str | None,
    launch_command: str | list[str] | None,
    driver_version: str | None,
    gpu_name: str | None,
    gpu_uuid: str | None,
    probe_set_hash: str | None,
    config_hash: str | None,
    extra: Mapping[str, str] | None = None,
) -> Fingerprint:
    """A Fingerprint from what is known; None or empty becomes "unknown". A command given as
    argv is joined with shlex.join, so it reads (and pastes) as a shell command. Secrets in
    the command are redacted here, before anything can store, log or serve it."""
    if isinstance(launch_command, (list, tuple)):
        argv = redact_command(list(launch_command))
        launch_command = shlex.join(argv) if argv else None
    elif launch_command:
        launch_command = redact_command_text(launch_command)
    return Fingerprint(
        engine=_known(engine),
        engine_version=_known(engine_version),
        model=_known(model),
        launch_command=_known(launch_command),
        driver_version=_known(driver_version),
        gpu_name=_known(gpu_name),
        gpu_uuid=_known(gpu_uuid),
        probe_set_hash=_known(probe_set_hash),
        config_hash=_known(config_hash),
        extra=dict(extra or {}),
    )


def describe_change(old: Mapping[str, Any] | Fingerprint, new: Fingerprint) -> list[str]:
    """One phrase per key field that differs, e.g. "model changed: qwen2.5-7b → llama3.1-8b".

    `old` may be a Fingerprint or a dict as the store returns it (extra keys are ignored).
    Hashes are shown short; long values are cut in the middle.
    """
    before = old.key_fields() if isinstance(old, Fingerprint) else old
    after = new.key_fields()
    out = []
    for field, label in _LABELS.items():
        a, b = str(before.get(field, UNKNOWN)), after[field]
        if a != b:
            if field.endswith("_hash"):
                a, b = a[:12], b[:12]
            out.append(f"{label} changed: {_short(a)} → {_short(b)}")
    return out


def config_hash(settings: Any, sections: Iterable[str] = MEASURING_SECTIONS) -> str:
    """A stable 16-hex-digit hash of the effective settings (a mapping of sections, or a
    settings dataclass) that shape a measurement.

    Only the top-level `sections` count; keys containing "key", "token", "secret" or
    "password" (any case, any depth) are left out. Key order does not matter; values that
    JSON cannot carry (paths, durations objects) are hashed by their str().
    """
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        settings = dataclasses.asdict(settings)
    items: Mapping[str, Any] = settings
    keep = set(sections)
    cleaned = {k: _scrub(v) for k, v in items.items() if k in keep and not _secret(k)}
    for section, key in IGNORED_KEYS:
        if isinstance(cleaned.get(section), dict):
            cleaned[section] = {k: v for k, v in cleaned[section].items() if k != key}
    blob = json.dumps(cleaned, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _scrub(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _scrub(v) for k, v in value.items() if not _secret(str(k))}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    return value


def _secret(key: str) -> bool:
    k = key.lower()
    return any(marker in k for marker in SECRET_MARKERS)


def _known(value: str | None) -> str:
    if value is None:
        return UNKNOWN
    value = str(value).strip()
    return value or UNKNOWN


def _short(text: str) -> str:
    if len(text) <= _SHOW_MAX:
        return text
    half = (_SHOW_MAX - 1) // 2
    return f"{text[:half]}…{text[-half:]}"


def flags(command: str) -> dict[str, str]:
    """A launch command as {flag: value}: `--parallel 4` and `--parallel=4` are
    {"--parallel": "4"}; a flag without a value is "" ; other words are keyed by position
    ("arg0" the program, then "arg1", ...)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out: dict[str, str] = {}
    i, pos = 0, 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and len(w) > 1 and not _number(w):
            if "=" in w and w.startswith("--"):
                key, value = w.split("=", 1)
                out[key] = value
            elif i + 1 < len(words) and not (
                words[i + 1].startswith("-") and not _number(words[i + 1])
            ):
                out[w] = words[i + 1]
                i += 1
            else:
                out[w] = ""
        else:
            out[f"arg{pos}"] = w
            pos += 1
        i += 1
    return out


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
