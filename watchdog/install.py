"""`llm-watchdog install`: the systemd unit, a config to start from, and the service enabled.

The unit shipped in `systemd/` is the template; ExecStart is rewritten to the interpreter
that runs this install, so a virtual environment keeps working under systemd.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from watchdog.config import example_config
from watchdog.resources import bundled_dir

UNIT_NAME = "llm-watchdog.service"


@dataclass(frozen=True)
class InstallPlan:
    unit_path: Path
    unit_text: str
    config_path: Path
    write_config: bool  # never overwrite a config a user already has
    commands: list[list[str]]


def unit_template() -> str:
    return (bundled_dir("systemd") / UNIT_NAME).read_text(encoding="utf-8")


def render_unit(template: str, python: str, config_path: Path, user: bool) -> str:
    exec_start = shlex.join([python, "-m", "watchdog", "--config", str(config_path), "run"])
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
    if start:
        commands.append(systemctl + ["enable", "--now", UNIT_NAME])
    return InstallPlan(
        unit_path=unit_dir / UNIT_NAME,
        unit_text=render_unit(unit_template(), python, config_path, user),
        config_path=real_config,
        write_config=not real_config.exists(),
        commands=commands,
    )


def apply(plan: InstallPlan, run_systemctl: bool = True) -> list[str]:
    """Carry out the plan; return one line per step done, for the user to read."""
    done = []
    plan.unit_path.parent.mkdir(parents=True, exist_ok=True)
    plan.unit_path.write_text(plan.unit_text, encoding="utf-8")
    done.append(f"wrote {plan.unit_path}")
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
