"""Settings: one TOML file, validated into frozen dataclasses.

Like uvicorn's Config, the dataclasses only hold values; `load_settings()` does the I/O.
Every error names the file and the key and says what is expected; the CLI turns a
ConfigError into one line on stderr and exit status 78 (EX_CONFIG, sysexits.h).

Precedence, lowest first: built-in defaults, the file, then environment variables
`LLM_WATCHDOG__SECTION__KEY=value` (values parsed as TOML, falling back to a plain string),
so a systemd drop-in can change one setting without editing the file.
Secrets (API keys, tokens) come from a systemd credential, a file or an environment
variable named in the config, never from the command line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from llm_watchdog import credentials
from llm_watchdog.alerts.config import AlertConfigError, alert_config_from_dict
from llm_watchdog.control.headroom import AUTO
from llm_watchdog.control.law import ControlConfig
from llm_watchdog.drift import DriftConfig
from llm_watchdog.durations import format_duration, parse_duration
from llm_watchdog.errors import ConfigError, did_you_mean
from llm_watchdog.probe.client import CACHE_MODES, ProbeOptions
from llm_watchdog.resources import package_file
from llm_watchdog.urls import check_http_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_CONFIG_PATH = Path("/etc/llm-watchdog/config.toml")
ENV_CONFIG = "LLM_WATCHDOG_CONFIG"
ENV_PREFIX = "LLM_WATCHDOG__"


def _duration(default: str | float, *, minimum_s: float = 0.0) -> Any:
    seconds = parse_duration(default) if isinstance(default, str) else float(default)
    return field(default=seconds, metadata={"duration": True, "min": minimum_s})


def _choice(default: str, *choices: str) -> Any:
    return field(default=default, metadata={"choices": choices})


def _url(default: str) -> Any:
    return field(default=default, metadata={"http_url": True})


def default_storage_path() -> str:
    """systemd's StateDirectory= when run as a service, else the XDG state folder."""
    state = os.environ.get("STATE_DIRECTORY")
    if state:
        return str(Path(state.split(":")[0]) / "watchdog.db")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "llm-watchdog" / "watchdog.db")


@dataclass(frozen=True)
class ServerSettings:
    url: str = _url("http://127.0.0.1:8000")
    model: str = "auto"
    api: str = _choice("openai", "openai", "ollama")
    engine: str = _choice("auto", "auto", "llamacpp", "vllm", "sglang", "tgi", "ollama", "other")
    api_key_file: str = ""
    api_key_env: str = ""
    # A systemd credential (LoadCredential=NAME:FILE): read from $CREDENTIALS_DIRECTORY/NAME.
    api_key_credential: str = ""
    launch_command: str = "auto"
    # The engine's systemd unit (e.g. "vllm.service"): its ExecStart is the launch command
    # where the listening process cannot be read (another user, /proc mounted hidepid).
    engine_unit: str = ""


@dataclass(frozen=True)
class ProbeSettings:
    interval_s: float = _duration("10s", minimum_s=0.1)
    jitter_s: float = _duration("1s")
    probe_set: str = "default"
    # The probe's own defaults (ProbeOptions) are the config's: one value for each.
    connect_timeout_s: float = _duration(ProbeOptions.connect_timeout_s, minimum_s=0.01)
    first_token_timeout_s: float = _duration(ProbeOptions.first_token_timeout_s, minimum_s=0.01)
    total_timeout_s: float = _duration(ProbeOptions.total_timeout_s, minimum_s=0.01)
    cache_mode: str = _choice(ProbeOptions.cache_mode, *CACHE_MODES)
    seed: int = ProbeOptions.seed
    fingerprint_interval_s: float = _duration("1m", minimum_s=1)

    def __post_init__(self) -> None:
        # The timeouts need no order: total_timeout bounds the probe whatever the others say.
        d = format_duration
        if not 0 <= self.seed <= 0xFFFFFFFF:
            # Sent with every probe: llama.cpp reads it as 32 bits and vLLM as 64, and an
            # engine that refuses it fails every probe. -1 (llama.cpp's "random") would make
            # the canary's answer change from probe to probe.
            raise ValueError(f"seed must be from 0 to 4294967295, got {self.seed}")
        if self.jitter_s > self.interval_s:
            raise ValueError(
                f"jitter ({d(self.jitter_s)}) must be at most interval ({d(self.interval_s)}): "
                "each probe waits up to the jitter past its turn, and a longer one leaves the "
                "interval meaning nothing"
            )


