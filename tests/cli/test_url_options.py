"""URL options: a URL the HTTP client cannot use is a usage error (exit 2) that says what a
good one looks like, not an internal error deep in the client."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.errors import EXIT_USAGE

BAD = ["notaurl", "ftp://x", "http://256.1.1.1:80", "http://h:99999", "localhost:8000"]


@pytest.mark.parametrize("url", BAD)
@pytest.mark.parametrize(
    "args, option, example",
    [
        (["probe", "--url"], "--url", "http://HOST:PORT or http://HOST:PORT/v1"),
        (["bench", "--no-store", "--url"], "--url", "http://HOST:PORT or http://HOST:PORT/v1"),
        (["bench", "--no-store", "--sim-gpu"], "--sim-gpu", "http://HOST:PORT"),
        (["history", "--prometheus"], "--prometheus", "http://HOST:9090"),
        (["report", "--out", "r.html", "--prometheus"], "--prometheus", "http://HOST:9090"),
    ],
)
def test_a_bad_url_is_a_usage_error_that_shows_a_good_one(tmp_path, url, args, option, example):
    result = CliRunner().invoke(cli, ["--config", "/dev/null", *args, url], env={}, obj={})
    assert result.exit_code == EXIT_USAGE, result.output
    (line,) = result.output.strip().splitlines()
    assert f"Invalid value for '{option}'" in line
    assert f"expected a URL like {example}, got {url!r}" in line
    assert "unexpected" not in line and "a bug" not in line


def test_a_good_url_gets_past_parsing():
    # Nothing listens on port 9 of loopback: the command gets as far as trying to reach it.
    result = CliRunner().invoke(
        cli, ["--config", "/dev/null", "probe", "--url", "http://127.0.0.1:9/v1"], env={}, obj={}
    )
    assert result.exit_code == 1, result.output
    assert "cannot reach http://127.0.0.1:9/v1" in result.output
