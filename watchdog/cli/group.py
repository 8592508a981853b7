"""The `llm-watchdog` group and what its commands share: settings, the store, the server.

Exit codes: 0 ok, 1 failure, 2 usage, 78 configuration (sysexits EX_CONFIG).
Every error is one line on stderr that says what to do next.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from llm_watchdog import __version__
from llm_watchdog.cli.timeargs import parse_when
from llm_watchdog.config import Settings, load_settings
from llm_watchdog.errors import EX_CONFIG, EXIT_FAILURE, EXIT_USAGE, ConfigError, StorageError
from llm_watchdog.logs import printable
from llm_watchdog.probe.engine import detect_engine
from llm_watchdog.probe.sets import ProbeSetError, load_probe_set
from llm_watchdog.store.db import Store, StoreError


class Fail(click.ClickException):
    """A failure the user can act on: one line, exit 1."""

    exit_code = EXIT_FAILURE

    def show(self, file: Any = None) -> None:
        click.echo(f"llm-watchdog: {printable(self.message)}", err=True)


class ConfigFail(Fail):
    exit_code = EX_CONFIG


def settings_from(ctx: click.Context) -> Settings:
    obj = ctx.ensure_object(dict)
    if "settings" not in obj:
        try:
            settings = load_settings(obj.get("config_path"))
        except ConfigError as exc:
            raise ConfigFail(str(exc)) from None
        if obj.get("db"):  # --db: this database, whatever the config names
            storage = dataclasses.replace(settings.storage, path=obj["db"])
            settings = dataclasses.replace(settings, storage=storage)
        obj["settings"] = settings
    return obj["settings"]


def _take_db(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(dict)["db"] = value
        ctx.find_root().ensure_object(dict).pop("settings", None)  # read again, with it


def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--db FILE` on a command that reads the store: another database than the config's
    storage.path (a demo's, a copy from another box), as `report --db` and `bench --db`."""
    return click.option(
        "--db",
        type=click.Path(dir_okay=False),
        expose_value=False,
        callback=_take_db,
        help="Database file (default: storage.path of the config).",
    )(fn)


def when_arg(text: str | None, now: float, option: str = "--since") -> float | None:
    """Unix seconds for a time option, or a usage error that names the option."""
    if text is None:
        return None
    try:
        return parse_when(text, now)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def window_args(since: str, until: str | None, now: float) -> tuple[float, float | None]:
    """--since and --until as unix seconds; a usage error when nothing lies between them
    (a range given the wrong way round read as an empty history, "(no rows)")."""
    since_ts = when_arg(since, now, "--since")
    until_ts = when_arg(until, now, "--until")
    assert since_ts is not None  # --since has a default
    if since_ts >= (until_ts if until_ts is not None else now):
        end = f"--until {until}" if until is not None else "now"
        raise click.BadParameter(
            f"{since} is not before {end}: give the earlier time to --since "
            "(a duration counts back from now: --since 2d --until 1d)",
            param_hint="--since",
        )
    return since_ts, until_ts


def open_store(
    settings: Settings, must_exist: bool = True, *, read_only: bool = False, exclusive: bool = False
) -> Store:
    """The store, or a one-line Fail. `read_only`: the reading commands, which never change
    the file; `exclusive`: the daemon, the one writer (a second one fails naming the first)."""
    path = Path(settings.storage.path)
    # The service's database is its own (StateDirectory=, mode 0700): another user is
    # refused by the folder, and told so rather than shown a traceback.
    forbidden = Fail(
        f"cannot read {path}: permission denied; run this as a user who may read it (the "
        "service's database is root's: sudo), or point --config / storage.path elsewhere"
    )
    try:
        exists = path.exists()
    except PermissionError:
        raise forbidden from None
    if must_exist and not exists:
        raise Fail(
            f"no database at {path}: start the daemon (`llm-watchdog run`) first, "
            "or give the right file with --db (or --config / storage.path)"
        )
    try:
        return Store(path, read_only=read_only, exclusive=exclusive)
    except (StoreError, StorageError) as exc:
        raise Fail(str(exc)) from None
    except PermissionError:
        raise forbidden from None


