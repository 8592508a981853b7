"""`llm-watchdog uninstall [--purge]`: the units go; config, credentials and data stay unless
purged."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.daemon.install import plan_uninstall


def _install(root: Path) -> None:
    result = CliRunner().invoke(cli, ["install", "--root", str(root), "--gateway"])
    assert result.exit_code == 0, result.output
    state = root / "var/lib/private/llm-watchdog"
    state.mkdir(parents=True)
    (state / "watchdog.db").write_text("x")


def test_uninstall_removes_the_units_and_keeps_the_rest(tmp_path):
    _install(tmp_path)
    result = CliRunner().invoke(cli, ["uninstall", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert not list((tmp_path / "etc/systemd/system").glob("llm-watchdog*"))
    assert (tmp_path / "etc/llm-watchdog/config.toml").exists()
    assert (tmp_path / "etc/llm-watchdog/credentials/control-token").exists()
    assert (tmp_path / "var/lib/private/llm-watchdog/watchdog.db").exists()
    assert "--purge removes them" in result.output
    assert "systemctl" not in result.output  # a rooted uninstall never touches the system


def test_purge_removes_config_credentials_and_data(tmp_path):
    _install(tmp_path)
    dry = CliRunner().invoke(cli, ["uninstall", "--root", str(tmp_path), "--purge", "--dry-run"])
    assert dry.exit_code == 0 and (tmp_path / "etc/llm-watchdog").exists()
    assert f"remove {tmp_path / 'etc/llm-watchdog'}" in dry.output
    result = CliRunner().invoke(cli, ["uninstall", "--root", str(tmp_path), "--purge"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "etc/llm-watchdog").exists()
    assert not (tmp_path / "var/lib/private/llm-watchdog").exists()
    again = CliRunner().invoke(cli, ["uninstall", "--root", str(tmp_path), "--purge"])
    assert again.exit_code == 0  # nothing left is not an error


def test_a_system_uninstall_stops_and_disables_both_units_first():
    plan = plan_uninstall(Path("/"))
    assert plan.commands[0] == [
        "systemctl",
        "disable",
        "--now",
        "llm-watchdog.service",
        "llm-watchdog-gateway.service",
    ]
    assert plan.commands[-1] == ["systemctl", "daemon-reload"]
    user = plan_uninstall(Path("/"), user=True, home=Path("/home/ann"), purge=True)
    assert user.commands[0][:2] == ["systemctl", "--user"]
    assert Path("/home/ann/.local/state/llm-watchdog") in user.remove
