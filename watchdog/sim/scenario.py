"""Heat-lab scenarios: a TOML file → a validated, frozen `Scenario`.

A scenario describes one card in one room serving one engine to two kinds of traffic. Every
physical number is a named key whose name carries its unit (`ambient_c`, `power_limit_w`,
`prefill_token_ms`). The shipped files live in `data/scenarios/` (found through
`llm_watchdog.resources.bundled_dir("scenarios")`) and each one documents its keys in its header.

A file may start from another with `base = "workstation"`: the base is loaded first and the
file's tables are laid over it key by key; `[[schedule]]` replaces the base's schedule.

Every error is a `ScenarioError` whose one-line message names the file and the key and says
what was expected, e.g. `consumer.toml: key 'gpu.ambient_c': expected a number (°C), got 'hot'`.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from llm_watchdog.errors import ConfigError
from llm_watchdog.resources import bundled_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ScenarioError(ConfigError, ValueError):
    """A scenario that cannot be used; the message is one line naming the file and key."""


# NVML's temperature thresholds (nvml.h nvmlTemperatureThresholds_t), as scenario keys name
# them in `nvml_unsupported_thresholds`.
NVML_THRESHOLDS = (
    "shutdown",
    "slowdown",
    "mem_max",
    "gpu_max",
    "acoustic_min",
    "acoustic_curr",
    "acoustic_max",
    "gps_curr",
)


@dataclass(frozen=True)
class GpuParams:
    """One simulated card. See watchdog/sim/gpu.py for how each number is used."""

    name: str = "NVIDIA Simulated GPU"
    uuid: str = "GPU-00000000-0000-4000-8000-000000000000"
    driver_version: str = "550.54.15"
    memory_total_mib: float = 24576.0
    has_fan: bool = True  # False: NVML answers NOT_SUPPORTED for fan speed (passive cards)
    ambient_c: float = 25.0
    initial_temp_c: float | None = None  # None: starts at ambient
    thermal_resistance_c_per_w: float = 0.20  # heatsink to air at 100 % fan
    thermal_resistance_fan_min_c_per_w: float = 0.30  # at the curve's lowest fan speed
    thermal_time_constant_s: float = 180.0  # R·C at 100 % fan
    fan_curve_c_pct: tuple[tuple[float, float], ...] = ((30.0, 30.0), (60.0, 50.0), (80.0, 100.0))
    power_idle_w: float = 30.0
    power_max_w: float = 300.0  # full load at the max boost clock, before the cap
    power_limit_w: float = 250.0  # enforced limit
    power_limit_default_w: float | None = None  # None: same as power_limit_w
    voltage_min_ratio: float = 0.75  # core voltage at the min clock / at the max clock
    sm_clock_max_mhz: float = 1980.0
    sm_clock_base_mhz: float = 1500.0
    sm_clock_min_mhz: float = 600.0
    sm_clock_idle_mhz: float = 210.0
    clock_bin_mhz: float = 15.0
    boost_temp_c: float = 50.0  # boost bins start stepping down above this
    boost_bin_step_c: float = 5.0  # one bin less per this many degrees above boost_temp_c
    temp_max_operating_c: float = 83.0  # NVML GPU_MAX: software thermal slowdown holds this
    temp_slowdown_c: float = 90.0  # NVML SLOWDOWN: hardware slowdown engages
    temp_shutdown_c: float = 95.0  # NVML SHUTDOWN
    # NVML ACOUSTIC_CURR, the "GPU Target Temperature": when set, software slowdown holds the
    # lower of it and GPU_MAX. None: the card reports no target (NOT_SUPPORTED).
    temp_target_c: float | None = None
    temp_target_min_c: float | None = None  # NVML ACOUSTIC_MIN / ACOUSTIC_MAX: the range a
    temp_target_max_c: float | None = None  # user may set the target within; None: unsupported
    temp_mem_max_c: float | None = None  # NVML MEM_MAX (HBM cards); None: unsupported
    # Thresholds this card answers NOT_SUPPORTED for, comma-separated, from NVML_THRESHOLDS
    # ("gpu_max,slowdown": a card that reports only SHUTDOWN). The physics is unchanged.
    nvml_unsupported_thresholds: str = ""
    sw_slowdown_hysteresis_c: float = 3.0
    sw_slowdown_slew_mhz_per_s: float = 60.0
    hw_slowdown_hysteresis_c: float = 5.0
    hw_slowdown_clock_ratio: float = 0.5  # "by a factor of 2 or more" (nvml.h)
    mem_clock_max_mhz: float = 10501.0
    mem_clock_idle_mhz: float = 405.0
    mem_util_full_load_pct: float = 60.0

    @property
    def sw_hold_c(self) -> float:
        """The temperature software thermal slowdown holds: the target, or GPU_MAX."""
        if self.temp_target_c is None:
            return self.temp_max_operating_c
        return min(self.temp_target_c, self.temp_max_operating_c)

    def unsupported_thresholds(self) -> set[str]:
        return {n.strip() for n in self.nvml_unsupported_thresholds.split(",") if n.strip()}

    @property
    def power_default_w(self) -> float:
        return (
            self.power_limit_default_w
            if self.power_limit_default_w is not None
            else (self.power_limit_w)
        )


@dataclass(frozen=True)
class EngineParams:
    """A continuous-batching engine. See watchdog/sim/engine.py for the step-time model."""

    engine: str = "vllm"  # the engine the lab poses as: "vllm" or "llama.cpp"
    model: str = "sim-model"
    max_running_seqs: int = 64
    max_batch_tokens: int = 2048  # tokens in one step: vLLM max_num_batched_tokens, llama.cpp -b
    scheduling: str = "fcfs"  # "fcfs" or "priority" (vLLM: lower value first)
    step_base_ms: float = 12.0
    decode_token_ms: float = 0.25  # per running sequence in a step
    prefill_token_ms: float = 0.08
    kv_read_ms_per_ktoken: float = 0.02  # per 1000 context tokens held by sequences in the step
    clock_bound_fraction: float = 1.0  # share of step time that scales with 1/SM clock
    request_overhead_ms: float = 2.0  # tokenising, templating, queue hand-off
    chars_per_token: float = 4.0
    prefix_cache: bool = False  # a prompt equal to a recent one prefills one token
    load_min: float = 0.35  # GPU load (0..1) of a step with one token
    load_full_batch_tokens: float = 256.0  # tokens in a step at which the GPU is fully loaded


@dataclass(frozen=True)
class ClassTraffic:
    """One traffic class. Chat uses the arrival keys, batch the stream keys."""

    arrivals_per_s: float = 0.0  # chat: Poisson rate between bursts
    burst_every_s: float = 0.0  # chat: 0 = no bursts
    burst_duration_s: float = 0.0
    burst_multiplier: float = 1.0  # arrival rate × this during a burst
    streams: int = 0  # batch: how many requests the job wants in flight (its demand)
    think_time_s: float = 0.0  # batch: client time between a stream's requests
    max_requests_per_s: float = 0.0  # batch: the job's own pace (0 = as fast as answered)
    prompt_tokens_min: int = 50
    prompt_tokens_max: int = 50
    output_tokens_min: int = 50
    output_tokens_max: int = 50
    priority: int = 0


@dataclass(frozen=True)
class ScheduleEvent:
    """A change at `at_s` seconds after the start. None means "leave as it is"."""

    at_s: float
    ambient_c: float | None = None
    power_limit_w: float | None = None
    batch_streams: int | None = None
    chat_arrivals_per_s: float | None = None
    power_brake: bool | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    path: Path | None = None
    duration_s: float = 7200.0
    slo_chat_ttft_p95_ms: float = 1000.0
    gpu: GpuParams = field(default_factory=GpuParams)
    engine: EngineParams = field(default_factory=EngineParams)
    chat: ClassTraffic = field(default_factory=ClassTraffic)
    batch: ClassTraffic = field(default_factory=ClassTraffic)
    schedule: tuple[ScheduleEvent, ...] = ()

    def compressed(self, time_scale: float) -> Scenario:
        """The same scenario with its slow physics `time_scale` times faster.

        The thermal time constant, the thermal controller's slew and the schedule are
        compressed, so a card that takes 20 minutes to heat does so in 20/time_scale; traffic
        and the engine keep real time, so latencies a client measures stay true.
        """
        if time_scale <= 0:
            raise ScenarioError(f"time scale must be > 0, got {time_scale:g}")
        if time_scale == 1.0:
            return self
        gpu = dataclasses.replace(
            self.gpu,
            thermal_time_constant_s=self.gpu.thermal_time_constant_s / time_scale,
            sw_slowdown_slew_mhz_per_s=self.gpu.sw_slowdown_slew_mhz_per_s * time_scale,
        )
        schedule = tuple(dataclasses.replace(e, at_s=e.at_s / time_scale) for e in self.schedule)
        return dataclasses.replace(
            self, gpu=gpu, schedule=schedule, duration_s=self.duration_s / time_scale
        )


# -- loading ----------------------------------------------------------------------------------

_TOP_KEYS = {"name", "description", "base", "duration_s", "slo_chat_ttft_p95_ms"}
_TABLES = {"gpu": GpuParams, "engine": EngineParams}
_UNITS = {
    "_c": "°C",
    "_w": "W",
    "_s": "s",
    "_ms": "ms",
    "_mhz": "MHz",
    "_pct": "%",
    "_mib": "MiB",
    "_ratio": "ratio",
    "_fraction": "fraction",
    "_per_s": "per second",
}
_CHOICES = {"engine.engine": ("vllm", "llama.cpp"), "engine.scheduling": ("fcfs", "priority")}


# Bundled cards that `llm-watchdog demo` (and `sim serve`) play with traffic from real clients:
# they carry no chat of their own for `sim run` or `sim sweep` to judge.
PLAYED_LIVE = ("demo", "heat-and-load")


def available_scenarios() -> list[str]:
    """Names of the bundled scenarios."""
    return sorted(p.stem for p in bundled_dir("scenarios").glob("*.toml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a bundled scenario by name, or a scenario file by path."""
    return _load(_find(str(name_or_path)), seen=())