@dataclass(frozen=True)
class GpuSettings:
    enabled: bool = True
    interval_s: float = _duration("1s", minimum_s=0.05)
    indices: str | list[int] = field(default="all", metadata={"all_or_indices": True})
    call_timeout_s: float = _duration("2s", minimum_s=0.01)


@dataclass(frozen=True)
class StorageSettings:
    path: str = field(default_factory=default_storage_path)
    raw_retention_s: float = _duration("14d", minimum_s=3600)
    rollup_interval_s: float = _duration("5m", minimum_s=1)


@dataclass(frozen=True)
class LoggingSettings:
    level: str = _choice("info", "debug", "info", "warning", "error")
    format: str = _choice("auto", "auto", "journal", "text")


def check_listen(listen: str) -> str:
    """HOST:PORT, or "" for off; a ValueError saying what is expected otherwise."""
    if listen:
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(
                f'expected HOST:PORT like 127.0.0.1:9108, or "" for off; got {listen!r}'
            )
    return listen


@dataclass(frozen=True)
class ApiSettings:
    # HOST:PORT for /metrics (Prometheus) and /status; "" turns the endpoint off.
    listen: str = field(default="127.0.0.1:9108", metadata={"check": check_listen})

    def __post_init__(self) -> None:
        try:
            check_listen(self.listen)
        except ValueError as exc:
            raise ValueError(f"listen: {exc}") from None


@dataclass(frozen=True)
class DriftSettings:
    """The judging side (llm_watchdog.drift.DriftConfig holds the full set of tuning constants)."""

    enabled: bool = True
    # Warm probes free of heat bits a baseline is learned from: 300 = 50 min at a 10 s interval.
    baseline_probes: int = 300
    # The smallest slowdown worth an alarm (TTFT ratio against the baseline).
    shift_ratio: float = 1.3
    # And the smallest rise of the recent median TTFT over the baseline's worth an alarm.
    min_rise_s: float = _duration("20ms")
    # Mean probes between false alarms on a steady system (5e5 at 10 s = about 8 weeks).
    false_alarm_probes: float = 500_000.0
    # Read telemetry: a falling SM clock lets a slowdown be confirmed sooner.
    telemetry_assist: bool = True
    cold_start_limit_s: float = _duration("20s")
    cold_after_idle_s: float = _duration("5m")
    heat_horizon_s: float = _duration("5m")
    quality_window: int = 30


def check_chat_per_minute(value: int | str) -> int | str:
    """The setting "auto", 0 or a count of chat answers a minute; a ValueError otherwise."""
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise ValueError(
        f'expected "auto" (the gateway\'s count of chat), 0 (the pooled p95) or a count of '
        f"chat answers a minute like 24; got {value!r}"
    )


