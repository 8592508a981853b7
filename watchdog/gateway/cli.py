"""`llm-watchdog gateway`: run the gateway in the foreground until SIGTERM or SIGINT.

Every option can also come from the environment (LLM_WATCHDOG_GATEWAY_<OPTION>). Secrets
never come from the command line: the control token from --token-credential (a systemd
credential in $CREDENTIALS_DIRECTORY), --token-file or LLM_WATCHDOG_GATEWAY_TOKEN, API keys
for the class map from --key-classes-file. SIGHUP re-reads the token and the key classes.
Exit codes: 0 stopped by a signal, 1 cannot listen, 2 bad option, 78 unreadable secret file.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from llm_watchdog.credentials import read_credential
from llm_watchdog.daemon.notify import Notifier
from llm_watchdog.durations import parse_duration
from llm_watchdog.errors import EX_CONFIG, EXIT_FAILURE
from llm_watchdog.gateway.config import (
    CLASSES,
    DEFAULT_BATCH_RAMP_IDLE_S,
    DEFAULT_BATCH_RAMP_PER_S,
    ENGINE_SLOTS_AUTO,
    TOKEN_ENV,
    GatewayConfig,
    read_token,
)
from llm_watchdog.gateway.server import ListenError, serve
from llm_watchdog.logs import setup_logging
from llm_watchdog.urls import is_loopback_host

log = logging.getLogger("llm_watchdog.gateway")


class _ConfigFail(click.ClickException):
    exit_code = EX_CONFIG

    def show(self, file: Any = None) -> None:
        click.echo(f"llm-watchdog gateway: {self.message}", err=True)


class _Fail(_ConfigFail):
    exit_code = EXIT_FAILURE


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:PORT); a bare PORT listens on 127.0.0.1."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT like 127.0.0.1:8090, got {text!r}")
    return host, int(port)


def read_key_classes(path: str) -> dict[str, str]:
    """Lines `KEY = CLASS` (# starts a comment): which API key belongs to which class."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(
            f"cannot read key-classes file {path} ({exc.strerror}): create it (mode 0600) "
            "with lines like `sk-batch-job = batch`"
        ) from exc
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, cls = (part.strip() for part in line.partition("="))
        if not sep or not key or cls not in CLASSES:
            raise ValueError(
                f"{path}:{number}: expected `KEY = CLASS` with CLASS one of {', '.join(CLASSES)}"
            )
        out[key] = cls
    return out


def read_secrets(
    token_credential: str | None, token_file: str | None, key_classes_file: str | None
) -> tuple[str | None, dict[str, str]]:
    """The control token and the key-class map; ValueError with one line if unreadable."""
    token = (
        read_credential(token_credential, "--token-credential", "--token-file")
        if token_credential
        else read_token(token_file)
    )
    key_classes = read_key_classes(key_classes_file) if key_classes_file else {}
    return token, key_classes


class EngineSlots(click.ParamType):
    """`auto` or a count of slots >= 0."""

    name = "auto|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return ENGINE_SLOTS_AUTO
        if text.isdigit():
            return int(text)
        self.fail(
            f"{value!r} is neither auto nor a count of slots >= 0 (the engine's "
            "--max-num-seqs or --parallel; 0: no slot line)",
            param,
            ctx,
        )


def _slot_text(config: GatewayConfig) -> str:
    if config.engine_slots == ENGINE_SLOTS_AUTO:
        return ", a slot line where the engine says its slots"
    return "" if config.slot_line is None else f", held under {config.slot_line} engine slots"


