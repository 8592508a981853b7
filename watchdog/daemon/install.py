"""`llm-watchdog install` and `uninstall`: the systemd units, a config, credentials.

The units shipped in `systemd/` are the templates; ExecStart is rewritten to the interpreter
that runs this install, so a virtual environment keeps working under systemd.

Secrets go where systemd hands them over: a root-only file under
/etc/llm-watchdog/credentials/, named by a `LoadCredential=NAME:FILE` line in each unit that
needs it. systemd reads the file as root and gives the service (a DynamicUser= uid that could
never read a root file) its own copy in $CREDENTIALS_DIRECTORY/NAME.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llm_watchdog.config import example_config
from llm_watchdog.resources import bundled_dir

UNIT_NAME = "llm-watchdog.service"
GATEWAY_UNIT = "llm-watchdog-gateway.service"
GATEWAY_ENV = """\
# llm-watchdog gateway settings (LLM_WATCHDOG_GATEWAY_<OPTION>; see `llm-watchdog gateway -h`).
LLM_WATCHDOG_GATEWAY_LISTEN=127.0.0.1:8090
LLM_WATCHDOG_GATEWAY_UPSTREAM=http://127.0.0.1:8000
LLM_WATCHDOG_GATEWAY_BATCH_ALLOWANCE=8
LLM_WATCHDOG_GATEWAY_BATCH_CEILING=64
LLM_WATCHDOG_GATEWAY_MAX_QUEUE_WAIT=30s
# Batch requests let in per second after a raise (0: all at once).
LLM_WATCHDOG_GATEWAY_BATCH_RAMP=0.5
# The engine's slots (vLLM --max-num-seqs, llama.cpp --parallel): batch is held under them
# less an eighth (1 to 4), so chat finds one free. auto: as the engine says (llama.cpp's /props,
# SGLang's /get_server_info; vLLM's --max-num-seqs from LLM_WATCHDOG_GATEWAY_ENGINE_UNIT,
# its systemd unit), no line where it says nothing; a number; 0: no line.
LLM_WATCHDOG_GATEWAY_ENGINE_SLOTS=auto
# The control token is the systemd credential "control-token" (LoadCredential= in the
# unit); the watchdog's [control] token_credential names the same one.
LLM_WATCHDOG_GATEWAY_TOKEN_CREDENTIAL=control-token
"""
TOKEN_CREDENTIAL = "control-token"
GATEWAY_URL = "http://127.0.0.1:8090"  # LLM_WATCHDOG_GATEWAY_LISTEN above
_CONTROL_OFF = (
    "# Point server.url at the gateway too, so canaries go through it as chat.\nenabled = false"
)
# Lines a user unit cannot use: it runs as its owner, who needs their home, and a user
# manager cannot change devices, groups or capabilities.
_SYSTEM_ONLY = {
    "DynamicUser",
    "SupplementaryGroups",
    "ProtectHome",
    "DevicePolicy",
    "DeviceAllow",
    "PrivateDevices",
    "PrivateUsers",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
}


# Where a system unit cannot see: ProtectHome= hides the first three, PrivateTmp= gives the
# service an empty /tmp and /var/tmp of its own.
_HIDDEN = {
    Path("/home"): "ProtectHome=",
    Path("/root"): "ProtectHome=",
    Path("/run/user"): "ProtectHome=",
    Path("/tmp"): "PrivateTmp=",
    Path("/var/tmp"): "PrivateTmp=",
}
# The database of a system install: StateDirectory=llm-watchdog. Named in the config it writes,
# so the CLI, which runs without $STATE_DIRECTORY, reads the service's database.
SYSTEM_DB = "/var/lib/llm-watchdog/watchdog.db"
VENV_HINT = (
    "sudo python3 -m venv /opt/llm-watchdog && sudo /opt/llm-watchdog/bin/pip install . && "
    "sudo /opt/llm-watchdog/bin/llm-watchdog install"
)


def service_cannot_run(python: str, package_dir: Path, user: bool = False) -> str | None:
    """Why the unit could not run `python -m llm_watchdog` from `package_dir`, else None.

    A system unit runs under DynamicUser= (a uid in no group) with ProtectHome= and
    PrivateTmp=: an interpreter or a package in a home folder or /tmp is not there for it,
    and one in a folder other users cannot read is not readable by it. systemd then fails
    the start with status 203/EXEC or an ImportError, far from the install that caused it.
    A user unit runs as its owner and sees its home; only /tmp is its own.
    """
    paths = [Path(python), Path(python).resolve(), package_dir.resolve()]
    for path in paths:
        for hidden, setting in _HIDDEN.items():
            if user and setting == "ProtectHome=":
                continue
            if path == hidden or hidden in path.parents:
                return f"{path} is under {hidden}, which the service does not see ({setting})"
    return None if user else unreadable_by_others(package_dir)


def unreadable_by_others(folder: Path) -> str | None:
    """Why a uid in no group could not read `folder` (DynamicUser=), else None."""
    for f in (folder.resolve(), *folder.resolve().parents):
        try:
            mode = f.stat().st_mode
        except OSError:
            continue
        if mode & 0o005 != 0o005:
            return (
                f"{f} is not readable by other users (mode {mode & 0o777:04o}), "
                "and the service runs as a uid of its own"
            )
    return None


@dataclass(frozen=True)
class InstallPlan:
    unit_path: Path
    unit_text: str
    config_path: Path
    write_config: bool  # never overwrite a config a user already has
    commands: list[list[str]]
    # More units (always written) and files (written only when absent), e.g. the gateway's.
    units: dict[Path, str] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)
    # Secrets: written only when absent, mode 0600 in a 0700 folder.
    secrets: dict[Path, str] = field(default_factory=dict)
    config_text: str = ""


def unit_template(name: str = UNIT_NAME) -> str:
    return (bundled_dir("systemd") / name).read_text(encoding="utf-8")


def render_unit(
    template: str,
    python: str,
    config_path: Path,
    user: bool,
    argv: list[str] | None = None,
    credentials: dict[str, Path] | None = None,
) -> str:
    """The unit text: ExecStart on `python`, a LoadCredential= line per credential."""
    argv = argv or ["--config", str(config_path), "run"]
    exec_start = shlex.join([python, "-m", "llm_watchdog", *argv])
    lines = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            line = f"ExecStart={exec_start}"
            for name, path in (credentials or {}).items():
                lines.append(f"LoadCredential={name}:{path}")
        if user and line.split("=")[0] in _SYSTEM_ONLY:
            continue
        if user and line.startswith("WantedBy="):
            line = "WantedBy=default.target"
        lines.append(line)
    return "\n".join(lines) + "\n"


def credentials_dir(config_path: Path) -> Path:
    return config_path.parent / "credentials"


def plan_install(
    root: Path = Path("/"),
    user: bool = False,
    home: Path | None = None,
    python: str = sys.executable,
    start: bool = True,
    gateway: bool = False,
) -> InstallPlan:
    if user:
        home = home or Path.home()
        unit_dir = root / home.relative_to("/") / ".config/systemd/user"
        config_path = home / ".config/llm-watchdog/config.toml"
    else:
        unit_dir = root / "etc/systemd/system"
        config_path = Path("/etc/llm-watchdog/config.toml")
    real_config = root / config_path.relative_to("/")
    systemctl = ["systemctl", "--user"] if user else ["systemctl"]
    commands = [systemctl + ["daemon-reload"]]
    units: dict[Path, str] = {}
    files: dict[Path, str] = {}
    secret_files: dict[Path, str] = {}
    credentials: dict[str, Path] = {}
    if gateway:
        token_path = credentials_dir(config_path) / TOKEN_CREDENTIAL
        credentials[TOKEN_CREDENTIAL] = token_path
        gateway_unit = render_unit(
            unit_template(GATEWAY_UNIT), python, config_path, user, ["gateway"], credentials
        ).replace("/etc/llm-watchdog/gateway.env", str(config_path.parent / "gateway.env"))
        # In the unit too, so a gateway.env kept from an older install (TOKEN_FILE, a root
        # file the service cannot read) is overruled: a credential comes first.
        units[unit_dir / GATEWAY_UNIT] = gateway_unit.replace(
            "\nExecStart=",
            f"\nEnvironment=LLM_WATCHDOG_GATEWAY_TOKEN_CREDENTIAL={TOKEN_CREDENTIAL}\nExecStart=",
            1,
        )
        files[real_config.parent / "gateway.env"] = GATEWAY_ENV
        # An older install kept the token at /etc/llm-watchdog/control-token: the same token
        # moves into the credential, so clients that hold it keep working.
        old = real_config.parent / "control-token"
        token = old.read_text(encoding="utf-8") if old.is_file() else secrets.token_hex(16) + "\n"
        secret_files[root / token_path.relative_to("/")] = token
    if start:
        names = [GATEWAY_UNIT, UNIT_NAME] if gateway else [UNIT_NAME]
        commands.append(systemctl + ["enable", "--now", *names])
    return InstallPlan(
        unit_path=unit_dir / UNIT_NAME,
        unit_text=render_unit(unit_template(), python, config_path, user, None, credentials),
        config_path=real_config,
        write_config=not real_config.exists(),
        commands=commands,
        units=units,
        files=files,
        secrets=secret_files,
        config_text=_config_for(credentials, user),
    )


def _config_for(credentials: dict[str, Path], user: bool = False) -> str:
    """The example config, naming the credentials the units hand over and, for a system
    install, the service's database (a user unit and the CLI share the XDG default)."""
    text = example_config()
    if TOKEN_CREDENTIAL in credentials:
        # With the gateway installed, canaries go through it as chat and the watchdog steers
        # it: what the gateway is installed for.
        text = _swap(text, 'url = "http://127.0.0.1:8000"', f'url = "{GATEWAY_URL}"')
        text = _swap(text, _CONTROL_OFF, _CONTROL_OFF.replace("enabled = false", "enabled = true"))
        text = _swap(text, 'token_credential = ""', f'token_credential = "{TOKEN_CREDENTIAL}"')
    if not user:
        text = text.replace(f'# path = "{SYSTEM_DB}"', f'path = "{SYSTEM_DB}"', 1)
    return text


