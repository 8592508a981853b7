"""`llm-watchdog install`: the systemd unit, a config to start from, and the service enabled.

The unit shipped in `systemd/` is the template; ExecStart is rewritten to the interpreter
that runs this install, so a virtual environment keeps working under systemd.
"""

from __future__ import annotations

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
# The control token (the watchdog's [control] token_file names the same file):
LLM_WATCHDOG_GATEWAY_TOKEN_FILE=/etc/llm-watchdog/control-token
"""


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


def unit_template(name: str = UNIT_NAME) -> str:
    return (bundled_dir("systemd") / name).read_text(encoding="utf-8")


def render_unit(
    template: str, python: str, config_path: Path, user: bool, argv: list[str] | None = None
) -> str:
    argv = argv or ["--config", str(config_path), "run"]
    exec_start = shlex.join([python, "-m", "llm_watchdog", *argv])
    lines = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            line = f"ExecStart={exec_start}"
        if user and line.split("=")[0] in {"DynamicUser", "SupplementaryGroups", "ProtectHome"}:
            continue  # a user unit runs as its owner and needs to read its home
        if user and line.startswith("WantedBy="):
            line = "WantedBy=default.target"
        lines.append(line)
    return "\n".join(lines) + "\n"


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
    if gateway:
        units[unit_dir / GATEWAY_UNIT] = render_unit(
            unit_template(GATEWAY_UNIT), python, config_path, user, ["gateway"]
        ).replace("/etc/llm-watchdog/gateway.env", str(config_path.parent / "gateway.env"))
        files[real_config.parent / "gateway.env"] = GATEWAY_ENV
        files[real_config.parent / "control-token"] = secrets.token_hex(16) + "\n"
    if start:
        names = [GATEWAY_UNIT, UNIT_NAME] if gateway else [UNIT_NAME]
        commands.append(systemctl + ["enable", "--now", *names])
    return InstallPlan(
        unit_path=unit_dir / UNIT_NAME,
        unit_text=render_unit(unit_template(), python, config_path, user),
        config_path=real_config,
        write_config=not real_config.exists(),
        commands=commands,
        units=units,
        files=files,
    )


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
        path.chmod(0o600 if "token" in path.name else 0o644)
        done.append(f"wrote {path}")
    if plan.write_config:
        plan.config_path.parent.mkdir(parents=True, exist_ok=True)
        plan.config_path.write_text(example_config(), encoding="utf-8")
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
