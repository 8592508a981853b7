"""CLI commands of the service: `run`, `check-config`, `install`."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click

import llm_watchdog
from llm_watchdog.alerts import AlertConfigError, load_alerts
from llm_watchdog.cli.group import (
    ConfigFail,
    Fail,
    cli,
    open_store,
    settings_from,
)
from llm_watchdog.config import Settings, example_config, load_settings
from llm_watchdog.daemon.install import (
    VENV_HINT,
    apply,
    apply_uninstall,
    observability_files,
    plan_install,
    plan_uninstall,
    service_cannot_run,
)
from llm_watchdog.daemon.notify import Notifier
from llm_watchdog.daemon.service import Daemon, build_alerts
from llm_watchdog.errors import EXIT_STARTUP_FAILED, ConfigError
from llm_watchdog.logs import setup_logging
from llm_watchdog.probe.sets import load_probe_set

log = logging.getLogger("llm_watchdog.cli.service")

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
    try:
        # What `run` reads before it starts, read here: a config this passes, `run` takes.
        # A named secret that cannot be read is a config error too (never printed).
        validate_for_start(settings)
    except ConfigError as exc:
        raise ConfigFail(str(exc)) from None
    for warning in settings.warnings:
        click.echo(f"llm-watchdog: warning: {warning}", err=True)
    if as_json:
        data = settings.to_dict()
        click.echo(json.dumps({"source": settings.source, "settings": data}, indent=2))
        return
    # Exactly what was loaded: this text, saved as a config file, loads to equal settings.
    click.echo(f"# effective settings from {settings.source}")
    if "***" in (text := settings.to_toml()):
        click.echo("# secrets are shown as ***: put them back to load this as a config")
    click.echo(text, nl=False)


# ---- run ------------------------------------------------------------------------------------


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the watchdog daemon in the foreground (what the systemd unit starts).

    SIGHUP re-reads the config: a bad one is refused with one line in the log and the
    running one kept; a good one restarts the jobs with it.
    """
    settings = settings_from(ctx)
    setup_logging(settings.logging.level, settings.logging.format)
    for warning in settings.warnings:
        log.warning("%s", warning)
    notifier = Notifier()
    config_path = ctx.ensure_object(dict).get("config_path")
    current: Settings | None = settings
    try:
        while current is not None:
            current = _run_once(current, notifier, lambda: _reload(config_path))
    finally:
        notifier.close()


def _reload(config_path: str | None) -> Settings | None:
    """The new settings if the config loads and every secret and probe set it names reads."""
    try:
        settings = load_settings(config_path)
        validate_for_start(settings)
    except ConfigError as exc:
        log.error("config reload refused, keeping the running config: %s", exc)
        return None
    log.info("config reloaded from %s", settings.source)
    for warning in settings.warnings:
        log.warning("%s", warning)
    return settings


def validate_for_start(settings: Settings) -> None:
    """What the daemon reads at start, read now: a ConfigError here is exit 78, not later."""
    settings.api_key()
    settings.control_token()
    load_probe_set(settings.probe.probe_set)
    try:
        load_alerts(settings.alerts, env=os.environ)
    except AlertConfigError as exc:
        raise ConfigError(f"{settings.source}: {exc}") from None


