"""Fake pynvml module objects with named scenarios, for tests and benchmarks.

A FakeNvml instance stands where the `pynvml` module would: it carries the REAL module's
constants (NVML_*, nvmlClocks*) and error classes (NVMLError and its NVMLError_* subclasses,
so `except pynvml.NVMLError_GPUIsLost` works on what it raises), and implements the functions
llm_watchdog.nvml.reader uses (REQUIRED_NVML_FUNCTIONS) in plain Python over FakeGpu values.
Passed in,
never patched over the real module.

    from tests.helpers.fakenvml import scenario_basic
    reader = NvmlReader(nvml=scenario_basic())

Importing pynvml here is safe without a GPU: nvidia-ml-py loads libnvidia-ml only in nvmlInit.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real


@dataclass
class FakeGpu:
    """One simulated card. Units as NVML reports them: °C, MHz, mW, %, ns."""

    name: str | bytes = "NVIDIA RTX 6000 Ada Generation"
    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    temp_c: int = 52
    slowdown_c: int = 94
    shutdown_c: int = 97
    gpu_max_c: int = 89
    sm_clock_mhz: int = 2475
    sm_clock_max_mhz: int = 3105
    mem_clock_mhz: int = 10001
    mem_clock_max_mhz: int = 10001
    power_mw: int = 182_345
    power_limit_mw: int = 300_000
    power_default_limit_mw: int = 300_000
    util_gpu_pct: int = 73
    util_mem_pct: int = 41
    fan_pct: int = 46
    pstate: int = 2
    reasons: int = 0
    # Cumulative violation counters (ns) and how much each read adds: one read per sample.
    thermal_violation_ns: int = 4_000_000_000
    power_violation_ns: int = 7_000_000_000
    thermal_violation_step_ns: int = 0
    power_violation_step_ns: int = 1_500_000
    # function name -> NVML error code raised by that function on this GPU
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    temperature_reads: int = 0


@dataclass(frozen=True)
class FakeHandle:
    index: int


@dataclass(frozen=True)
class FakeUtilization:
    gpu: int
    memory: int


@dataclass(frozen=True)
class FakeViolationTime:
    referenceTime: int  # camelCase: the field names of nvmlViolationTime_t
    violationTime: int


class FakeNvml:
    """A pynvml stand-in. Every call is counted in `calls` (function name -> count).

    init_error: NVML error code nvmlInit raises (library missing, driver not loaded).
    lose_after_samples / lose_index: GPU `lose_index` is lost once it has answered that many
        temperature reads (one per sample), and comes back during the `back_after_inits`-th
        nvmlInit after the loss.
    hang_function / hang_index: the first call of that function (on that GPU, when given)
        blocks until `release` is set (at most `hang_max_s`); `hanging` is set while it blocks.
    """

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "550.54.15",
        init_error: int | None = None,
        lose_index: int = 0,
        lose_after_samples: int | None = None,
        back_after_inits: int | None = None,
        hang_function: str | None = None,
        hang_index: int | None = None,
        hang_max_s: float = 30.0,
    ) -> None:
        for name, value in vars(_real).items():
            if name.startswith(("NVML_", "NVMLError", "nvmlClocks")):
                setattr(self, name, value)
        self.gpus = gpus
        self.driver_version = driver_version
        self.init_error = init_error
        self.lose_index = lose_index
        self.lose_after_samples = lose_after_samples
        self.back_after_inits = back_after_inits
        self.inits_since_loss = 0
        self.hang_function = hang_function
        self.hang_index = hang_index
        self.hang_max_s = hang_max_s
        self.release = threading.Event()
        self.hanging = threading.Event()
        self._hung_once = False
        self.calls: Counter[str] = Counter()
        self.initialized = 0

    # -- controls for tests ------------------------------------------------------------------

    def lose(self, index: int) -> None:
        self.gpus[index].lost = True
        self.inits_since_loss = 0

    def restore(self, index: int) -> None:
        self.gpus[index].lost = False

    # -- plumbing ----------------------------------------------------------------------------

    def _enter(self, name: str, index: int | None = None) -> None:
        self.calls[name] += 1
        if (
            name == self.hang_function
            and not self._hung_once
            and (self.hang_index is None or index == self.hang_index)
        ):
            self._hung_once = True
            self.hanging.set()
            self.release.wait(self.hang_max_s)
            self.hanging.clear()
        if name not in ("nvmlInit",) and not self.initialized:
            raise self.NVMLError(self.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, name: str, handle: FakeHandle) -> FakeGpu:
        self._enter(name, handle.index)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        code = gpu.errors.get(name)
        if code is not None:
            raise self.NVMLError(code)
        return gpu

    # -- the pynvml surface ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self.initialized += 1
        if any(g.lost for g in self.gpus):
            self.inits_since_loss += 1
            if self.back_after_inits is not None and self.inits_since_loss >= self.back_after_inits:
                for gpu in self.gpus:
                    gpu.lost = False

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str | bytes:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self.gpus[handle.index]
        limit = self.lose_after_samples
        if limit is not None and handle.index == self.lose_index and not gpu.lost:
            if gpu.temperature_reads >= limit:
                self.lose(handle.index)
                self.lose_after_samples = None  # lost once; comes back through nvmlInit
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        gpu.temperature_reads += 1
        return gpu.temp_c

    def nvmlDeviceGetTemperatureThreshold(self, handle: FakeHandle, threshold: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperatureThreshold", handle)
        values = {
            self.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.slowdown_c,
            self.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.shutdown_c,
            self.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: gpu.gpu_max_c,
        }
        if threshold not in values:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return values[threshold]

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        return gpu.sm_clock_mhz if clock == self.NVML_CLOCK_SM else gpu.mem_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxClockInfo", handle)
        return gpu.sm_clock_max_mhz if clock == self.NVML_CLOCK_SM else gpu.mem_clock_max_mhz

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", handle).power_default_limit_mw

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> FakeUtilization:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return FakeUtilization(gpu=gpu.util_gpu_pct, memory=gpu.util_mem_pct)

    def nvmlDeviceGetFanSpeed(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetFanSpeed", handle).fan_pct

    def nvmlDeviceGetPerformanceState(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).reasons

    def nvmlDeviceGetViolationStatus(self, handle: FakeHandle, policy: int) -> FakeViolationTime:
        gpu = self._gpu("nvmlDeviceGetViolationStatus", handle)
        if policy == self.NVML_PERF_POLICY_THERMAL:
            gpu.thermal_violation_ns += gpu.thermal_violation_step_ns
            total = gpu.thermal_violation_ns
        elif policy == self.NVML_PERF_POLICY_POWER:
            gpu.power_violation_ns += gpu.power_violation_step_ns
            total = gpu.power_violation_ns
        else:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return FakeViolationTime(referenceTime=0, violationTime=total)


class LegacyFakeNvml(FakeNvml):
    """An older nvidia-ml-py: only nvmlDeviceGetCurrentClocksThrottleReasons exists."""

    def __getattribute__(self, name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        return super().__getattribute__(name)


# -- named scenarios ---------------------------------------------------------------------------


def _two_gpus() -> list[FakeGpu]:
    busy = FakeGpu(uuid="GPU-0b7e0c6c-5c1f-4a55-9d2b-000000000000")
    idle = FakeGpu(
        name="NVIDIA GeForce RTX 4090",
        uuid="GPU-1c8f1d7d-6d20-4b66-ae3c-111111111111",
        temp_c=38,
        slowdown_c=87,
        shutdown_c=92,
        gpu_max_c=85,
        sm_clock_mhz=210,
        sm_clock_max_mhz=3120,
        mem_clock_mhz=405,
        mem_clock_max_mhz=10501,
        power_mw=21_800,
        power_limit_mw=450_000,
        power_default_limit_mw=450_000,
        util_gpu_pct=0,
        util_mem_pct=0,
        fan_pct=30,
        pstate=8,
        reasons=_real.nvmlClocksEventReasonGpuIdle,
        power_violation_step_ns=0,
    )
    return [busy, idle]


def scenario_basic() -> FakeNvml:
    """Two healthy GPUs: 0 busy (182.345 W, P2), 1 idle (GpuIdle reason set, P8)."""
    return FakeNvml(_two_gpus())


def scenario_fields_not_supported() -> FakeNvml:
    """A consumer card whose driver gives no fan, violation or power readings."""
    missing = (
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementDefaultLimit",
    )
    gpu = FakeGpu(
        name="NVIDIA GeForce RTX 3060",
        errors={name: _real.NVML_ERROR_NOT_SUPPORTED for name in missing},
    )
    return FakeNvml([gpu])


def scenario_gpu_lost(lost_after_samples: int = 2, back_after_inits: int = 3) -> FakeNvml:
    """The two GPUs of scenario_basic; GPU 0 falls off the bus after `lost_after_samples`
    samples and answers again at the `back_after_inits`-th nvmlInit after that."""
    return FakeNvml(
        _two_gpus(),
        lose_index=0,
        lose_after_samples=lost_after_samples,
        back_after_inits=back_after_inits,
    )


def scenario_library_missing() -> FakeNvml:
    """No libnvidia-ml.so.1 on the machine: nvmlInit raises LIBRARY_NOT_FOUND."""
    return FakeNvml([], init_error=_real.NVML_ERROR_LIBRARY_NOT_FOUND)


def scenario_driver_not_loaded() -> FakeNvml:
    """The library is there but the kernel module is not: nvmlInit raises DRIVER_NOT_LOADED."""
    return FakeNvml([], init_error=_real.NVML_ERROR_DRIVER_NOT_LOADED)


def scenario_hung_call(
    function: str = "nvmlDeviceGetPowerUsage", gpu_index: int | None = 0
) -> FakeNvml:
    """The two GPUs of scenario_basic; the first `function` call (on `gpu_index`) blocks until
    the test sets `fake.release`, as a driver stuck on a lock would."""
    return FakeNvml(_two_gpus(), hang_function=function, hang_index=gpu_index)


def scenario_throttled() -> FakeNvml:
    """One hot GPU held back by heat: SW and HW thermal slowdown bits set, SM clock 1410 of
    3105 MHz, 250 ms of thermal violation per sample."""
    gpu = FakeGpu(
        temp_c=88,
        slowdown_c=87,
        sm_clock_mhz=1410,
        pstate=0,
        util_gpu_pct=100,
        reasons=(
            _real.nvmlClocksEventReasonSwThermalSlowdown
            | _real.nvmlClocksEventReasonHwThermalSlowdown
        ),
        thermal_violation_step_ns=250_000_000,
        power_violation_step_ns=0,
    )
    return FakeNvml([gpu])
