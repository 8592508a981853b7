"""The project's controllers are known to the heat lab by name."""

from __future__ import annotations

import json

from click.testing import CliRunner

from watchdog.sim.cli import sim
from watchdog.sim.controllers import controller_names


def test_lab_knows_the_project_controllers():
    assert {"ours", "aimd", "gradient2", "static", "none"} <= set(controller_names())


def test_sim_run_with_our_controller_changes_the_allowance():
    out = CliRunner().invoke(
        sim,
        [
            "run",
            "--scenario",
            "consumer-warm-room",
            "--duration",
            "20m",
            "--controller",
            "ours",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["allowance_changes"] > 0
