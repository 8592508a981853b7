"""A pynvml-compatible module object over simulated GPUs.

The project's NVML reader (watchdog/nvml/reader.py) takes an NVML module as a parameter; hand it a
`FakeNvml` and it reads a simulated card exactly as it reads a real one: the same function
names and argument conventions, the real pynvml constants, `NVMLError` class and error codes
(pynvml imports without a GPU), the real ctypes structures for utilisation and violation
time, milliwatts for power, MHz for clocks, ns for violation time.

Each read first brings the simulated card to "now" on the clock the fake was given (seconds
since the lab started: the real clock for serving, the virtual one for benchmarks). A
function the fake does not implement raises NVML_ERROR_NOT_SUPPORTED, as a real driver does
for a field a card lacks. `fail(name, code)` makes one function raise a given error (tests
of a lost GPU, a field gone missing).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pynvml

from llm_watchdog.sim.gpu import GpuSnapshot, SimGpu
from llm_watchdog.sim.scenario import GpuParams

NVMLError = pynvml.NVMLError

# nvml.h nvmlTemperatureThresholds_t -> the names scenarios use (NVML_THRESHOLDS).
_THRESHOLD_NAMES = {
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
    pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max",
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
    pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN: "acoustic_min",
    pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR: "acoustic_curr",
    pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX: "acoustic_max",
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPS_CURR: "gps_curr",
}


class SimDevice(Protocol):
    """A simulated card the fake can read."""

    params: GpuParams

    def read(self, now_s: float) -> GpuSnapshot: ...


class StandaloneDevice:
    """A `SimGpu` under a load set from outside, advanced to each read's time."""

    def __init__(self, params: GpuParams, load: float = 0.0, start_s: float = 0.0) -> None:
        self.params = params
        self.gpu = SimGpu(params)
        self.load = load
        self._t = start_s
        self._lock = threading.Lock()

    def set_load(self, load: float, now_s: float) -> None:
        with self._lock:
            self._advance(now_s)
            self.load = load

    def _advance(self, now_s: float) -> None:
        if now_s > self._t:
            self.gpu.step(now_s - self._t, self.load)
            self._t = now_s

    def read(self, now_s: float) -> GpuSnapshot:
        with self._lock:
            self._advance(now_s)
            return self.gpu.snapshot()