@dataclass(frozen=True)
class ControlSettings:
    """The control loop that steers the batch allowance (llm_watchdog.control.law holds the law)."""

    enabled: bool = False
    # Decide and record every step, read the serving layer back, but never write: what the
    # controller would do, shown by `history --control`, before it is trusted to act.
    dry_run: bool = False
    actuator: str = _choice("gateway", "gateway", "haproxy", "command")
    gateway_url: str = _url("http://127.0.0.1:8090")
    # The gateway's control token, from a file or an environment variable.
    token_file: str = ""
    token_env: str = "LLM_WATCHDOG_GATEWAY_TOKEN"
    token_credential: str = ""
    target_p95_s: float = _duration("2s", minimum_s=0.001)
    # The law's own defaults (ControlConfig) are the config's: one value for each.
    floor: int = ControlConfig.floor
    ceiling: int = ControlConfig.ceiling
    default_allowance: int = ControlConfig.default_allowance
    interval_s: float = _duration("1s", minimum_s=0.1)
    lease_s: float = _duration(ControlConfig.lease_s, minimum_s=1)
    drain_time_s: float = _duration(ControlConfig.drain_time_s)
    # After heat, hold the allowance until the clock has been steady this long.
    freeze_release_s: float = _duration(ControlConfig.freeze_release_s)
    # Sequences the engine runs at once (vLLM --max-num-seqs, llama.cpp --parallel, Ollama
    # OLLAMA_NUM_PARALLEL, SGLang --max-running-requests); 0: detected where the engine says.
    engine_slots: int = ControlConfig.engine_slots
    # How `headroom`, `status` and `report` judge a group of probes: as the SLO's one-minute
    # windows of this many chat answers; "auto": of as many as the gateway counted over the
    # span (the pooled p95 where it counted none); 0: by the probes' pooled p95.
    chat_per_minute: int | str = field(default=AUTO, metadata={"check": check_chat_per_minute})
    haproxy_socket: str = ""  # e.g. /run/haproxy/admin.sock or 127.0.0.1:9999
    haproxy_backend: str = ""
    haproxy_server: str = ""
    command: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        try:
            check_chat_per_minute(self.chat_per_minute)
        except ValueError as exc:
            raise ValueError(f"chat_per_minute: {exc}") from None


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    drift: DriftSettings = field(default_factory=DriftSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    # [alerts] has arrays of sink tables; llm_watchdog.alerts.config parses it (see there).
    alerts: dict[str, Any] = field(default_factory=dict)
    source: str = field(default="(built-in defaults)", compare=False)
    # One line each, for a person: what loaded but looks unwise (secrets in a readable file).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def api_key(self) -> str | None:
        """The server's API key from the credential, file or variable the config names."""
        s = self.server
        return read_secret(
            s.api_key_file,
            s.api_key_env,
            self.source,
            "server.api_key",
            credential=s.api_key_credential,
        )

    def to_dict(self, *, mask_secrets: bool = True) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for f in dataclasses.fields(self):
            if f.name in ("source", "warnings"):
                continue
            section = getattr(self, f.name)
            if isinstance(section, dict):
                out[f.name] = _masked(section) if mask_secrets else section
                continue
            values = {_file_key(k): v for k, v in dataclasses.asdict(section).items()}
            out[f.name] = (
                {k: _mask_url(v) if k.endswith("url") else v for k, v in values.items()}
                if mask_secrets
                else values
            )
        return out

    def to_toml(self, *, mask_secrets: bool = True) -> str:
        """The settings as a config file that loads back to equal settings (secrets aside).

        Durations are written in the shortest form that parses back to the same seconds
        ("1.5s", not a rounded "2s"); other numbers as numbers.
        """
        lines: list[str] = []
        for f in dataclasses.fields(self):
            if f.name in ("source", "warnings"):
                continue
            section = getattr(self, f.name)
            lines.append(f"[{f.name}]")
            if isinstance(section, dict):
                raw = _masked(section) if mask_secrets else section
                lines.extend(f"{_toml_key(k)} = {toml_value(v)}" for k, v in raw.items())
            else:
                values = self.to_dict(mask_secrets=mask_secrets)[f.name]
                durations = {
                    _file_key(g.name)
                    for g in dataclasses.fields(section)
                    if g.metadata.get("duration")
                }
                for key, value in values.items():
                    text = format_exact_duration(value) if key in durations else value
                    lines.append(f"{key} = {toml_value(text)}")
            lines.append("")
        return "\n".join(lines)

    def control_config(self) -> ControlConfig:
        c = self.control
        shared = {name: getattr(c, name) for name in _LAW_FIELDS}
        return ControlConfig(target_p95_ms=c.target_p95_s * 1000.0, **shared)

    def control_token(self) -> str | None:
        c = self.control
        if not (c.token_credential or c.token_file or os.environ.get(c.token_env)):
            return None
        return read_secret(
            c.token_file, c.token_env, self.source, "control.token", credential=c.token_credential
        )

    def drift_config(self) -> DriftConfig:
        d = self.drift
        return DriftConfig(
            baseline_n=d.baseline_probes,
            # Clean probes are waited for over three baselines' worth, as the default 900
            # is for 300: a larger baseline_probes waits longer rather than being refused.
            baseline_max_wait=3 * d.baseline_probes,
            shift_ratio=d.shift_ratio,
            min_rise_ms=d.min_rise_s * 1000.0,
            arl0_probes=d.false_alarm_probes,
            telemetry_assist=d.telemetry_assist,
            cold_start_limit_ms=d.cold_start_limit_s * 1000.0,
            idle_after_s=d.cold_after_idle_s,
            heat_horizon_s=d.heat_horizon_s,
            quality_window=d.quality_window,
        )


# DriftConfig fields that [drift] names otherwise, for its errors.
_DRIFT_KEYS = {
    "baseline_n": "baseline_probes",
    "arl0_probes": "false_alarm_probes",
    "min_rise_ms": "min_rise",
    "cold_start_limit_ms": "cold_start_limit",
    "idle_after_s": "cold_after_idle",
    "heat_horizon_s": "heat_horizon",
}

# [control] keys that are ControlConfig fields of the same name and unit.
_LAW_FIELDS = (
    "floor",
    "ceiling",
    "default_allowance",
    "drain_time_s",
    "lease_s",
    "freeze_release_s",
    "engine_slots",
)

# The last word of a key that holds a secret itself: `token`, `api_key`, `password`,
# `client_secret`, a webhook's `url`. The last word, not any part: `first_token_timeout`
# is a time and `max_tokens` a count, and a key ending in `_file`, `_env` or `_credential`
# names where a secret is, not the secret.
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "authorization", "url"}
)