def _find(name_or_path: str) -> Path:
    if "/" in name_or_path or name_or_path.endswith(".toml"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ScenarioError(f"{path}: scenario file not found")
        return path
    path = bundled_dir("scenarios") / f"{name_or_path}.toml"
    if not path.is_file():
        known = ", ".join(available_scenarios()) or "none"
        raise ScenarioError(
            f"scenario {name_or_path!r} not found (known: {known}); give a name or a .toml path"
        )
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from exc


def _load(path: Path, seen: tuple[Path, ...]) -> Scenario:
    doc = _read(path)
    where = path.name
    unknown = sorted(set(doc) - _TOP_KEYS - {"gpu", "engine", "traffic", "schedule"})
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key {unknown[0]!r} at top level "
            f"(expected: {', '.join(sorted(_TOP_KEYS | {'gpu', 'engine', 'traffic', 'schedule'}))})"
        )
    base: Scenario | None = None
    if "base" in doc:
        base_name = doc["base"]
        if not isinstance(base_name, str):
            raise ScenarioError(f"{where}: key 'base': expected a scenario name, got {base_name!r}")
        base_path = path.parent / f"{base_name}.toml"
        if not base_path.is_file():
            base_path = _find(base_name)
        if base_path.resolve() in seen or base_path.resolve() == path.resolve():
            raise ScenarioError(f"{where}: key 'base': {base_name!r} leads back to this file")
        base = _load(base_path, (*seen, path.resolve()))
    start = base or Scenario(name=path.stem)
    gpu = _table(doc.get("gpu", {}), start.gpu, "gpu", where)
    engine = _table(doc.get("engine", {}), start.engine, "engine", where)
    traffic = doc.get("traffic", {})
    if not isinstance(traffic, dict):
        raise ScenarioError(
            f"{where}: key 'traffic': expected tables [traffic.chat], [traffic.batch]"
        )
    extra = sorted(set(traffic) - {"chat", "batch"})
    if extra:
        raise ScenarioError(f"{where}: unknown key 'traffic.{extra[0]}' (expected: chat, batch)")
    chat = _table(traffic.get("chat", {}), start.chat, "traffic.chat", where)
    batch = _table(traffic.get("batch", {}), start.batch, "traffic.batch", where)
    schedule = start.schedule
    if "schedule" in doc:
        schedule = _schedule(doc["schedule"], where)
    scenario = Scenario(
        name=_str(doc.get("name", path.stem), "name", where),
        description=_str(doc.get("description", start.description), "description", where),
        path=path,
        duration_s=_number(doc.get("duration_s", start.duration_s), "duration_s", where, 1.0),
        slo_chat_ttft_p95_ms=_number(
            doc.get("slo_chat_ttft_p95_ms", start.slo_chat_ttft_p95_ms),
            "slo_chat_ttft_p95_ms",
            where,
            1.0,
        ),
        gpu=gpu,
        engine=engine,
        chat=chat,
        batch=batch,
        schedule=schedule,
    )
    _check(scenario, where)
    return scenario


