"""Config that tells the truth: check-config prints exactly what was loaded, bad numbers and
files are one-line errors (exit 78), secrets come from credentials and are never printed."""

from __future__ import annotations

import os
import sys

import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.config import (
    Settings,
    _inline_secrets,
    _secret_key,
    example_config,
    format_exact_duration,
    load_settings,
    settings_from_dict,
)
from llm_watchdog.durations import parse_duration
from llm_watchdog.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def check_config(path, *args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["--config", str(path), "check-config", *args], env=env)


def printed_settings(output: str) -> Settings:
    return settings_from_dict(tomllib.loads(output), "printed")


def test_every_key_of_the_example_prints_and_loads_back_equal(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(example_config())
    path.chmod(0o600)
    result = check_config(path)
    assert result.exit_code == 0, result.output
    loaded = load_settings(str(path), env={})
    again = printed_settings(result.output)
    assert again == loaded
    # Every key of every section is printed, not only those that differ from defaults.
    data = tomllib.loads(result.output)
    for section, values in loaded.to_dict().items():
        assert set(data[section]) == set(values), section


def test_values_are_printed_as_loaded_not_rounded(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[control]\ntarget_p95 = "1.5s"\n[drift]\nshift_ratio = 1.3\n'
        'false_alarm_probes = 500000\n[probe]\ninterval = "2.25s"\nconnect_timeout = "1h30m"\n'
    )
    out = check_config(path).output
    assert 'target_p95 = "1.5s"' in out
    assert "shift_ratio = 1.3\n" in out
    assert "false_alarm_probes = 500000.0\n" in out
    assert 'interval = "2.25s"' in out and 'connect_timeout = "1h30m"' in out
    assert printed_settings(out) == load_settings(str(path), env={})


@pytest.mark.parametrize("seconds", [1.5, 0.25, 1e-05, 90.0, 86400 * 3 + 1.001, 0.1 + 0.2])
def test_exact_durations_parse_back_to_the_same_seconds(seconds):
    assert parse_duration(format_exact_duration(seconds)) == seconds


@pytest.mark.parametrize(
    "text, message",
    [
        ("[probe]\ninterval = nan", "expected a finite duration"),
        ("[probe]\ninterval = inf", "expected a finite duration"),
        ("[probe]\ninterval = -inf", "non-negative"),
        ("[probe]\ninterval = 0", "must be at least 0.1s"),
        ('[probe]\ninterval = "-5s"', "expected a duration"),
        ("[probe]\njitter = -1", "non-negative"),
        ("[drift]\nshift_ratio = nan", "expected a finite number"),
        ("[drift]\nfalse_alarm_probes = inf", "expected a finite number"),
    ],
)
def test_nan_inf_zero_and_negative_are_one_line_and_exit_78(tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(str(path), env={})
    for command in (["check-config"], ["run"]):
        result = CliRunner().invoke(cli, ["--config", str(path), *command])
        assert result.exit_code == 78, (command, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b'[server]\n# caf\xe9 latin-1\nurl = "http://127.0.0.1:8000"\n')
    result = check_config(path)
    assert result.exit_code == 78
    assert result.output.strip().splitlines() == [
        f"llm-watchdog: {path}: line 2: not UTF-8 text (byte 0xe9); save the file as UTF-8"
    ]


SECRET_SINK = """
[[alerts.sink]]
type = "webhook"
url = "https://hooks.example/T000/B000/XXXXSECRETXXXX"
headers = { Authorization = "Bearer tok-SECRET-123" }
"""


def test_secrets_in_a_world_readable_file_are_warned_about_and_never_printed(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(SECRET_SINK)
    path.chmod(0o644)
    result = CliRunner().invoke(cli, ["--config", str(path), "check-config"])
    assert result.exit_code == 0, result.output
    assert "readable by every user (mode 0644)" in result.output
    assert "alerts.sink[1].url" in result.output and "headers" in result.output
    assert "SECRET" not in result.output
    path.chmod(0o600)
    result = CliRunner().invoke(cli, ["--config", str(path), "check-config"])
    assert "readable by every user" not in result.output and "SECRET" not in result.output
    json_out = CliRunner().invoke(cli, ["--config", str(path), "check-config", "--json"])
    assert "SECRET" not in json_out.output


def test_addresses_are_printed_but_passwords_in_them_are_not(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[server]\nurl = "http://ann:hunter2@127.0.0.1:8000"\n')
    path.chmod(0o644)
    result = check_config(path)
    assert 'url = "http://ann:***@127.0.0.1:8000"' in result.output
    assert "hunter2" not in result.output and "server.url" in result.output  # the warning
    plain = tmp_path / "plain.toml"
    plain.write_text('[control]\ngateway_url = "http://127.0.0.1:8090"\n')
    plain.chmod(0o644)
    result = check_config(plain)
    assert 'gateway_url = "http://127.0.0.1:8090"' in result.output
    assert "warning" not in result.output


def test_secrets_come_from_systemd_credentials(tmp_path, monkeypatch):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "engine-key").write_text("sk-cred\n")
    (creds / "control-token").write_text("tok-cred\n")
    (creds / "hook").write_text("https://hooks.example/x\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    s = settings_from_dict(
        {
            "server": {"api_key_credential": "engine-key"},
            "control": {"token_credential": "control-token"},
        },
        "t.toml",
    )
    assert s.api_key() == "sk-cred" and s.control_token() == "tok-cred"
    from llm_watchdog.alerts import load_alerts

    _, sinks = load_alerts(
        {"sink": [{"type": "webhook", "url_credential": "hook"}]}, env=dict(os.environ)
    )
    assert len(sinks) == 1
    missing = settings_from_dict({"server": {"api_key_credential": "nope"}}, "t.toml")
    with pytest.raises(ConfigError, match="cannot read credential .*nope"):
        missing.api_key()
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError, match=r"\$CREDENTIALS_DIRECTORY is not set"):
        s.api_key()


def test_an_unreadable_secret_stops_run_with_exit_78_and_one_line(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        f'[control]\nenabled = true\ntoken_file = "{tmp_path / "gone"}"\n'
        f'[storage]\npath = "{tmp_path / "db.sqlite"}"\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(path), "run"])
    assert result.exit_code == 78, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "control.token_file: cannot read" in lines[0]
    result = CliRunner().invoke(cli, ["--config", str(path), "check-config"])
    assert result.exit_code == 78 and "control.token_file" in result.output


def test_the_example_config_readable_by_all_is_not_said_to_hold_secrets(tmp_path):
    # `install` writes the example as root's 0644 file for a DynamicUser= service to read:
    # `probe.first_token_timeout` is a time, and the advice to chmod 600 would stop the service.
    path = tmp_path / "config.toml"
    path.write_text(example_config())
    path.chmod(0o644)
    assert load_settings(str(path), env={}).warnings == ()
    result = check_config(path)
    assert result.exit_code == 0, result.output
    assert "holds secrets" not in result.output and "chmod" not in result.output


@pytest.mark.parametrize(
    "key",
    [
        "first_token_timeout",
        "max_tokens",
        "tokens",
        "token_budget",
        "keys",
        "monkey",
        "api_key_file",
        "token_env",
        "token_credential",
        "url_file",
        "headers_env",
    ],
)
def test_keys_that_only_mention_a_secret_word_are_not_secrets(key):
    assert not _secret_key(key)
    assert _inline_secrets({"section": {key: "30s"}}) == []


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "api_key",
        "apikey",
        "password",
        "client_secret",
        "Authorization",
        "auth-token",
        "webhook_url",
        "url",
    ],
)
def test_keys_that_hold_a_secret_are_secrets(key):
    assert _secret_key(key)
    assert _inline_secrets({"alerts": {"sink": [{key: "s3cr3t"}]}}) == [f"alerts.sink[1].{key}"]


def test_addresses_hold_a_secret_only_with_a_password_or_a_token_in_them():
    plain = {
        "server": {"url": "http://127.0.0.1:8000/v1"},
        "control": {"gateway_url": "http://127.0.0.1:8090"},
        "alerts": {
            "sink": [
                {
                    "type": "alertmanager",
                    "url": "http://am:9093",
                    "generator_url": "http://grafana:3000/d/x",
                }
            ]
        },
    }
    assert _inline_secrets(plain) == []
    secret = {
        "server": {"url": "http://ann:hunter2@127.0.0.1:8000"},
        "control": {"gateway_url": "http://127.0.0.1:8090/?token=abc"},
        "alerts": {
            "sink": [
                {"type": "alertmanager", "url": "http://am:pw@am:9093"},
                {"type": "webhook", "url": "https://hooks.example/T0/B0/XXXX"},
            ]
        },
    }
    assert _inline_secrets(secret) == [
        "server.url",
        "control.gateway_url",
        "alerts.sink[1].url",
        "alerts.sink[2].url",
    ]


def test_a_secret_written_into_a_file_readable_by_all_is_still_warned_about(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[probe]\nfirst_token_timeout = "30s"\n'
        '[control]\ngateway_url = "http://ops:hunter2@127.0.0.1:8090"\n'
    )
    path.chmod(0o644)
    (warning,) = load_settings(str(path), env={}).warnings
    assert "holds secrets (control.gateway_url)" in warning
    assert "first_token_timeout" not in warning and "hunter2" not in warning


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ('type = "webhok"\nurl = "https://hooks.example/x"', "alerts.sink[2].type: 'webhok'"),
        ('type = "webhook"\nshape = "teams"\nurl = "https://h.example/x"', "alerts.sink[2].shape"),
        ('type = "webhook"\nurl = "***"', "alerts.sink[2].url"),
    ],
)
def test_check_config_refuses_an_alert_sink_that_run_refuses(tmp_path, sink, message):
    path = tmp_path / "config.toml"
    path.write_text(f'[[alerts.sink]]\ntype = "log"\n\n[[alerts.sink]]\n{sink}\n')
    path.chmod(0o600)
    for command in (["check-config"], ["run"]):
        result = CliRunner().invoke(cli, ["--config", str(path), *command], env={})
        assert result.exit_code == 78, (command, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_printed_secrets_are_said_to_be_masked(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(SECRET_SINK)
    path.chmod(0o600)
    result = check_config(path)
    assert result.exit_code == 0, result.output
    assert "# secrets are shown as ***: put them back to load this as a config" in result.output
    plain = tmp_path / "plain.toml"
    plain.write_text("")
    assert "secrets are shown" not in check_config(plain).output


@pytest.mark.parametrize(
    ("probe", "ok"),
    [
        ('jitter = "1h"', False),
        ('interval = "2s"\njitter = "3s"', False),
        ('interval = "1s"', True),  # with the default jitter of 1s
        ('total_timeout = "1s"', True),  # it bounds the others: no order asked of them
    ],
)
def test_a_jitter_longer_than_the_interval_is_refused(tmp_path, probe, ok):
    path = tmp_path / "config.toml"
    path.write_text(f"[probe]\n{probe}\n")
    result = check_config(path)
    assert result.exit_code == (0 if ok else 78), result.output
    if not ok:
        assert "[probe] jitter (" in result.output and "must be at most interval (" in result.output
