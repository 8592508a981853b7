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
            r"\[probe\] intervall: unknown key; did you mean 'interval'\? known keys: .*interval",
        ),
        ("[probe]\nzzz = 1\n", r"\[probe\] zzz: unknown key; known keys: "),
        ("[prob]\ninterval = '5s'\n", r"\[prob\]: unknown section; did you mean \[probe\]\?"),
        ("[zzz]\ninterval = '5s'\n", r"\[zzz\]: unknown section; known sections: "),
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
        # The file's names, not the detector's (baseline_n, arl0_probes).
        ("[drift]\nbaseline_probes = 5\n", r"\[drift\] baseline_probes must be >= 20$"),
        ("[drift]\nfalse_alarm_probes = 5\n", r"\[drift\] false_alarm_probes must be > 10$"),
        ("[drift]\nheat_horizon = '0s'\n", r"\[drift\] heat_horizon must be > 0$"),
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


def test_a_large_baseline_is_waited_for_not_refused(tmp_path):
    s = load_settings(str(write(tmp_path, "[drift]\nbaseline_probes = 1000\n")), env={})
    assert (s.drift_config().baseline_n, s.drift_config().baseline_max_wait) == (1000, 3000)
    assert load_settings(None, env={}).drift_config().baseline_max_wait == 900


def test_drift_min_rise_reaches_the_detector(tmp_path):
    s = load_settings(str(write(tmp_path, '[drift]\nmin_rise = "50ms"\n')), env={})
    assert s.drift_config().min_rise_ms == 50.0
    assert load_settings(None, env={}).drift_config().min_rise_ms == 20.0
    with pytest.raises(ConfigError, match="min_rise"):
        load_settings(str(write(tmp_path, '[drift]\nmin_rise = "-5ms"\n')), env={})


BAD_URLS = [
    "notaurl",
    "ftp://x",
    "http://256.1.1.1:80",
    "http://h:99999",
    "http:///v1",
    "127.0.0.1:8000",
    "http://a b:80",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_server_url_the_daemon_cannot_use_is_a_config_error(tmp_path, url):
    p = write(tmp_path, f"[server]\nurl = {url!r}\n")
    with pytest.raises(ConfigError, match=r"\[server\] url: expected a URL like http://HOST:PORT"):
        load_settings(str(p), env={})


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "https://llm.example/v1",
        "http://[::1]:8000/v1/",
        "http://gpu-box:11434",
    ],
)
def test_good_server_urls_load(tmp_path, url):
    assert settings_from_dict({"server": {"url": url}}, "t.toml").server.url == url


def test_a_bad_gateway_url_is_a_config_error_too():
    with pytest.raises(ConfigError, match=r"\[control\] gateway_url: expected a URL like"):
        settings_from_dict({"control": {"gateway_url": "localhost:8090"}}, "t.toml")


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_check_config_and_run_both_refuse_a_bad_url_with_exit_78(tmp_path, command):
    from click.testing import CliRunner

    from llm_watchdog.cli import cli

    p = write(tmp_path, f'[storage]\npath = "{tmp_path / "w.db"}"\n')
    result = CliRunner().invoke(
        cli, ["--config", str(p), command], env={"LLM_WATCHDOG__SERVER__URL": "notaurl"}, obj={}
    )
    assert result.exit_code == EX_CONFIG, result.output
    (line,) = result.output.strip().splitlines()
    assert "LLM_WATCHDOG__SERVER__URL" in line and "[server] url" in line
    assert "http://HOST:PORT" in line and "start-up failed" not in line


def test_a_bad_value_from_the_environment_names_the_variable_not_the_file(tmp_path):
    p = write(tmp_path, "[probe]\ninterval = '3s'\n")
    with pytest.raises(ConfigError) as err:
        load_settings(str(p), env={"LLM_WATCHDOG__PROBE__INTERVAL": "banana"})
    text = str(err.value)
    assert text.startswith("environment variable LLM_WATCHDOG__PROBE__INTERVAL ([probe] interval)")
    assert "expected a duration" in text and "'banana'" in text and str(p) not in text


def test_a_misspelled_variable_is_named_as_the_unknown_key(tmp_path):
    p = write(tmp_path, "[probe]\ninterval = '3s'\n")
    with pytest.raises(ConfigError) as err:
        load_settings(str(p), env={"LLM_WATCHDOG__PROBE__INTERVALL": "5s"})
    text = str(err.value)
    assert text.startswith("environment variable LLM_WATCHDOG__PROBE__INTERVALL")
    assert "unknown key; did you mean 'interval'? known keys:" in text and str(p) not in text
    with pytest.raises(ConfigError) as err:
        load_settings(str(p), env={"LLM_WATCHDOG__PROBEE__INTERVAL": "5s"})
    assert str(err.value).startswith("environment variable LLM_WATCHDOG__PROBEE__INTERVAL")
    assert "unknown section [probee]" in str(err.value)


def test_an_error_in_the_file_still_names_the_file_beside_variables(tmp_path):
    p = write(tmp_path, "[probe]\ninterval = 'soon'\n")
    with pytest.raises(ConfigError) as err:
        load_settings(str(p), env={"LLM_WATCHDOG__PROBE__JITTER": "2s"})
    assert str(err.value).startswith(f"{p}: [probe] interval: expected a duration")


def test_an_error_across_keys_says_which_variables_took_part(tmp_path):
    p = write(tmp_path, "[control]\nceiling = 8\n")
    with pytest.raises(
        ConfigError, match=r"floor.*\(with environment LLM_WATCHDOG__CONTROL__FLOOR\)"
    ):
        load_settings(str(p), env={"LLM_WATCHDOG__CONTROL__FLOOR": "9"})


def test_a_bad_alerts_value_from_the_environment_names_the_variable(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(None, env={"LLM_WATCHDOG__ALERTS__MIN_SEVERITY": "loud"})
    assert str(err.value).startswith("environment variable LLM_WATCHDOG__ALERTS__MIN_SEVERITY")


@pytest.mark.parametrize("seed", [-1, 2**32, 99999999999999999999999999])
def test_a_seed_an_engine_would_refuse_is_a_config_error(seed):
    # Sent with every probe: past 32 bits llama.cpp refuses it, and every probe would fail.
    with pytest.raises(ConfigError, match=r"\[probe\].*seed must be from 0 to 4294967295"):
        settings_from_dict({"probe": {"seed": seed}}, "t.toml")
    assert settings_from_dict({"probe": {"seed": 0}}, "t.toml").probe.seed == 0
    assert settings_from_dict({"probe": {"seed": 2**32 - 1}}, "t.toml").probe.seed == 2**32 - 1


def test_chat_per_minute_takes_auto_zero_or_a_count_and_nothing_else(tmp_path):
    from llm_watchdog.config import ConfigError, ControlSettings, load_settings

    assert ControlSettings().chat_per_minute == "auto"
    for text, want in (('"auto"', "auto"), ("0", 0), ("24", 24)):
        path = tmp_path / "c.toml"
        path.write_text(f"[control]\nchat_per_minute = {text}\n")
        assert load_settings(str(path), env={}).control.chat_per_minute == want
    for text in ('"24"', "-1", "true", "2.5", '"lots"'):
        path.write_text(f"[control]\nchat_per_minute = {text}\n")
        with pytest.raises(ConfigError, match=r"\[control\] chat_per_minute"):
            load_settings(str(path), env={})
