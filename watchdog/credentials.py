"""systemd credentials (LoadCredential=NAME:FILE), read from $CREDENTIALS_DIRECTORY/NAME.

One reader for the daemon's config and the gateway's command line. It imports nothing of the
project, so the gateway's start-up does not load the daemon's config to read its token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


def read_credential(
    name: str, key: str, instead: str, environ: Mapping[str, str] | None = None
) -> str:
    """The credential's text, stripped; ValueError with one line that starts with `key` (how
    the caller named the setting) and says what to do, `instead` naming the file option."""
    env = os.environ if environ is None else environ
    if "/" in name or name in (".", ".."):
        raise ValueError(f"{key}: {name!r} is a credential name, not a path")
    directory = env.get(CREDENTIALS_ENV)
    if not directory:
        raise ValueError(
            f"{key} = {name!r} but ${CREDENTIALS_ENV} is not set: run under systemd with "
            f"LoadCredential={name}:/etc/llm-watchdog/credentials/{name}, or use {instead}"
        )
    path = Path(directory) / name
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(
            f"{key}: cannot read credential {path} ({exc.strerror}); add "
            f"LoadCredential={name}:FILE to the unit"
        ) from exc
    except UnicodeDecodeError:
        raise ValueError(f"{key}: credential {path} is not UTF-8 text") from None
    if not value:
        raise ValueError(f"{key}: credential {path} is empty; write the secret")
    return value