def make_folder(settings: Settings) -> None:
    """The database's folder, made if missing; a read-only or forbidden one is one line."""
    folder = Path(settings.storage.path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Fail(
            f"cannot create the database folder {folder} ({exc.strerror or exc}): create it "
            "with write access for this user, or set storage.path to a writable place"
        ) from None


# A group given no command (click ≥ 8.2 raises it as a UsageError; 8.1 prints the help).
_NO_ARGS: tuple[type[BaseException], ...] = tuple(
    filter(None, [getattr(click.exceptions, "NoArgsIsHelpError", None)])
)


class OneLineGroup(click.Group):
    """The group that prints every usage error as one line (exit 2) and a failure no command
    caught as one line too (exit 1), instead of click's usage block or a traceback.
    LLM_WATCHDOG_DEBUG=1 lets the traceback through."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        inner = super().main
        if not standalone_mode:
            return inner(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = inner(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            if isinstance(exc, _NO_ARGS) and exc.ctx is not None:
                # `llm-watchdog` or `llm-watchdog sim` alone: the help itself, as it reads
                # with --help, not folded into one line.
                click.echo(exc.ctx.get_help())
                sys.exit(EXIT_USAGE)
            where = exc.ctx.command_path if exc.ctx is not None else "llm-watchdog"
            message = printable(exc.format_message())
            if isinstance(exc, click.NoSuchOption) and exc.option_name == "--config":
                # The README's "--config FILE" is the group's option: it goes first.
                message += "; --config goes before the command: llm-watchdog --config FILE ..."
            click.echo(f"{where}: {message} (see `{where} --help`)", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("llm-watchdog: aborted", err=True)
            sys.exit(EXIT_FAILURE)
        except (KeyboardInterrupt, EOFError):
            click.echo("llm-watchdog: interrupted", err=True)
            sys.exit(EXIT_FAILURE)
        except StorageError as exc:
            # A damaged or vanished database met while reading: one line of its own (what
            # happened to which file, what to try), not "a bug".
            click.echo(f"llm-watchdog: {printable(str(exc))}", err=True)
            sys.exit(EXIT_FAILURE)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # `llm-watchdog history | head`
                sys.exit(EXIT_FAILURE)
            self._internal(exc)
        except Exception as exc:
            self._internal(exc)
        sys.exit(rv if isinstance(rv, int) else 0)

    @staticmethod
    def _internal(exc: BaseException) -> None:
        if os.environ.get("LLM_WATCHDOG_DEBUG") == "1":
            raise exc
        detail = printable(" ".join(str(exc).split()))[:300]
        click.echo(
            f"llm-watchdog: unexpected {type(exc).__name__}: {detail} (a bug: run again with "
            "LLM_WATCHDOG_DEBUG=1 for the traceback and report it)",
            err=True,
        )
        sys.exit(EXIT_FAILURE)


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    envvar="LLM_WATCHDOG_CONFIG",
    help="Config file (default /etc/llm-watchdog/config.toml; env LLM_WATCHDOG_CONFIG).",
)
@click.version_option(__version__, prog_name="llm-watchdog")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Keep chat fast on a GPU shared with a batch job."""
    ctx.ensure_object(dict)["config_path"] = config_path


@dataclass(frozen=True)
class Target:
    """A server the CLI is about to probe: reachable, with its model and engine known."""

    probe_set: Any
    api_key: str | None
    info: Any  # llm_watchdog.probe.engine.EngineInfo
    model: str
    engine: str


def reach_server(settings: Settings) -> Target:
    """Load the probe set, reach `server.url`, pick the model and engine; one-line errors."""

    server = settings.server
    try:
        pset = load_probe_set(settings.probe.probe_set)
    except ProbeSetError as exc:
        raise Fail(str(exc)) from None
    api_key = api_key_or_fail(settings)
    info = detect_engine(server.url, api_key=api_key)
    if info.engine == "unreachable":
        raise Fail(_unreachable(server.url, info))
    model = server.model
    if model == "auto":
        if not info.models:
            raise Fail(f"{server.url} lists no models at /v1/models: pass --model NAME")
        model = info.models[0]
    engine = server.engine if server.engine != "auto" else info.engine
    return Target(pset, api_key, info, model, engine)


def api_key_or_fail(settings: Settings) -> str | None:
    try:
        return settings.api_key()
    except ConfigError as exc:
        raise ConfigFail(str(exc)) from None


def _unreachable(url: str, info: Any) -> str:
    detail = info.props.get("error") if isinstance(info.props, dict) else None
    if detail == "timed out" and info.detail:
        # It took the connection and never answered: up, but hung or still loading, not
        # "cannot reach".
        return str(info.detail)
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return (
        f"cannot reach {url}"
        + (f" ({detail})" if detail else "")
        + f": is the server running? try `curl {base}/v1/models`"
    )