def _priorities(values: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in values:
        cls, sep, num = item.partition("=")
        try:
            out[cls.strip()] = int(num)
        except ValueError:
            raise click.BadParameter(
                f"expected CLASS=INTEGER like batch=10, got {item!r}", param_hint="--priority"
            ) from None
        if not sep or cls.strip() not in CLASSES:
            raise click.BadParameter(
                f"expected CLASS=INTEGER with CLASS one of {', '.join(CLASSES)}, got {item!r}",
                param_hint="--priority",
            )
    return out


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class _GatewayCommand(click.Command):
    """A bad value from the environment is a config error (exit 78, one line), not usage.

    Under systemd the options come from gateway.env: exit 2 with a usage text would make
    Restart=on-failure loop on a file that restarting cannot fix.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as exc:
            param = exc.param
            if (
                param is not None
                and param.name is not None
                and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
            ):
                name = getattr(param, "envvar", None) or _env_name(param.name)
                raise _ConfigFail(f"{name}: {exc.format_message()}") from None
            raise


def _env_name(param_name: str) -> str:
    return f"LLM_WATCHDOG_GATEWAY_{param_name.upper()}"


# GatewayConfig's fields as its errors name them, and the option that sets each.
_FIELD_OPTIONS = {
    "upstream_url": "upstream",
    "secondary_upstream_url": "secondary_upstream",
    "listen_port": "listen",
    "default_class": "default_class",
    "key_classes": "key_classes_file",
    "batch_default_allowance": "batch_allowance",
    "batch_ceiling": "batch_ceiling",
    "max_queue_wait_s": "max_queue_wait",
    "max_queued": "max_queued",
    "batch_ramp_per_s": "batch_ramp",
    "batch_ramp_idle_s": "batch_ramp_idle",
    "preempt_batch": "preempt_batch",
    "engine_slots": "engine_slots",
    "priorities": "priorities",
    "upstream_first_byte_timeout_s": "upstream_first_byte_timeout",
    "upstream_read_timeout_s": "upstream_read_timeout",
    "upstream_pool_size": "upstream_pool",
    "header_timeout_s": "header_timeout",
    "body_timeout_s": "body_timeout",
    "client_stall_timeout_s": "client_stall_timeout",
    "max_connections": "max_connections",
    "max_body_bytes": "max_body",
    "max_body_total_bytes": "max_body_total",
}
_FIELD = re.compile(r"\b(" + "|".join(sorted(_FIELD_OPTIONS, key=len, reverse=True)) + r")\b")


def _name_options(message: str, ctx: click.Context) -> str:
    """A GatewayConfig error in the user's words: each field as the option the user gave
    it by, `--batch-ceiling` on a command line or LLM_WATCHDOG_GATEWAY_BATCH_CEILING from
    gateway.env, not `batch_ceiling`."""

    def option(m: re.Match[str]) -> str:
        name = _FIELD_OPTIONS[m.group(1)]
        if ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT:
            return _env_name(name)
        param = next((p for p in ctx.command.params if p.name == name), None)
        return param.opts[0] if param is not None and param.opts else m.group(1)

    return _FIELD.sub(option, message)


@click.command(
    "gateway",
    cls=_GatewayCommand,
    context_settings={"auto_envvar_prefix": "LLM_WATCHDOG_GATEWAY"},
)
@click.option("--listen", default="127.0.0.1:8090", show_default=True, help="HOST:PORT to bind.")
@click.option(
    "--upstream", default="http://127.0.0.1:8000", show_default=True, help="Engine root URL."
)
@click.option("--secondary-upstream", default=None, help="Where batch goes instead of a 429.")
@click.option(
    "--default-class",
    type=click.Choice(CLASSES),
    default="chat",
    show_default=True,
    help="The class of a request with neither an X-Traffic-Class header nor a known key.",
)
@click.option(
    "--batch-allowance",
    type=int,
    default=8,
    show_default=True,
    help="Batch requests let run at once until the watchdog sets it, and again once its "
    "lease runs out.",
)
@click.option(
    "--batch-ceiling",
    type=int,
    default=64,
    show_default=True,
    help="The most batch requests a control write may allow.",
)
@click.option(
    "--max-queue-wait",
    default="30s",
    show_default=True,
    callback=_duration,
    help="How long a batch request waits for room before a 429 (the ramp's pacing does "
    "not count), e.g. 30s, 2m.",
)
@click.option(
    "--max-queued",
    type=int,
    default=1024,
    show_default=True,
    help="Batch requests waiting for room at most; one more gets 429 at once.",
)
@click.option(
    "--batch-ramp",
    type=float,
    default=DEFAULT_BATCH_RAMP_PER_S,
    show_default=True,
    help="Batch requests let in per second after a raise (0: all at once).",
)
@click.option(
    "--batch-ramp-idle",
    default=f"{DEFAULT_BATCH_RAMP_IDLE_S:g}s",
    show_default=True,
    callback=_duration,
    help="A batch allowance left unused this long (counted from the gateway's start too) "
    "ramps again when the job comes back (0: never).",
)
@click.option(
    "--preempt-batch",
    is_flag=True,
    help="A cut of the batch allowance ends the newest batch requests in flight over it "
    "(their clients get 503 or an error event, and retry).",
)
@click.option(
    "--engine-slots",
    type=EngineSlots(),
    default="auto",
    show_default=True,
    help="Sequences the engine runs at once (max_num_seqs, --parallel): batch is let in "
    "only while batch + chat in flight stay under them less an eighth (1 to 4). auto: as "
    "llama.cpp's /props or SGLang's /get_server_info say, else the engine's command line "
    "(vLLM's --max-num-seqs; see --engine-unit); no line where neither says. 0: off.",
)
@click.option("--priority", "priorities", multiple=True, metavar="CLASS=N", help="Inject priority.")
@click.option("--priority-higher-first", is_flag=True, help="Engine runs higher values first.")
@click.option(
    "--upstream-first-byte-timeout",
    default="300s",
    show_default=True,
    callback=_duration,
    help="Wait this long for the engine's answer to start (raise it for long non-streamed "
    "answers).",
)
@click.option(
    "--upstream-read-timeout",
    default="600s",
    show_default=True,
    callback=_duration,
    help="Silence allowed between two chunks of an answer.",
)
@click.option(
    "--upstream-pool",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Idle kept-alive connections per engine: its slots (max_num_seqs, --parallel).",
)
@click.option(
    "--header-timeout",
    default="10s",
    show_default=True,
    callback=_duration,
    help="A client's time to send its request headers (then 408).",
)
@click.option(
    "--body-timeout",
    default="60s",
    show_default=True,
    callback=_duration,
    help="A client's time to send its request body after the headers (then 408).",
)
@click.option(
    "--client-stall-timeout",
    default="60s",
    show_default=True,
    callback=_duration,
    help="An answer whose client takes none of its bytes for this long is ended, and its "
    "place freed (0: never).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Open client connections; past it, 503 (keep LimitNOFILE above it).",
)
@click.option(
    "--max-body",
    type=click.IntRange(min=1),
    default=32 * 1024 * 1024,
    show_default=True,
    help="Largest request body in bytes (then 413).",
)
@click.option(
    "--max-body-total",
    type=click.IntRange(min=1),
    default=256 * 1024 * 1024,
    show_default=True,
    help="Request-body bytes held at once across all connections, at least --max-body (then 503).",
)
@click.option("--token-file", default=None, help=f"Control token file (else ${TOKEN_ENV}).")
@click.option(
    "--token-credential",
    default=None,
    metavar="NAME",
    help="Control token from the systemd credential NAME (LoadCredential=NAME:FILE).",
)
@click.option("--key-classes-file", default=None, help="Lines `API_KEY = CLASS`.")
@click.option(
    "--engine-unit",
    default="",
    metavar="UNIT",
    help="The engine's systemd unit: its ExecStart is the launch command /control/identity "
    "reports, and --engine-slots auto reads, where the engine's process cannot be read.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="What the gateway logs (to stderr: the journal under systemd).",
)
def gateway(
    listen: str,
    upstream: str,
    secondary_upstream: str | None,
    default_class: str,
    batch_allowance: int,
    batch_ceiling: int,
    max_queue_wait: float,
    max_queued: int,
    batch_ramp: float,
    batch_ramp_idle: float,
    preempt_batch: bool,
    engine_slots: int,
    priorities: tuple[str, ...],
    priority_higher_first: bool,
    upstream_first_byte_timeout: float,
    upstream_read_timeout: float,
    upstream_pool: int,
    header_timeout: float,
    body_timeout: float,
    client_stall_timeout: float,
    max_connections: int,
    max_body: int,
    max_body_total: int,
    token_file: str | None,
    token_credential: str | None,
    key_classes_file: str | None,
    engine_unit: str,
    log_level: str,
) -> None:
    """Class-aware OpenAI-compatible proxy in front of the engine, with a control API."""
    ctx = click.get_current_context()
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        if ctx.get_parameter_source("listen") is ParameterSource.ENVIRONMENT:
            raise _ConfigFail(f"{_env_name('listen')}: {exc}") from None
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    try:
        token, key_classes = read_secrets(token_credential, token_file, key_classes_file)
    except ValueError as exc:
        raise _ConfigFail(str(exc)) from None
    try:
        config = GatewayConfig(
            upstream_url=upstream,
            listen_host=host,
            listen_port=port,
            secondary_upstream_url=secondary_upstream,
            default_class=default_class,
            key_classes=key_classes,
            batch_default_allowance=batch_allowance,
            batch_ceiling=batch_ceiling,
            max_queue_wait_s=max_queue_wait,
            max_queued=max_queued,
            batch_ramp_per_s=batch_ramp,
            batch_ramp_idle_s=batch_ramp_idle,
            preempt_batch=preempt_batch,
            engine_slots=engine_slots,
            priorities=_priorities(priorities),
            priority_higher_first=priority_higher_first,
            upstream_first_byte_timeout_s=upstream_first_byte_timeout,
            upstream_read_timeout_s=upstream_read_timeout,
            upstream_pool_size=upstream_pool,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            client_stall_timeout_s=client_stall_timeout,
            max_connections=max_connections,
            max_body_bytes=max_body,
            max_body_total_bytes=max_body_total,
            control_token=token,
        )
    except ValueError as exc:
        from_env = any(
            ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT for name in ctx.params
        )
        said = _name_options(str(exc), ctx)
        if from_env:  # gateway.env under systemd: a config error, not a typo on a command line
            raise _ConfigFail(f"{said} (options from LLM_WATCHDOG_GATEWAY_* variables)") from None
        raise click.UsageError(said) from None
    setup_logging(log_level)

    def reload(current: GatewayConfig) -> GatewayConfig | None:
        try:
            new_token, new_classes = read_secrets(token_credential, token_file, key_classes_file)
            new = dataclasses.replace(current, control_token=new_token, key_classes=new_classes)
        except ValueError as exc:
            log.error("reload refused, keeping the running token and key classes: %s", exc)
            return None
        log.info(
            "reloaded: control token %s, %d API keys mapped to classes",
            "set" if new_token else "not set",
            len(new_classes),
        )
        return new

    raise SystemExit(run(config, reload=reload, engine_unit=engine_unit))


def run(
    config: GatewayConfig,
    reload: Callable[[GatewayConfig], GatewayConfig | None] | None = None,
    engine_unit: str = "",
) -> int:
    """Serve `config` in the foreground; the exit code (0 after SIGTERM/SIGINT, 1 no bind)."""
    notifier = Notifier()
    try:
        serve(
            config,
            on_listening=_announce,
            notifier=notifier,
            reload=reload,
            engine_unit=engine_unit,
        )
    except ListenError as exc:
        raise _Fail(str(exc)) from None
    finally:
        notifier.close()
    return 0


def _announce(url: str, config: GatewayConfig) -> None:
    if not is_loopback_host(config.listen_host):
        log.warning(
            "listening on %s, not loopback: anyone who can reach it can use the engine "
            "through it; put it behind a firewall or listen on 127.0.0.1",
            config.listen_host,
        )
    token = "set" if config.control_token else f"not set, changes refused (set ${TOKEN_ENV})"
    log.info(
        "gateway listening on %s -> %s; batch allowance %d (ceiling %d, queue wait %g s%s%s); "
        "control token %s",
        url,
        config.upstream_url,
        config.batch_default_allowance,
        config.batch_ceiling,
        config.max_queue_wait_s,
        ", pre-empted when cut" if config.preempt_batch else "",
        _slot_text(config),
        token,
    )
