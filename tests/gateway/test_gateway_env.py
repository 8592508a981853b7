"""Under systemd the gateway's options come from gateway.env: a bad value there is a config
error (one line, exit 78, no restart loop), while a bad command-line option stays usage (2)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from llm_watchdog.gateway.cli import gateway


@pytest.mark.parametrize(
    "env, words",
    [
        ({"LLM_WATCHDOG_GATEWAY_BATCH_ALLOWANCE": "abc"}, "not a valid integer"),
        ({"LLM_WATCHDOG_GATEWAY_LISTEN": "nope:x"}, "expected HOST:PORT"),
        ({"LLM_WATCHDOG_GATEWAY_MAX_QUEUE_WAIT": "forever"}, "expected a duration"),
        (
            {
                "LLM_WATCHDOG_GATEWAY_BATCH_ALLOWANCE": "90",
                "LLM_WATCHDOG_GATEWAY_BATCH_CEILING": "9",
            },
            "LLM_WATCHDOG_GATEWAY_BATCH_ALLOWANCE must be an integer in [0, 9] "
            "(LLM_WATCHDOG_GATEWAY_BATCH_CEILING), got 90",
        ),
        ({"LLM_WATCHDOG_GATEWAY_TOKEN_CREDENTIAL": "control-token"}, "CREDENTIALS_DIRECTORY"),
    ],
)
def test_bad_values_from_the_environment_exit_78_in_one_line(env, words, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    result = CliRunner().invoke(gateway, [], env=env)
    assert result.exit_code == 78, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("llm-watchdog gateway:")


def test_a_bad_command_line_option_is_still_usage():
    result = CliRunner().invoke(gateway, ["--batch-allowance", "abc"])
    assert result.exit_code == 2


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--batch-allowance", "100", "--batch-ceiling", "10"],
            "--batch-allowance must be an integer in [0, 10] (--batch-ceiling), got 100",
        ),
        (["--upstream", "nourl"], "--upstream: expected a URL like http://127.0.0.1:8000"),
        (["--batch-allowance", "-1"], "--batch-allowance must be an integer in [0, 64]"),
        (["--batch-ramp", "-1"], "--batch-ramp must be >= 0"),
    ],
)
def test_a_value_out_of_range_names_the_option_it_came_from(args, words):
    result = CliRunner().invoke(gateway, args, env={})
    assert result.exit_code == 2 and words in result.output, result.output
    assert "batch_default_allowance" not in result.output and "upstream_url" not in result.output


def test_every_option_has_help():
    assert [p.name for p in gateway.params if isinstance(p, click.Option) and not p.help] == []
