from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.daemon.install import (
    plan_install,
    service_cannot_run,
    unreadable_by_others,
)


def test_install_under_a_root_writes_unit_and_config(tmp_path):
    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    unit = (tmp_path / "etc/systemd/system/llm-watchdog.service").read_text()
    assert (
        f"ExecStart={sys.executable} -m llm_watchdog --config /etc/llm-watchdog/config.toml run"
        in unit
    )
    assert "RestartPreventExitStatus=78" in unit
    assert "StateDirectory=llm-watchdog" in unit
    config = tmp_path / "etc/llm-watchdog/config.toml"
    assert "server" in tomllib.loads(config.read_text())
    assert "systemctl" not in result.output  # a rooted install never touches the running system


def test_install_keeps_an_existing_config(tmp_path):
    config = tmp_path / "etc/llm-watchdog/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[server]\nurl = "http://127.0.0.1:9999"\n')
    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "kept existing" in result.output
    assert "9999" in config.read_text()


def test_user_unit_drops_system_only_settings(tmp_path):
    plan = plan_install(tmp_path, user=True, home=Path("/home/ann"), start=True)
    assert plan.unit_path == tmp_path / "home/ann/.config/systemd/user/llm-watchdog.service"
    assert "DynamicUser" not in plan.unit_text
    assert "WantedBy=default.target" in plan.unit_text
    assert ["systemctl", "--user", "enable", "--now", "llm-watchdog.service"] in plan.commands


def test_dry_run_writes_nothing(tmp_path):
    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path), "--dry-run"])
    assert result.exit_code == 0
    assert "ExecStart=" in result.output
    assert not any(tmp_path.iterdir())


def test_install_with_the_gateway(tmp_path):
    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path), "--gateway"])
    assert result.exit_code == 0, result.output
    unit = (tmp_path / "etc/systemd/system/llm-watchdog-gateway.service").read_text()
    assert f"ExecStart={sys.executable} -m llm_watchdog gateway" in unit
    assert "EnvironmentFile=-/etc/llm-watchdog/gateway.env" in unit
    env = (tmp_path / "etc/llm-watchdog/gateway.env").read_text()
    # The token is a credential now: a root-only file under DynamicUser= could not be read.
    assert "LLM_WATCHDOG_GATEWAY_TOKEN_CREDENTIAL=control-token" in env
    assert "LoadCredential=control-token:/etc/llm-watchdog/credentials/control-token" in unit
    token = tmp_path / "etc/llm-watchdog/credentials/control-token"
    first = token.read_text()
    assert len(first.strip()) == 32 and token.stat().st_mode & 0o777 == 0o600
    again = CliRunner().invoke(cli, ["install", "--root", str(tmp_path), "--gateway"])
    assert "kept existing" in again.output and token.read_text() == first


def test_an_older_installs_token_moves_into_the_credential(tmp_path):
    old = tmp_path / "etc/llm-watchdog/control-token"
    old.parent.mkdir(parents=True)
    old.write_text("old-token-kept\n")
    env = old.parent / "gateway.env"
    env.write_text("LLM_WATCHDOG_GATEWAY_TOKEN_FILE=/etc/llm-watchdog/control-token\n")
    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path), "--gateway"])
    assert result.exit_code == 0, result.output
    cred = tmp_path / "etc/llm-watchdog/credentials/control-token"
    assert cred.read_text() == "old-token-kept\n" and cred.stat().st_mode & 0o777 == 0o600
    unit = (tmp_path / "etc/systemd/system/llm-watchdog-gateway.service").read_text()
    # The kept gateway.env names the old file; the unit's credential comes first.
    assert "Environment=LLM_WATCHDOG_GATEWAY_TOKEN_CREDENTIAL=control-token" in unit


def test_a_system_install_names_the_services_database_in_its_config(tmp_path):
    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    config = tomllib.loads((tmp_path / "etc/llm-watchdog/config.toml").read_text())
    # The CLI has no $STATE_DIRECTORY: without this it looked in root's home.
    assert config["storage"]["path"] == "/var/lib/llm-watchdog/watchdog.db"
    user = plan_install(tmp_path, user=True, home=Path("/home/ann"), start=False)
    assert "path" not in tomllib.loads(user.config_text)["storage"]  # the XDG default