def _run_once(
    settings: Settings, notifier: Notifier, reload: Callable[[], Settings | None]
) -> Settings | None:
    """One daemon from start to stop; the settings to start over with after a reload."""
    try:
        validate_for_start(settings)
    except ConfigError as exc:
        raise ConfigFail(str(exc)) from None
    try:
        Path(settings.storage.path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigFail(
            f"{settings.source}: storage.path: cannot create {Path(settings.storage.path).parent} "
            f"({exc.strerror}); point it at a writable folder"
        ) from None
    store = open_store(settings, must_exist=False, exclusive=True)
    try:
        alert_manager = build_alerts(settings, store)
    except ConfigError as exc:
        store.close()
        raise ConfigFail(str(exc)) from None
    try:
        daemon = Daemon(settings, store, alerts=alert_manager, notifier=notifier)
    except ConfigError as exc:
        alert_manager.close(timeout_s=1.0)
        store.close()
        raise ConfigFail(str(exc)) from None
    daemon.install_signal_handlers()
    try:
        daemon.startup()
        daemon.start_api()
    except ConfigError as exc:
        daemon.shutdown(timeout_s=1.0)
        alert_manager.close(timeout_s=1.0)
        store.close()
        raise ConfigFail(str(exc)) from None
    except Exception as exc:
        click.echo(f"llm-watchdog: start-up failed: {exc}", err=True)
        daemon.shutdown(timeout_s=1.0)
        alert_manager.close(timeout_s=1.0)
        store.close()
        sys.exit(EXIT_STARTUP_FAILED)
    new: Settings | None = None
    try:
        new = daemon.serve(reload=reload)
    finally:
        clean = daemon.shutdown(timeout_s=5.0, stopping=new is None)
        alert_manager.close(timeout_s=3.0)
        store.close()
        if not clean and new is None:
            click.echo(
                "llm-watchdog: a job was still running at shutdown; stopped anyway", err=True
            )
            # A probe blocked in a read would hold interpreter exit (the executor joins its
            # threads) until its own timeout; the store is closed, so nothing is lost.
            sys.stderr.flush()
            os._exit(daemon.exit_code)
    if daemon.exit_code:  # the database was deleted or replaced: systemd restarts it
        sys.exit(daemon.exit_code)
    return new


# ---- install --------------------------------------------------------------------------------


def _list_observability() -> None:
    for what, path in observability_files():
        click.echo(f"{what}: {path}")


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
    why = service_cannot_run(sys.executable, Path(llm_watchdog.__file__).parent, user_unit)
    hint = "" if user_unit else ", or use `install --user`"
    where = f"install into a folder it can read, e.g. {VENV_HINT}{hint}"
    if why and not (dry_run or rooted):
        raise Fail(f"the service could not run {sys.executable}: {why}; {where}")
    if why:  # another root, or only printing: the unit may run elsewhere
        click.echo(
            f"llm-watchdog: warning: the service could not run {sys.executable} here: {why}; "
            f"{where}",
            err=True,
        )
    plan = plan_install(
        Path(root), user=user_unit, start=not (no_start or rooted), gateway=with_gateway
    )
    if dry_run:
        click.echo(f"# {plan.unit_path}\n{plan.unit_text}")
        for path, text in plan.units.items():
            click.echo(f"# {path}\n{text}")
        for path in plan.files:
            click.echo(f"# {path}: settings to edit, if absent")
        for path in plan.secrets:
            click.echo(f"# {path}: a new random secret (mode 0600), if absent")
        if plan.write_config:
            click.echo(
                f"# {plan.config_path}: the example config (llm-watchdog check-config --example)"
            )
        for cmd in plan.commands:
            click.echo("$ " + " ".join(cmd))
        _list_observability()
        return
    try:
        for line in apply(plan, run_systemctl=not rooted):
            click.echo(line)
        _list_observability()
    except PermissionError as exc:
        raise Fail(f"cannot write {exc.filename}: run as root (sudo), or use --user") from None
    except (RuntimeError, OSError) as exc:
        raise Fail(str(exc)) from None
    except subprocess.CalledProcessError as exc:
        # The files are written by now: say which command failed and what is left to run.
        left = " && ".join(shlex.join(c) for c in plan.commands)
        why = (
            "no systemd user manager answers for this user (over ssh, run `loginctl "
            "enable-linger $USER` once and log in again)"
            if user_unit
            else "`journalctl -xe` says why"
        )
        raise Fail(
            f"the files are written, but `{shlex.join(exc.cmd)}` failed (exit "
            f"{exc.returncode}): {why}; then run: {left}"
        ) from None


# ---- uninstall ------------------------------------------------------------------------------


@cli.command()
@click.option("--user", "user_unit", is_flag=True, help="Remove the systemd user units instead.")
@click.option(
    "--purge",
    is_flag=True,
    help="Also remove the config, the credentials and the database.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be removed and run.")
@click.option(
    "--root",
    default="/",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Remove from under another root (packaging, tests); systemctl is not run.",
)
def uninstall(user_unit: bool, purge: bool, dry_run: bool, root: str) -> None:
    """Stop and disable the services and remove their units (--purge: config and data too)."""
    rooted = Path(root).resolve() != Path("/")
    plan = plan_uninstall(Path(root), user=user_unit, purge=purge, stop=not rooted)
    if dry_run:
        for cmd in plan.commands:
            click.echo("$ " + " ".join(cmd))
        for path in plan.remove:
            click.echo(f"remove {path}" + ("" if path.exists() else " (absent)"))
        return
    try:
        for line in apply_uninstall(plan, run_systemctl=not rooted):
            click.echo(line)
    except PermissionError as exc:
        raise Fail(f"cannot remove {exc.filename}: run as root (sudo), or use --user") from None
    except OSError as exc:
        raise Fail(str(exc)) from None
    if not purge:
        click.echo("kept the config, credentials and database (--purge removes them)")