def _secret_key(key: str) -> bool:
    words = re.split(r"[_\-.\s]+", key.strip().lower())
    return words[-1] in _SECRET_WORDS


def _masked(value: Any) -> Any:
    """Config values with secrets hidden: webhook URLs and header values carry tokens too."""
    if isinstance(value, dict):
        return {
            k: "***"
            if isinstance(v, str) and v and _secret_key(k)
            else {h: "***" for h in v}
            if k == "headers" and isinstance(v, dict)
            else _masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _mask_url(value: Any) -> Any:
    """A URL with its password (user:password@host) hidden; anything else as it is."""
    if not isinstance(value, str) or "@" not in value:
        return value
    scheme, sep, rest = value.partition("://")
    userinfo, at, host = rest.partition("@")
    if not sep or not at or ":" not in userinfo or "/" in userinfo:
        return value
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def _url_holds_secret(url: str) -> bool:
    """A password (user:password@host) or a secret query parameter (?token=…) in a URL."""
    if _mask_url(url) != url:
        return True
    try:
        query = urlsplit(url).query
    except ValueError:
        return False
    return any(_secret_key(name) for name, _ in parse_qsl(query, keep_blank_values=True))


def _inline_secrets(value: Any, prefix: str = "") -> list[str]:
    """Keys holding a secret written into the file itself (not a _file/_env/_credential)."""
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{prefix}.{k}" if prefix else str(k)
            if k == "headers" and isinstance(v, dict) and v:
                out.append(where)
            elif isinstance(v, str) and v and _secret_key(str(k)):
                # A webhook's URL is its credential (Slack, Discord, ntfy topics). Other
                # URLs ([server] url, [control] gateway_url, an Alertmanager's url and
                # generator_url) are addresses, unless they carry a password or a token.
                webhook = "webhook" in str(k).lower() or (
                    prefix.startswith("alerts.sink")
                    and k == "url"
                    and value.get("type", "webhook") == "webhook"
                )
                if str(k).lower().endswith("url") and not webhook:
                    if not _url_holds_secret(v):
                        continue
                out.append(where)
            else:
                out.extend(_inline_secrets(v, where))
    elif isinstance(value, list):
        for i, v in enumerate(value, start=1):
            out.extend(_inline_secrets(v, f"{prefix}[{i}]"))
    return out


def read_secret(
    file_path: str, env_name: str, source: str, what: str, *, credential: str = ""
) -> str | None:
    """A secret named by systemd credential, file or environment variable, in that order.

    One that is named but cannot be read is a ConfigError (one line, exit 78): a service
    that starts without the secret it was told to use would fail later and less clearly.
    """
    if credential:
        return read_credential(credential, source, what)
    if file_path:
        try:
            return Path(file_path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"{source}: {what}_file: cannot read {file_path} ({exc.strerror}); "
                "create it (mode 0600) readable by the service, or hand it over with "
                f"LoadCredential= and {what.split('.')[-1]}_credential"
            ) from exc
        except UnicodeDecodeError:
            raise ConfigError(
                f"{source}: {what}_file: {file_path} is not UTF-8 text; write the secret as text"
            ) from None
    if env_name:
        value = os.environ.get(env_name)
        if value is None:
            raise ConfigError(
                f"{source}: {what}_env: environment variable {env_name} is not set; "
                "set it (e.g. in a systemd EnvironmentFile=) or remove the key"
            )
        return value.strip()
    return None


def read_credential(name: str, source: str, what: str) -> str:
    """A systemd credential (LoadCredential=NAME:FILE) from $CREDENTIALS_DIRECTORY/NAME."""
    try:
        return credentials.read_credential(
            name, f"{source}: {what}_credential", f"{what.split('.')[-1]}_file"
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


# File keys drop the unit suffix of duration fields: `interval = "10s"` fills `interval_s`.
def _file_key(attr: str) -> str:
    return attr[:-2] if attr.endswith("_s") else attr


SECTIONS: dict[str, Any] = {
    f.name: typing.get_origin(h) or h
    for f in dataclasses.fields(Settings)
    if f.name not in ("source", "warnings")
    for h in [typing.get_type_hints(Settings)[f.name]]
}


def _convert(value: Any, f: dataclasses.Field, hint: Any, where: str) -> Any:
    meta = f.metadata
    if meta.get("duration"):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if not math.isfinite(seconds):
            raise ConfigError(f"{where}: expected a finite duration like 10s or 5m, got {value!r}")
        if seconds < meta.get("min", 0.0):
            raise ConfigError(f"{where}: must be at least {meta['min']}s, got {value!r}")
        return seconds
    if meta.get("all_or_indices"):
        ok = value == "all" or (
            isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )
        if not ok:
            raise ConfigError(f'{where}: expected "all" or a list of GPU indices like [0, 1]')
        return value
    if "choices" in meta:
        if value not in meta["choices"]:
            raise ConfigError(
                f"{where}: expected one of {', '.join(meta['choices'])}; got {value!r}"
            )
        return value
    value = _check_type(value, hint, where)
    check = check_http_url if meta.get("http_url") else meta.get("check")
    if check is not None:
        try:
            check(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return value


def _check_type(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _check_type(value, option, where)
            except ConfigError:
                continue
        names = " or ".join(_type_name(t) for t in typing.get_args(hint))
        raise ConfigError(f"{where}: expected {names}, got {value!r}")
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list of {_type_name(item)}, got {value!r}")
        return [_check_type(v, item, where) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        _, item = typing.get_args(hint)
        return {str(k): _check_type(v, item, f"{where}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {_type_name(hint)}, got {value!r}")
    return value


def _type_name(t: Any) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        t, getattr(t, "__name__", str(t))
    )


# (section, key) -> the environment variable that set it, so that an error in a value (or a
# misspelled name) blames the variable, not a file that does not hold it.
EnvNames = typing.Mapping[tuple[str, str], str]


def _where(source: str, section: str, key: str, env_names: EnvNames | None) -> str:
    name = (env_names or {}).get((section, key))
    if name is not None:
        return f"environment variable {name} ([{section}] {key})"
    return f"{source}: [{section}] {key}"


def _env_note(section: str, env_names: EnvNames | None) -> str:
    """For an error that spans keys: which variables took part, if any did."""
    names = sorted(n for (sec, _), n in (env_names or {}).items() if sec == section)
    return f" (with environment {', '.join(names)})" if names else ""


def build_section(
    cls: type, raw: dict[str, Any], source: str, section: str, env_names: EnvNames | None = None
) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {_file_key(f.name): f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = _where(source, section, key, env_names)
        f = fields.get(key)
        if f is None:
            known = ", ".join(sorted(fields))
            guess = did_you_mean(key, fields)
            raise ConfigError(f"{where}: unknown key; {guess}known keys: {known}")
        values[f.name] = _convert(value, f, hints[f.name], where)
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        note = _env_note(section, env_names)
        raise ConfigError(f"{source}: [{section}] {exc}{note}") from None


def settings_from_dict(
    data: dict[str, Any], source: str, env_names: EnvNames | None = None
) -> Settings:
    """Settings from a config's tables; `env_names` says which keys environment variables
    set, for the errors to name them."""
    sections: dict[str, Any] = {}
    for name, raw in data.items():
        if name not in SECTIONS:
            known = ", ".join(sorted(SECTIONS))
            keys = raw if isinstance(raw, dict) else {}
            from_env = [(env_names or {}).get((name, k)) for k in keys]
            if from_env and all(from_env):
                raise ConfigError(
                    f"environment variable {from_env[0]}: unknown section [{name}]; "
                    f"known sections: {known}"
                )
            guess = did_you_mean(name, SECTIONS, "[{}]")
            raise ConfigError(
                f"{source}: [{name}]: unknown section; {guess}known sections: {known}"
            )
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: {name}: expected a [{name}] table, got {raw!r}")
        if SECTIONS[name] is dict:
            sections[name] = _raw_section(name, raw, source, env_names)
        else:
            sections[name] = build_section(SECTIONS[name], raw, source, name, env_names)
    try:
        settings = Settings(**sections, source=source)
        settings.drift_config()
    except ValueError as exc:
        text = str(exc).replace("drift config: ", "[drift] ")
        # The detector's own names for what the file calls otherwise.
        for field, key in _DRIFT_KEYS.items():
            text = re.sub(rf"\b{field}\b", key, text)
        raise ConfigError(f"{source}: {text}{_env_note('drift', env_names)}") from None
    try:
        settings.control_config()
    except ValueError as exc:
        text = str(exc).replace("control: ", "[control] ")
        raise ConfigError(f"{source}: {text}{_env_note('control', env_names)}") from None
    return settings


def _raw_section(
    name: str, raw: dict[str, Any], source: str, env_names: EnvNames | None = None
) -> dict[str, Any]:
    """Check a section another module parses, without reading the secrets it names."""
    if name == "alerts":
        try:
            alert_config_from_dict(raw)
        except AlertConfigError as exc:
            # exc.key is alerts.KEY or alerts.sink[N].KEY: a variable sets a whole KEY.
            top = exc.key.split(".", 1)[-1].split("[", 1)[0].split(".", 1)[0]
            env_name = (env_names or {}).get((name, top))
            if env_name is not None:
                raise ConfigError(f"environment variable {env_name}: {exc}") from None
            raise ConfigError(f"{source}: {exc}") from None
    return raw


def _env_overrides(env: typing.Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], EnvNames]:
    """The settings that LLM_WATCHDOG__SECTION__KEY variables give, and which variable gave
    each (section, key)."""
    out: dict[str, dict[str, Any]] = {}
    names: dict[tuple[str, str], str] = {}
    for name, text in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(
                f"environment variable {name}: expected {ENV_PREFIX}SECTION__KEY, e.g. "
                f"{ENV_PREFIX}PROBE__INTERVAL=5s"
            )
        try:
            value: Any = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        out.setdefault(parts[0], {})[parts[1]] = value
        names[(parts[0], parts[1])] = name
    return out, names


def resolve_path(cli_path: str | None, env: typing.Mapping[str, str]) -> tuple[Path, bool]:
    """The config file to read and whether the user named it (a named file must exist)."""
    if cli_path:
        return Path(cli_path), True
    if env.get(ENV_CONFIG):
        return Path(env[ENV_CONFIG]), True
    return DEFAULT_CONFIG_PATH, False


def load_settings(
    cli_path: str | None = None, env: typing.Mapping[str, str] | None = None
) -> Settings:
    env = os.environ if env is None else env
    path, named = resolve_path(cli_path, env)
    data: dict[str, Any] = {}
    source = str(path)
    warnings: list[str] = []
    if path.exists():
        try:
            raw = path.read_bytes()
            data = tomllib.loads(raw.decode("utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"{path}: not valid TOML: {exc}; check quoting and brackets"
            ) from None
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ConfigError(
                f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
                "save the file as UTF-8"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
        warnings.extend(_readable_secrets(path, data))
    elif named:
        raise ConfigError(
            f"{path}: no such file; write one with `llm-watchdog check-config --example > {path}`"
        )
    else:
        source = f"{path} (absent; built-in defaults)"
    overrides, env_names = _env_overrides(env)
    for sec, values in overrides.items():
        if not isinstance(data.get(sec, {}), dict):
            raise ConfigError(f"{source}: {sec}: expected a table")
        section = data.setdefault(sec, {})
        section.update(values)
    # A key the file also sets is the variable's now: an error in it names the variable.
    settings = settings_from_dict(data, source, env_names)
    return dataclasses.replace(settings, warnings=tuple(warnings)) if warnings else settings


def _readable_secrets(path: Path, data: dict[str, Any]) -> list[str]:
    """A warning when a file others can read holds a secret itself."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return []
    if not mode & stat.S_IROTH:
        return []
    keys = _inline_secrets(data)
    if not keys:
        return []
    return [
        f"{path}: holds secrets ({', '.join(keys)}) and is readable by every user "
        f"(mode {stat.S_IMODE(mode):04o}): `chmod 600 {path}`, or move them to "
        "LoadCredential= files named by *_credential keys"
    ]


def format_exact_duration(seconds: float) -> str:
    """A duration in config style that parses back to exactly `seconds`."""
    text = format_duration(seconds)
    if parse_duration(text) == seconds:
        return text
    for unit, size in (("s", 1.0), ("ms", 0.001)):
        candidate = f"{seconds / size!r}{unit}".replace(".0" + unit, unit)
        try:
            if parse_duration(candidate) == seconds:
                return candidate
        except ValueError:
            continue
    return repr(seconds)  # a bare number is seconds


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def toml_value(value: Any) -> str:
    """One TOML value: strings quoted, tables inline, arrays of either."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    return json.dumps(str(value))


def example_config() -> str:
    return package_file("example-config.toml").read_text(encoding="utf-8")