def _swap(text: str, old: str, new: str) -> str:
    if old not in text:  # the example changed under this code: fail in the tests, not later
        raise AssertionError(f"the example config has no {old!r}")
    return text.replace(old, new, 1)


def apply(plan: InstallPlan, run_systemctl: bool = True) -> list[str]:
    """Carry out the plan; return one line per step done, for the user to read."""
    done = []
    plan.unit_path.parent.mkdir(parents=True, exist_ok=True)
    plan.unit_path.write_text(plan.unit_text, encoding="utf-8")
    done.append(f"wrote {plan.unit_path}")
    for path, text in plan.units.items():
        path.write_text(text, encoding="utf-8")
        done.append(f"wrote {path}")
    for path, text in plan.files.items():
        if path.exists():
            done.append(f"kept existing {path}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o644)
        done.append(f"wrote {path}")
    for path, text in plan.secrets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        if path.exists():
            done.append(f"kept existing {path}")
            continue
        # Created 0600 before anything is written: the secret is never readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        done.append(f"wrote {path} (mode 0600; handed to the services by LoadCredential=)")
    if plan.write_config:
        plan.config_path.parent.mkdir(parents=True, exist_ok=True)
        plan.config_path.write_text(plan.config_text or example_config(), encoding="utf-8")
        done.append(f"wrote {plan.config_path} (edit [server] url, then restart the service)")
    else:
        done.append(f"kept existing {plan.config_path}")
    if run_systemctl:
        if shutil.which("systemctl") is None:
            raise RuntimeError(
                "systemctl not found: this system does not run systemd; "
                "start `llm-watchdog run` from your own supervisor instead"
            )
        for cmd in plan.commands:
            subprocess.run(cmd, check=True)
            done.append("ran " + shlex.join(cmd))
    return done


@dataclass(frozen=True)
class UninstallPlan:
    commands: list[list[str]]  # run first, failures reported and ignored
    remove: list[Path]  # unit files, and with --purge config, credentials and state


def plan_uninstall(
    root: Path = Path("/"),
    user: bool = False,
    home: Path | None = None,
    purge: bool = False,
    stop: bool = True,
) -> UninstallPlan:
    """Stop and disable both units, remove their files; `purge` removes config and data too."""
    names = [UNIT_NAME, GATEWAY_UNIT]
    if user:
        home = home or Path.home()
        base = root / home.relative_to("/")
        unit_dir = base / ".config/systemd/user"
        data = [base / ".config/llm-watchdog", base / ".local/state/llm-watchdog"]
        systemctl = ["systemctl", "--user"]
    else:
        unit_dir = root / "etc/systemd/system"
        # DynamicUser= keeps the state in /var/lib/private and links /var/lib to it.
        data = [
            root / "etc/llm-watchdog",
            root / "var/lib/llm-watchdog",
            root / "var/lib/private/llm-watchdog",
        ]
        systemctl = ["systemctl"]
    commands = (
        [systemctl + ["disable", "--now", *names], systemctl + ["daemon-reload"]] if stop else []
    )
    remove = [unit_dir / n for n in names] + (data if purge else [])
    return UninstallPlan(commands=commands, remove=remove)


def apply_uninstall(plan: UninstallPlan, run_systemctl: bool = True) -> list[str]:
    done = []
    if run_systemctl and plan.commands and shutil.which("systemctl") is not None:
        result = subprocess.run(plan.commands[0], check=False, capture_output=True, text=True)
        done.append(
            "ran " + shlex.join(plan.commands[0])
            if result.returncode == 0
            else f"{shlex.join(plan.commands[0])}: {result.stderr.strip() or 'failed'} (ignored)"
        )
    for path in plan.remove:
        if path.is_symlink() or path.is_file():
            path.unlink()
            done.append(f"removed {path}")
        elif path.is_dir():
            shutil.rmtree(path)
            done.append(f"removed {path}/")
    if run_systemctl and len(plan.commands) > 1 and shutil.which("systemctl") is not None:
        subprocess.run(plan.commands[1], check=False)
        done.append("ran " + shlex.join(plan.commands[1]))
    return done


# Shipped beside the units, for a Prometheus, Alertmanager and Grafana that already run:
# `install` lists where they are; nothing here is written or started.
OBSERVABILITY_FILES = (
    ("Prometheus rules (rule_files:)", "llm-watchdog-rules.yml"),
    ("their unit tests (promtool test rules)", "llm-watchdog-rules.test.yml"),
    ("Grafana dashboard (import the JSON)", "llm-watchdog-dashboard.json"),
)


def observability_files() -> list[tuple[str, Path]]:
    """(what it is, where it is) for each shipped rules, rule-test and dashboard file."""
    where = bundled_dir("systemd")
    return [(what, where / name) for what, name in OBSERVABILITY_FILES]
