"""Controllers the heat lab can run in virtual time, and the registry that names them.

A controller is anything with `interval_s` and `decide(now_s, observation) -> allowance`:
every `interval_s` simulated seconds the lab hands it what a daemon beside a gateway would
see (the chat TTFTs since the last decision, one NVML reading of the card, the batch job's
in-flight count) and applies the allowance it returns (None: leave it as it is).

Built in: `none` (no allowance: the batch job runs all its streams) and `static:N`.
Another module registers its own with `register_controller("name", factory)`, or is named
on the command line by import path: `--controller package.module:factory[:ARG]`. A factory
is called as `factory(arg, context)` with the text after the colon (or None) and a
`ControllerContext`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llm_watchdog.errors import ConfigError
from llm_watchdog.models import GpuSample


class ControllerError(ConfigError, ValueError):
    """A controller name or argument that cannot be used; one line, says what to give."""


@dataclass(frozen=True)
class Observation:
    now_s: float  # simulated seconds since the start
    chat_ttfts_ms: tuple[float, ...]  # chat requests whose first token came since last time
    gpu: GpuSample  # one NVML-style reading (violation times since the previous one)
    batch_inflight: int  # batch requests running or queued in the engine
    batch_waiting: int  # batch streams held back by the allowance
    batch_demand: int  # streams the batch job wants in flight
    allowance: int | None  # the allowance in force (None: no cap)
    slo_ttft_ms: float  # the chat p95 TTFT target
    # What a gateway sees of chat before any answer (None: not known).
    chat_arrivals: int | None = None  # chat requests that arrived since last time
    chat_inflight: int | None = None  # chat requests arrived and not yet finished


@dataclass(frozen=True)
class ControllerContext:
    slo_ttft_ms: float
    max_allowance: int  # the batch job's demand at the start (a sensible ceiling)
    engine_max_running: int
    # Where the card's clocks start to fall for heat (the lower of its target temperature
    # and GPU_MAX), as the daemon finds it from NVML's thresholds (nvml/thresholds.py).
    temp_onset_c: float | None = None
    # The lab's gateway holds batch under the engine's slots (`World(hold_slots=True)`).
    hold_slots: bool = False


class Controller(Protocol):
    interval_s: float

    def decide(self, now_s: float, obs: Observation) -> int | None: ...


ControllerFactory = Callable[[str | None, ControllerContext], Controller]


class NoControl:
    """No allowance: every stream the batch job wants runs."""

    interval_s = 60.0

    def decide(self, now_s: float, obs: Observation) -> int | None:
        return None


class StaticAllowance:
    """A fixed allowance, set once."""

    interval_s = 60.0

    def __init__(self, allowance: int) -> None:
        self.allowance = allowance

    def decide(self, now_s: float, obs: Observation) -> int | None:
        return self.allowance


def _none(arg: str | None, ctx: ControllerContext) -> Controller:
    if arg:
        raise ControllerError(f"controller 'none' takes no argument, got 'none:{arg}'")
    return NoControl()


def _static(arg: str | None, ctx: ControllerContext) -> Controller:
    try:
        n = int(arg or "")
    except ValueError:
        n = -1
    if n < 0:
        raise ControllerError(
            f"controller 'static' needs a whole number ≥ 0, e.g. static:4 (got {arg!r})"
        )
    return StaticAllowance(n)


# The project's own controllers are named by import string, as uvicorn names its protocols:
# the lab loads the allowance law only when a run asks for it, and needs no import of it.
_REGISTRY: dict[str, ControllerFactory | str] = {
    "none": _none,
    "static": _static,
    "ours": "llm_watchdog.sim.law:ours",
    "design": "llm_watchdog.sim.law:design",
    "aimd": "llm_watchdog.sim.law:aimd",
    "gradient2": "llm_watchdog.sim.law:gradient2",
}


def register_controller(name: str, factory: ControllerFactory | str) -> None:
    """Make `factory` (or a `package.module:attribute` naming it) available as `--controller
    name[:ARG]`."""
    if not name or ":" in name or "." in name:
        raise ControllerError(f"controller name {name!r} must be a plain word")
    _REGISTRY[name] = factory


def controller_names() -> list[str]:
    return sorted(_REGISTRY)


def _resolve(spec: str, path: str) -> ControllerFactory:
    module, _, attr = path.partition(":")
    try:
        factory: ControllerFactory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ControllerError(f"controller {spec!r}: cannot load {module}:{attr} ({exc})") from exc
    return factory


def make_controller(spec: str, ctx: ControllerContext) -> Controller:
    """`none`, `static:4`, a registered `name[:ARG]`, or `package.module:factory[:ARG]`."""
    name, _, arg = spec.partition(":")
    if "." in name:
        attr, _, arg = arg.partition(":")
        factory = _resolve(spec, f"{name}:{attr}")
    elif name in _REGISTRY:
        entry = _REGISTRY[name]
        factory = _resolve(spec, entry) if isinstance(entry, str) else entry
    else:
        raise ControllerError(
            f"unknown controller {name!r} (known: {', '.join(controller_names())}; "
            "or give package.module:factory)"
        )
    return factory(arg or None, ctx)