def test_the_service_cannot_run_an_interpreter_it_does_not_see():
    why = service_cannot_run("/home/ann/.local/pipx/venvs/x/bin/python", Path("/usr/lib"))
    assert why is not None and "/home" in why and "ProtectHome=" in why
    why = service_cannot_run("/tmp/ci/.venv/bin/python", Path("/usr/lib"))
    assert why is not None and "PrivateTmp=" in why
    assert service_cannot_run("/usr/bin/python3", Path("/tmp/x/site-packages/llm_watchdog"))
    # A user unit sees its owner's home; /tmp is still its own.
    assert service_cannot_run("/home/ann/.venv/bin/python", Path("/usr/lib"), user=True) is None
    assert service_cannot_run("/tmp/x/bin/python", Path("/usr/lib"), user=True) is not None


def test_a_package_other_users_cannot_read_is_named(tmp_path):
    package = tmp_path / "venv/lib/llm_watchdog"
    package.mkdir(parents=True)
    for folder in (tmp_path, tmp_path / "venv", tmp_path / "venv/lib", package):
        folder.chmod(0o755)
    above = unreadable_by_others(tmp_path)  # pytest's own folder may be 0700: not ours
    assert unreadable_by_others(package) == above
    (tmp_path / "venv").chmod(0o700)  # a root umask of 077
    why = unreadable_by_others(package)
    assert why is not None and f"{tmp_path / 'venv'} is not readable" in why and "0700" in why


def test_install_refuses_an_interpreter_the_service_cannot_run(monkeypatch):
    def no_writes(*args, **kwargs):
        raise AssertionError("nothing may be written")

    monkeypatch.setattr("llm_watchdog.cli.service.apply", no_writes)
    monkeypatch.setattr(sys, "executable", "/home/ann/.local/pipx/venvs/llm-watchdog/bin/python")
    result = CliRunner().invoke(cli, ["install", "--gateway"])
    assert result.exit_code == 1, result.output
    assert "ProtectHome=" in result.output and "/opt/llm-watchdog" in result.output
    assert len(result.output.strip().splitlines()) == 1
    dry = CliRunner().invoke(cli, ["install", "--gateway", "--dry-run"])
    assert dry.exit_code == 0 and "warning: the service could not run" in dry.output
    (warning,) = [line for line in dry.output.splitlines() if "warning:" in line]
    assert "install into a folder it can read, e.g. sudo python3 -m venv /opt/" in warning
    assert "gateway.env: settings to edit" in dry.output


def test_a_failing_systemctl_says_the_files_are_written_and_what_is_left(tmp_path, monkeypatch):
    import subprocess

    def no_user_manager(cmd, check):
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("llm_watchdog.cli.service.service_cannot_run", lambda *a: None)
    monkeypatch.setattr("llm_watchdog.daemon.install.shutil.which", lambda name: "/bin/" + name)
    monkeypatch.setattr("llm_watchdog.daemon.install.subprocess.run", no_user_manager)
    result = CliRunner().invoke(cli, ["install", "--user"])
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert len(line.splitlines()) == 1 and "journalctl -u" not in line
    assert "the files are written, but `systemctl --user daemon-reload` failed (exit 1)" in line
    assert "loginctl enable-linger" in line
    assert "systemctl --user enable --now llm-watchdog.service" in line
    assert (tmp_path / ".config/systemd/user/llm-watchdog.service").is_file()


def test_a_gateway_install_keeps_the_slot_line_and_sends_canaries_through_the_gateway(tmp_path):
    from llm_watchdog.config import settings_from_dict
    from llm_watchdog.gateway.cli import gateway
    from llm_watchdog.gateway.config import ENGINE_SLOTS_AUTO

    result = CliRunner().invoke(cli, ["install", "--root", str(tmp_path), "--gateway"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "etc/llm-watchdog/gateway.env").read_text()
    env = dict(line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    params = {p.name: p for p in gateway.params}
    for name in env:  # every line is an option of the gateway
        assert name.removeprefix("LLM_WATCHDOG_GATEWAY_").lower() in params, name
    slots = params["engine_slots"]
    # The gateway's own default, the line the README's figures are measured behind.
    assert slots.type.convert(env["LLM_WATCHDOG_GATEWAY_ENGINE_SLOTS"], slots, None) == (
        ENGINE_SLOTS_AUTO
    )
    config = tomllib.loads((tmp_path / "etc/llm-watchdog/config.toml").read_text())
    settings = settings_from_dict(config, "installed")
    listen = "http://" + env["LLM_WATCHDOG_GATEWAY_LISTEN"]
    assert settings.server.url == listen == settings.control.gateway_url
    assert settings.control.enabled and settings.control.token_credential == "control-token"
    plain = tomllib.loads((plan_install(tmp_path / "x", start=False)).config_text)
    assert plain["server"]["url"] == "http://127.0.0.1:8000" and not plain["control"]["enabled"]