class _Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<sim nvmlDevice {self.index}>"


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Module-like: `nvml = FakeNvml([device], clock)`, then use it as `pynvml`."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        devices: Sequence[SimDevice],
        clock: Callable[[], float],
        driver_version: str | None = None,
    ) -> None:
        self._devices = list(devices)
        self._clock = clock
        self._driver = driver_version or (
            self._devices[0].params.driver_version if self._devices else "550.54.15"
        )
        self._init_count = 0
        self._pids: dict[int, list[int]] = {}
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes come from the real module, so code comparing
        # `exc.value == nvml.NVML_ERROR_GPU_IS_LOST` works unchanged.
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks", "c_nvml")):
            return getattr(pynvml, name)
        if name.startswith("nvml") and hasattr(pynvml, name):

            def unsupported(*args: Any, **kwargs: Any) -> Any:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

            unsupported.__name__ = name
            return unsupported
        raise AttributeError(name)

    # -- faults -------------------------------------------------------------------------------

    def fail(self, name: str, code: int | None) -> None:
        """Make function `name` raise NVMLError(code) from now on; None heals it."""
        with self._lock:
            if code is None:
                self._failures.pop(name, None)
            else:
                self._failures[name] = code

    def set_compute_pids(self, index: int, pids: Sequence[int]) -> None:
        """The processes `nvmlDeviceGetComputeRunningProcesses` lists on GPU `index`."""
        with self._lock:
            self._pids[index] = list(pids)

    def _enter(self, name: str) -> None:
        code = self._failures.get(name)
        if code is not None:
            raise _error(code)
        if self._init_count <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _read(self, name: str, handle: Any) -> tuple[SimDevice, GpuSnapshot]:
        self._enter(name)
        dev = self._device(handle)
        return dev, dev.read(self._clock())

    def _device(self, handle: Any) -> SimDevice:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self._devices):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._devices[handle.index]

    # -- session ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        code = self._failures.get("nvmlInit")
        if code is not None:
            raise _error(code)
        with self._lock:
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int = 0) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        with self._lock:
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self._driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return "12." + self._driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._devices):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, dev in enumerate(self._devices):
            if dev.params.uuid == text:
                return _Handle(i)
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex")
        self._device(handle)
        return int(handle.index)

    # -- fixed facts --------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetName")
        return self._device(handle).params.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        return self._device(handle).params.uuid

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        """Every threshold of nvml.h; the ones the card leaves unsupported raise NOT_SUPPORTED."""
        self._enter("nvmlDeviceGetTemperatureThreshold")
        p = self._device(handle).params
        name = _THRESHOLD_NAMES.get(threshold)
        if name is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        values: dict[str, float | None] = {
            "shutdown": p.temp_shutdown_c,
            "slowdown": p.temp_slowdown_c,
            "mem_max": p.temp_mem_max_c,
            "gpu_max": p.temp_max_operating_c,
            "acoustic_min": p.temp_target_min_c,
            "acoustic_curr": p.temp_target_c,
            "acoustic_max": p.temp_target_max_c,
            "gps_curr": None,  # GPU Performance Boost: not modelled
        }
        value = values[name]
        if value is None or name in p.unsupported_thresholds():
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(value)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo")
        p = self._device(handle).params
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return round(p.sm_clock_max_mhz)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return round(p.mem_clock_max_mhz)
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPowerManagementDefaultLimit")
        return round(self._device(handle).params.power_default_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints")
        p = self._device(handle).params
        return [round(p.power_idle_w * 2000), round(max(p.power_max_w, p.power_limit_w) * 1000)]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo")
        total = int(self._device(handle).params.memory_total_mib * 1024 * 1024)
        used = int(total * 0.9)  # an engine pre-allocates its KV cache at start
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    # -- live readings ------------------------------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            self._enter("nvmlDeviceGetTemperature")
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(self._read("nvmlDeviceGetTemperature", handle)[1].temp_c)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: Any = None) -> int:
        return self.nvmlDeviceGetTemperature(handle, sensor)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        _, s = self._read("nvmlDeviceGetClockInfo", handle)
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return round(s.sm_clock_mhz)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return round(s.mem_clock_mhz)
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetClock(self, handle: Any, clock_type: int, clock_id: int) -> int:
        if clock_id == pynvml.NVML_CLOCK_ID_CURRENT:
            return self.nvmlDeviceGetClockInfo(handle, clock_type)
        return self.nvmlDeviceGetMaxClockInfo(handle, clock_type)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return round(self._read("nvmlDeviceGetPowerUsage", handle)[1].power_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return round(self._read("nvmlDeviceGetEnforcedPowerLimit", handle)[1].power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self.nvmlDeviceGetEnforcedPowerLimit(handle)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._read("nvmlDeviceGetTotalEnergyConsumption", handle)[1].energy_mj

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        _, s = self._read("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=round(s.util_gpu_pct), memory=round(s.util_mem_pct))

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        dev, snap = self._read("nvmlDeviceGetFanSpeed", handle)
        if not dev.params.has_fan:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return round(snap.fan_pct)

    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: int) -> int:
        if fan != 0:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.nvmlDeviceGetFanSpeed(handle)

    def nvmlDeviceGetNumFans(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetNumFans")
        return 1 if self._device(handle).params.has_fan else 0

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return self._read("nvmlDeviceGetPerformanceState", handle)[1].pstate

    def nvmlDeviceGetPowerState(self, handle: Any) -> int:
        return self.nvmlDeviceGetPerformanceState(handle)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._read("nvmlDeviceGetCurrentClocksEventReasons", handle)[1].reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._read("nvmlDeviceGetCurrentClocksThrottleReasons", handle)[1].reasons

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetSupportedClocksEventReasons")
        return 0x1 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80

    nvmlDeviceGetSupportedClocksThrottleReasons = nvmlDeviceGetSupportedClocksEventReasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        dev = self._device(handle)
        used = int(dev.params.memory_total_mib * 1024 * 1024 * 0.9)
        with self._lock:
            pids = list(self._pids.get(handle.index, ()))
        # nvmlProcessInfo_t: pid, usedGpuMemory (bytes); the KV cache takes most of the card.
        return [pynvml.c_nvmlProcessInfo_t(pid=pid, usedGpuMemory=used) for pid in pids]

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        now = self._clock()
        _, s = self._read("nvmlDeviceGetViolationStatus", handle)
        if policy == pynvml.NVML_PERF_POLICY_THERMAL:
            ns = s.thermal_violation_ns
        elif policy == pynvml.NVML_PERF_POLICY_POWER:
            ns = s.power_violation_ns
        else:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # nvml.h nvmlViolationTime_t: referenceTime is a CPU timestamp in µs, violationTime ns
        return pynvml.c_nvmlViolationTime_t(referenceTime=round(now * 1e6), violationTime=ns)


def standalone_nvml(params: GpuParams, clock: Callable[[], float], load: float = 0.0) -> FakeNvml:
    """A fake NVML over one card under a fixed load (tests, quick looks)."""
    return FakeNvml([StandaloneDevice(params, load)], clock)


def two_gpu_nvml(
    params: GpuParams, clock: Callable[[], float], load: float = 1.0
) -> tuple[FakeNvml, list[StandaloneDevice]]:
    """Two cards serving one engine (tensor parallel) under the same load; only the second
    overheats: its cooler is clogged (twice the thermal resistance) and it reports no target
    temperature, so its clocks fall at GPU_MAX. Both list pid 4242 as a compute process."""
    first = dataclasses.replace(params, name=params.name + " #0", uuid=params.uuid[:-1] + "0")
    second = dataclasses.replace(
        params,
        name=params.name + " #1",
        uuid=params.uuid[:-1] + "1",
        thermal_resistance_c_per_w=2.0 * params.thermal_resistance_c_per_w,
        thermal_resistance_fan_min_c_per_w=2.0 * params.thermal_resistance_fan_min_c_per_w,
        temp_target_c=None,
        temp_target_min_c=None,
        temp_target_max_c=None,
    )
    now = clock()
    devices = [StandaloneDevice(first, load, now), StandaloneDevice(second, load, now)]
    nvml = FakeNvml(devices, clock)
    for i in range(2):
        nvml.set_compute_pids(i, [TWO_GPU_ENGINE_PID])
    return nvml, devices


TWO_GPU_ENGINE_PID = 4242
