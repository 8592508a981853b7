"""The heat lab: a simulated GPU and continuous-batching engine, in real or virtual time.

- `scenario`: TOML scenarios (`data/scenarios/`) → `Scenario`
- `gpu`: the card's physics (pure); `engine`: the engine model (pure); `world`: both on one clock
- `fakenvml`: a pynvml-compatible module over simulated cards
- `server`: `SimLab`, the real-time lab over real sockets
- `virtual`: `run_virtual`, hours in seconds; `controllers`: what it runs, by name
- `cli`: the `sim` command group
"""

from __future__ import annotations

from llm_watchdog.sim.controllers import (
    Controller,
    ControllerContext,
    Observation,
    make_controller,
    register_controller,
)
from llm_watchdog.sim.scenario import Scenario, ScenarioError, available_scenarios, load_scenario
from llm_watchdog.sim.virtual import RunResult, run_virtual

__all__ = [
    "Controller",
    "ControllerContext",
    "Observation",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "available_scenarios",
    "load_scenario",
    "make_controller",
    "register_controller",
    "run_virtual",
]
