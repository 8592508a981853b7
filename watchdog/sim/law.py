"""The controllers of `llm_watchdog.control.law` and `llm_watchdog.control.baselines` in the lab.

The lab's protocol (watchdog/sim/controllers.py) is `interval_s` and
`decide(now_s, Observation) -> allowance`; ours is `step(ControlInput) -> ControlAction`.
`SimController` is the adapter between them and keeps every action, so a benchmark can count
kinds and read reasons afterwards.

Names, for `llm-watchdog sim run --controller NAME[:ARG]` (the lab's registry names each by
import string, so the lab needs no import of this module), or as
`llm_watchdog.sim.law:NAME[:ARG]`:

    ours[:k=v,...]       the allowance law with its additions (ControlConfig keys may be set)
    design[:k=v,...]     the starting-point law as written (docs/control.md) (every addition off)
    aimd[:INTERVAL_S]    halve on a violating interval, +1 otherwise (default 10 s)
    gradient2[:QUEUE]    Netflix Gradient2Limit, queueSize QUEUE (default 4)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from llm_watchdog.control.baselines import AimdController, Gradient2Controller
from llm_watchdog.control.law import (
    AllowanceController,
    ControlAction,
    ControlConfig,
    ControlInput,
    GpuState,
    design_law,
)
from llm_watchdog.sim.controllers import (
    ControllerContext,
    ControllerError,
    Observation,
    register_controller,
)

# One decision per simulated second, as the daemon's default `control.interval`: a chat burst
# is a cliff seconds after it starts, and a surge must be confirmed within its first seconds.
INTERVAL_S = 1.0


class Stepper(Protocol):
    def step(self, inp: ControlInput) -> ControlAction: ...


class SimController:
    """Any `step(ControlInput)` controller as a heat-lab controller."""

    def __init__(
        self, inner: Stepper, interval_s: float = INTERVAL_S, onset_c: float | None = None
    ) -> None:
        self.inner = inner
        self.interval_s = interval_s
        self.onset_c = onset_c  # where the clocks start to fall (None: NVML's SLOWDOWN)
        self.actions: list[ControlAction] = []

    def decide(self, now_s: float, obs: Observation) -> int | None:
        g = obs.gpu
        inp = ControlInput(
            now_s=now_s,
            chat_ttfts_ms=obs.chat_ttfts_ms,
            gpu=GpuState(
                g.throttle_reasons,
                g.sm_clock_mhz,
                g.sm_clock_max_mhz,
                temp_c=g.temp_c,
                temp_slowdown_c=self.onset_c if self.onset_c is not None else g.temp_slowdown_c,
            ),
            batch_inflight=obs.batch_inflight,
            allowance=obs.allowance,
            chat_arrivals=obs.chat_arrivals,
            chat_inflight=obs.chat_inflight,
            batch_queued=obs.batch_waiting,
        )
        action = self.inner.step(inp)
        self.actions.append(action)
        return action.allowance_after


# The ControlConfig fields that design_law() turns off.
ADDITIONS = (
    "freeze",
    "window_s",
    "surge_ratio",
    "app_limited_headroom",
    "grow_fast_below",
    "cut_from_running",
    "grow_ratio",
    "ewma_alpha",
    "slot_reserve",
    "slot_margin",
    "slot_peak_s",
    "serving_ramps",
    "serving_slots",
    "grow_to_demand",
    "max_grows_per_h",
    "surge_heat_factor",
    "surge_level_minutes",
    "surge_cap_retest_s",
    "headroom",
    "cut_memory_s",
    "clock_fall_cut",
    "map_fail_cap",
    "map_fail_cap_seed",
)


def sim_config(ctx: ControllerContext, overrides: dict[str, Any] | None = None) -> ControlConfig:
    """ControlConfig's defaults, with the lab's target, and the engine's slots as ceiling."""
    ceiling = max(1, ctx.engine_max_running)
    values: dict[str, Any] = {
        "target_p95_ms": ctx.slo_ttft_ms,
        "ceiling": ceiling,
        "default_allowance": min(4, ceiling),
        "engine_slots": ctx.engine_max_running,
        "serving_ramps": True,  # the lab's gateway ramps a raise, as the real one does
        "serving_slots": ctx.hold_slots,
    }
    values.update(overrides or {})
    return ControlConfig(**values)


def parse_overrides(arg: str | None, name: str) -> dict[str, Any]:
    """`k=v,k=v` → typed ControlConfig overrides; one-line errors naming the key."""
    if not arg:
        return {}
    types = {f.name: f.type for f in dataclasses.fields(ControlConfig)}
    out: dict[str, Any] = {}
    for part in arg.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in types:
            raise ControllerError(
                f"controller {name!r}: expected key=value pairs of ControlConfig fields, "
                f"got {part!r} (e.g. {name}:drain_time_s=20,window_s=60)"
            )
        t = str(types[key])
        try:
            if t.startswith("bool"):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1")
            elif t.startswith("int"):
                out[key] = int(raw)
            elif t.startswith("str"):
                out[key] = raw
            else:
                out[key] = float(raw)
        except ValueError:
            raise ControllerError(
                f"controller {name!r}: {key} needs a {t.split(' ')[0]}, got {raw!r}"
            ) from None
    return out


def _config(
    ctx: ControllerContext, arg: str | None, name: str, base: dict[str, Any] | None = None
) -> ControlConfig:
    overrides = {**(base or {}), **parse_overrides(arg, name)}
    try:
        return sim_config(ctx, overrides)
    except ValueError as exc:  # ControlConfig's own check, already one line
        raise ControllerError(f"controller {name!r}: {exc}") from exc


def ours(arg: str | None, ctx: ControllerContext) -> SimController:
    return SimController(AllowanceController(_config(ctx, arg, "ours")), onset_c=ctx.temp_onset_c)


def design(arg: str | None, ctx: ControllerContext) -> SimController:
    plain = dataclasses.asdict(design_law(sim_config(ctx)))
    off = {k: plain[k] for k in ADDITIONS}
    return SimController(
        AllowanceController(_config(ctx, arg, "design", off)), onset_c=ctx.temp_onset_c
    )


def aimd(arg: str | None, ctx: ControllerContext) -> SimController:
    interval = _number(arg, "aimd", 10.0, "an interval in seconds, e.g. aimd:10")
    return SimController(
        AimdController(sim_config(ctx)), interval_s=interval, onset_c=ctx.temp_onset_c
    )


def gradient2(arg: str | None, ctx: ControllerContext) -> SimController:
    queue = _number(arg, "gradient2", 4.0, "a queue size, e.g. gradient2:4")
    return SimController(
        Gradient2Controller(sim_config(ctx), queue_size=queue),
        interval_s=1.0,
        onset_c=ctx.temp_onset_c,
    )


def _number(arg: str | None, name: str, default: float, what: str) -> float:
    if not arg:
        return default
    try:
        value = float(arg)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ControllerError(f"controller {name!r} takes {what}, got {arg!r}")
    return value


FACTORIES = {"ours": ours, "design": design, "aimd": aimd, "gradient2": gradient2}


def register() -> None:
    """Name every controller here in the lab's registry (idempotent)."""
    for name, factory in FACTORIES.items():
        register_controller(name, factory)
