from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llm_watchdog.cli.timeargs import parse_when
from llm_watchdog.config import (
    ConfigError,
    Settings,
    load_settings,
    settings_from_dict,
)
from llm_watchdog.errors import EX_CONFIG
from llm_watchdog.resources import package_file


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_defaults_without_a_file(tmp_path):
    s = load_settings(None, env={})
    assert isinstance(s, Settings)
    assert s.probe.interval_s == 10.0
    assert s.gpu.interval_s == 1.0
    assert s.probe.cache_mode == "bust"
    assert "absent" in s.source


def test_file_values_and_durations(tmp_path):
    p = write(
        tmp_path,
        '[server]\nurl = "http://127.0.0.1:9000/v1"\nmodel = "m"\n'
        '[probe]\ninterval = "5s"\nfirst_token_timeout = "2m"\n'
        "[gpu]\nindices = [0, 1]\n",
    )
    s = load_settings(str(p), env={})
    assert s.server.url == "http://127.0.0.1:9000/v1"
    assert s.probe.interval_s == 5.0
    assert s.probe.first_token_timeout_s == 120.0
    assert s.gpu.indices == [0, 1]
    assert s.source == str(p)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "[probe]\nintervall = '5s'\n",
            r"\[probe\] intervall: unknown key; known keys: .*interval",
        ),
        ("[prob]\ninterval = '5s'\n", r"\[prob\]: unknown section"),
        ("[probe]\ninterval = 'soon'\n", r"\[probe\] interval: expected a duration"),
        ("[probe]\ninterval = '1ms'\n", r"\[probe\] interval: must be at least 0.1s"),
        ("[probe]\ncache_mode = 'never'\n", r"cache_mode: expected one of bust, cached"),
        ("[gpu]\nenabled = 'yes'\n", r"\[gpu\] enabled: expected true or false"),
        ("[gpu]\nindices = 'first'\n", r"\[gpu\] indices: expected"),
        ("[probe]\nseed = 1.5\n", r"\[probe\] seed: expected an integer"),
        ("probe = 3\n", r"probe: expected a \[probe\] table"),
        ("[probe\n", r"not valid TOML"),
        ("[api]\nlisten = 'nope'\n", r"\[api\] listen: expected HOST:PORT"),
        ("[drift]\nshift_ratio = 0.9\n", r"\[drift\] shift_ratio must be > 1"),
        ("[alerts]\nmin_severity = 'loud'\n", r"alerts.min_severity"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path, text, message):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as err:
        load_settings(str(p), env={})
    assert str(p) in str(err.value)
    assert "\n" not in str(err.value)


def test_named_file_must_exist(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(
        ConfigError, match="no such file; write one with `llm-watchdog check-config"
    ):
        load_settings(str(missing), env={})


def test_env_var_names_the_file(tmp_path):
    p = write(tmp_path, "[probe]\ninterval = '3s'\n")
    s = load_settings(None, env={"LLM_WATCHDOG_CONFIG": str(p)})
    assert s.probe.interval_s == 3.0


def test_environment_overrides_a_key(tmp_path):
    p = write(tmp_path, "[probe]\ninterval = '3s'\n")
    env = {"LLM_WATCHDOG__PROBE__INTERVAL": "7s", "LLM_WATCHDOG__GPU__ENABLED": "false"}
    s = load_settings(str(p), env=env)
    assert s.probe.interval_s == 7.0
    assert s.gpu.enabled is False


def test_environment_override_with_a_bad_name(tmp_path):
    with pytest.raises(ConfigError, match="expected LLM_WATCHDOG__SECTION__KEY"):
        load_settings(None, env={"LLM_WATCHDOG__PROBE": "x"})


def test_secret_from_file_and_env(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-123\n")
    s = settings_from_dict({"server": {"api_key_file": str(key)}}, "t.toml")
    assert s.api_key() == "sk-123"
    s = settings_from_dict({"server": {"api_key_env": "WD_TEST_KEY_UNSET"}}, "t.toml")
    with pytest.raises(ConfigError, match="WD_TEST_KEY_UNSET is not set"):
        s.api_key()
    s = settings_from_dict({"server": {"api_key_file": str(tmp_path / "gone")}}, "t.toml")
    with pytest.raises(ConfigError, match="api_key_file: cannot read"):
        s.api_key()


def test_example_config_is_valid_and_documents_every_key():
    import tomllib

    text = package_file("example-config.toml").read_text()
    data = tomllib.loads(text)
    s = settings_from_dict(data, "example")
    defaults = Settings()
    # The example shows the defaults, so what it says is what a user gets without it.
    assert s.probe == defaults.probe
    assert s.gpu == defaults.gpu
    documented = {
        (sec, line.split("=")[0].strip(" #"))
        for sec in data
        for line in text.splitlines()
        if "=" in line
    }
    for sec, values in defaults.to_dict().items():
        for key in values:
            assert any(k == key for _, k in documented), f"[{sec}] {key} is not in the example"


def test_parse_when():
    now = 1_800_000_000.0
    assert parse_when("24h", now) == now - 86400
    assert parse_when("now", now) == now
    assert parse_when("2026-11-29T10:00:00+00:00", now) == 1795946400.0
    with pytest.raises(ValueError, match="ISO date"):
        parse_when("yesterday-ish", now)


def test_exit_code_constant():
    assert EX_CONFIG == 78 and sys.platform


def test_drift_min_rise_reaches_the_detector(tmp_path):
    s = load_settings(str(write(tmp_path, '[drift]\nmin_rise = "50ms"\n')), env={})
    assert s.drift_config().min_rise_ms == 50.0
    assert load_settings(None, env={}).drift_config().min_rise_ms == 20.0
    with pytest.raises(ConfigError, match="min_rise"):
        load_settings(str(write(tmp_path, '[drift]\nmin_rise = "-5ms"\n')), env={})