def _table(raw: Any, start: Any, prefix: str, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: key {prefix!r}: expected a table [{prefix}]")
    known = {f.name: f for f in fields(start)}
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"{prefix}.{key}"
        if key not in known:
            raise ScenarioError(
                f"{where}: unknown key {full!r} (expected one of: {', '.join(sorted(known))})"
            )
        current = getattr(start, key)
        changes[key] = _coerce(value, current, known[key].type, full, where)
    return dataclasses.replace(start, **changes)


def _coerce(value: Any, current: Any, type_name: Any, key: str, where: str) -> Any:
    t = str(type_name)
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            choices = " or ".join(repr(c) for c in _CHOICES[key])
            raise ScenarioError(f"{where}: key {key!r}: expected {choices}, got {value!r}")
        return value
    if t.startswith("str"):
        return _str(value, key, where)
    if t.startswith("bool"):
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: key {key!r}: expected true or false, got {value!r}")
        return value
    if t.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ScenarioError(f"{where}: key {key!r}: expected a whole number ≥ 0, got {value!r}")
        return value
    if t.startswith("tuple"):
        return _curve(value, key, where)
    return _number(value, key, where, 0.0)


def _unit(key: str) -> str:
    for suffix, unit in _UNITS.items():
        if key.endswith(suffix):
            return f" ({unit})"
    return ""


def _number(value: Any, key: str, where: str, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{where}: key {key!r}: expected a number{_unit(key)}, got {value!r}")
    if value < minimum:
        raise ScenarioError(
            f"{where}: key {key!r}: expected a number ≥ {minimum:g}{_unit(key)}, got {value!r}"
        )
    return float(value)


def _str(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: key {key!r}: expected a string, got {value!r}")
    return value


def _curve(value: Any, key: str, where: str) -> tuple[tuple[float, float], ...]:
    ok = (
        isinstance(value, list)
        and len(value) >= 1
        and all(
            isinstance(p, list)
            and len(p) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)
            for p in value
        )
    )
    if not ok:
        raise ScenarioError(
            f"{where}: key {key!r}: expected a list of [temp_c, fan_pct] pairs, got {value!r}"
        )
    points = tuple((float(t), float(p)) for t, p in value)
    if any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        raise ScenarioError(f"{where}: key {key!r}: temperatures must rise from point to point")
    if any(not 0 <= p <= 100 for _, p in points):
        raise ScenarioError(f"{where}: key {key!r}: fan speeds must be within 0..100 %")
    return points


def _schedule(raw: Any, where: str) -> tuple[ScheduleEvent, ...]:
    if not isinstance(raw, list):
        raise ScenarioError(f"{where}: key 'schedule': expected [[schedule]] tables")
    known = {f.name: f for f in fields(ScheduleEvent)}
    events: list[ScheduleEvent] = []
    for n, item in enumerate(raw, start=1):
        if not isinstance(item, dict) or "at_s" not in item:
            raise ScenarioError(f"{where}: schedule #{n}: expected a table with 'at_s' (s)")
        values: dict[str, Any] = {}
        for key, value in item.items():
            full = f"schedule[{n}].{key}"
            if key not in known:
                raise ScenarioError(
                    f"{where}: unknown key {full!r} (expected one of: {', '.join(sorted(known))})"
                )
            if key == "power_brake":
                values[key] = _coerce(value, None, "bool", full, where)
            elif key == "batch_streams":
                values[key] = _coerce(value, None, "int", full, where)
            else:
                values[key] = _number(value, full, where, 0.0 if key != "ambient_c" else -40.0)
        if len(values) == 1:
            raise ScenarioError(f"{where}: schedule #{n}: at {values['at_s']:g} s nothing changes")
        events.append(ScheduleEvent(**values))
    return tuple(sorted(events, key=lambda e: e.at_s))


def _check(s: Scenario, where: str) -> None:
    """Relations between keys that a single value cannot show."""
    g, e = s.gpu, s.engine

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise ScenarioError(f"{where}: key {key!r}: {what}")

    need(g.thermal_resistance_c_per_w > 0, "gpu.thermal_resistance_c_per_w", "must be > 0 °C/W")
    need(
        g.thermal_resistance_fan_min_c_per_w >= g.thermal_resistance_c_per_w,
        "gpu.thermal_resistance_fan_min_c_per_w",
        "must be ≥ gpu.thermal_resistance_c_per_w (a slower fan cools less)",
    )
    need(g.thermal_time_constant_s > 0, "gpu.thermal_time_constant_s", "must be > 0 s")
    need(
        g.sm_clock_idle_mhz <= g.sm_clock_min_mhz <= g.sm_clock_base_mhz <= g.sm_clock_max_mhz,
        "gpu.sm_clock_base_mhz",
        "clocks must satisfy idle ≤ min ≤ base ≤ max (MHz)",
    )
    need(g.clock_bin_mhz > 0, "gpu.clock_bin_mhz", "must be > 0 MHz")
    need(g.boost_bin_step_c > 0, "gpu.boost_bin_step_c", "must be > 0 °C")
    need(
        g.temp_max_operating_c <= g.temp_slowdown_c <= g.temp_shutdown_c,
        "gpu.temp_slowdown_c",
        "thresholds must satisfy max_operating ≤ slowdown ≤ shutdown (°C)",
    )
    need(
        g.temp_target_c is None or g.temp_target_c <= g.temp_slowdown_c,
        "gpu.temp_target_c",
        "the target temperature must be ≤ gpu.temp_slowdown_c (°C)",
    )
    odd = sorted(g.unsupported_thresholds() - set(NVML_THRESHOLDS))
    need(
        not odd,
        "gpu.nvml_unsupported_thresholds",
        f"unknown threshold {odd[0] if odd else ''!r} (expected names from: "
        f"{', '.join(NVML_THRESHOLDS)})",
    )
    need(g.power_idle_w < g.power_max_w, "gpu.power_max_w", "must be above gpu.power_idle_w (W)")
    need(g.power_limit_w > g.power_idle_w, "gpu.power_limit_w", "must be above gpu.power_idle_w")
    need(0 < g.voltage_min_ratio <= 1, "gpu.voltage_min_ratio", "must be within (0, 1]")
    need(0 < g.hw_slowdown_clock_ratio <= 1, "gpu.hw_slowdown_clock_ratio", "must be in (0, 1]")
    need(e.max_running_seqs >= 1, "engine.max_running_seqs", "must be ≥ 1")
    need(
        e.max_batch_tokens > e.max_running_seqs,
        "engine.max_batch_tokens",
        "must exceed engine.max_running_seqs (every running sequence decodes one token a step)",
    )
    need(0 <= e.clock_bound_fraction <= 1, "engine.clock_bound_fraction", "must be within 0..1")
    need(0 < e.load_min <= 1, "engine.load_min", "must be within (0, 1]")
    need(e.chars_per_token > 0, "engine.chars_per_token", "must be > 0")
    need(e.step_base_ms > 0, "engine.step_base_ms", "must be > 0 ms")
    for cls_name, c in (("chat", s.chat), ("batch", s.batch)):
        need(
            1 <= c.prompt_tokens_min <= c.prompt_tokens_max,
            f"traffic.{cls_name}.prompt_tokens_max",
            "need 1 ≤ prompt_tokens_min ≤ prompt_tokens_max",
        )
        need(
            1 <= c.output_tokens_min <= c.output_tokens_max,
            f"traffic.{cls_name}.output_tokens_max",
            "need 1 ≤ output_tokens_min ≤ output_tokens_max",
        )
    need(
        s.chat.burst_every_s == 0 or s.chat.burst_duration_s < s.chat.burst_every_s,
        "traffic.chat.burst_duration_s",
        "must be shorter than traffic.chat.burst_every_s",
    )
