"""CLI commands of the service: `run`, `check-config`, `install`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from llm_watchdog.cli.group import (
    ConfigFail,
    Fail,
    api_key_or_fail,
    cli,
    open_store,
    settings_from,
)
from llm_watchdog.config import example_config
from llm_watchdog.daemon.install import apply, plan_install
from llm_watchdog.daemon.service import Daemon, build_alerts
from llm_watchdog.durations import format_duration
from llm_watchdog.errors import EXIT_STARTUP_FAILED, ConfigError
from llm_watchdog.logs import setup_logging
from llm_watchdog.probe.sets import ProbeSetError

# ---- check-config ---------------------------------------------------------------------------


@cli.command("check-config")
@click.option("--example", is_flag=True, help="Print a documented example config and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the effective settings as JSON.")
@click.pass_context
def check_config(ctx: click.Context, example: bool, as_json: bool) -> None:
    """Validate the config file and print the effective settings (secrets masked)."""
    if example:
        click.echo(example_config(), nl=False)
        return
    settings = settings_from(ctx)
    settings.api_key()  # a named secret that cannot be read is a config error too
    data = settings.to_dict()
    if as_json:
        click.echo(json.dumps({"source": settings.source, "settings": data}, indent=2))
        return
    click.echo(f"# effective settings from {settings.source}")
    for section, values in data.items():
        click.echo(f"\n[{section}]")
        for key, value in values.items():
            click.echo(f"{key} = {_toml_value(key, value)}")


def _toml_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and key not in ("seed",):
        return json.dumps(format_duration(value))
    return json.dumps(value)



# ---- run ------------------------------------------------------------------------------------


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the watchdog daemon in the foreground (what the systemd unit starts)."""


    settings = settings_from(ctx)
    setup_logging(settings.logging.level, settings.logging.format)
    api_key_or_fail(settings)
    Path(settings.storage.path).parent.mkdir(parents=True, exist_ok=True)
    store = open_store(settings, must_exist=False)
    try:
        alert_manager = build_alerts(settings, store)
    except ConfigError as exc:
        store.close()
        raise ConfigFail(str(exc)) from None
    try:
        daemon = Daemon(settings, store, alerts=alert_manager)
    except ProbeSetError as exc:
        alert_manager.close(timeout_s=1.0)
        store.close()
        raise ConfigFail(str(exc)) from None
    daemon.install_signal_handlers()
    try:
        daemon.startup()
    except Exception as exc:
        click.echo(f"llm-watchdog: start-up failed: {exc}", err=True)
        daemon.shutdown(timeout_s=1.0)
        alert_manager.close(timeout_s=1.0)
        store.close()
        sys.exit(EXIT_STARTUP_FAILED)
    try:
        daemon.serve()
    finally:
        clean = daemon.shutdown(timeout_s=5.0)
        alert_manager.close(timeout_s=3.0)
        store.close()
        if not clean:
            click.echo(
                "llm-watchdog: a job was still running at shutdown; stopped anyway", err=True
            )
            # A probe blocked in a read would hold interpreter exit (the executor joins its
            # threads) until its own timeout; the store is closed, so nothing is lost.
            sys.stderr.flush()
            os._exit(0)



# ---- install --------------------------------------------------------------------------------


@cli.command()
@click.option("--user", "user_unit", is_flag=True, help="Install a systemd user unit instead.")
@click.option(
    "--gateway",
    "with_gateway",
    is_flag=True,
    help="Also install the gateway's unit, its settings file and a control token.",
)
@click.option("--no-start", is_flag=True, help="Write the files; do not enable or start.")
@click.option("--dry-run", is_flag=True, help="Print what would be written and run.")
@click.option(
    "--root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Install under another root (packaging, tests); implies --no-start.",
)
def install(user_unit: bool, with_gateway: bool, no_start: bool, dry_run: bool, root: str) -> None:
    """Install the systemd service (and a config to edit, if there is none) and start it."""


    rooted = Path(root).resolve() != Path("/")
    plan = plan_install(
        Path(root), user=user_unit, start=not (no_start or rooted), gateway=with_gateway
    )
    if dry_run:
        click.echo(f"# {plan.unit_path}\n{plan.unit_text}")
        for path, text in plan.units.items():
            click.echo(f"# {path}\n{text}")
        if plan.write_config:
            click.echo(
                f"# {plan.config_path}: the example config (llm-watchdog check-config --example)"
            )
        for cmd in plan.commands:
            click.echo("$ " + " ".join(cmd))
        return
    try:
        for line in apply(plan, run_systemctl=not rooted):
            click.echo(line)
    except PermissionError as exc:
        raise Fail(f"cannot write {exc.filename}: run as root (sudo), or use --user") from None
    except (RuntimeError, OSError) as exc:
        raise Fail(str(exc)) from None
    except Exception as exc:  # subprocess.CalledProcessError from systemctl
        raise Fail(f"{exc}; see `journalctl -u llm-watchdog` for why") from None
