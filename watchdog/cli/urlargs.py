"""`--url http://127.0.0.1:8000/v1` / `--prometheus http://host:9090` arguments.

Checked as the option is parsed, with the same check as `server.url` in the config: a bad
one is a usage error (exit 2) that shows what a good one looks like, not a failure deep in
the HTTP client.
"""

from __future__ import annotations

from typing import Any

import click

from llm_watchdog.urls import SERVER_URL_EXAMPLE, check_http_url


class HttpUrl(click.ParamType):
    """An http:// or https:// URL with a host (and a port in range) that the client can
    send to; `example` is what the error shows as a good one."""

    name = "URL"

    def __init__(self, example: str = SERVER_URL_EXAMPLE) -> None:
        self.example = example

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return check_http_url(str(value), self.example)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


# An engine's (or the gateway's) base URL, with or without /v1.
SERVER_URL = HttpUrl()
PROMETHEUS_URL = HttpUrl("http://HOST:9090")
# The heat lab of `llm-watchdog sim serve`.
LAB_URL = HttpUrl("http://HOST:PORT")
