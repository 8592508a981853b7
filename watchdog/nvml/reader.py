"""The NVML edge: GPU telemetry from a pynvml-like module object.

The only module in the project that imports `pynvml` (package nvidia-ml-py), and only inside
`NvmlReader.start()`, never at import time. Everything else receives GpuSample / GpuInfo /
GpuEvent values (llm_watchdog.models).

    reader = NvmlReader()                 # or NvmlReader(nvml=fake) in tests and the heat lab
    if not reader.start():                # False: latency-only mode, said once in the log
        ...
    samples, events = reader.sample()     # every second; never raises, never sleeps
    reader.stop()

Units: temperatures in °C, clocks in MHz, power in W (NVML reports mW), utilisation and fan
in %, violation time in ms since the previous sample (NVML reports a cumulative counter in ns).
A field the GPU does not support is None.

The NVML surface used, exactly (a simulated GPU must provide all of it; see
REQUIRED_NVML_FUNCTIONS and REQUIRED_NVML_CONSTANTS, checked by `missing_nvml_names`):

    nvmlInit()                                   nvmlShutdown()
    nvmlSystemGetDriverVersion() -> str          nvmlDeviceGetCount() -> int
    nvmlDeviceGetHandleByIndex(i) -> handle
    nvmlDeviceGetName(h) -> str | bytes          nvmlDeviceGetUUID(h) -> str | bytes
    nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU) -> °C
    nvmlDeviceGetTemperatureThreshold(h, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        | NVML_TEMPERATURE_THRESHOLD_SHUTDOWN | NVML_TEMPERATURE_THRESHOLD_GPU_MAX
        | NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR (where the binding has it)) -> °C
    nvmlDeviceGetComputeRunningProcesses(h) -> objects with .pid (optional: the GPUs that
        serve the engine; see `compute_pids`)
    nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM | NVML_CLOCK_MEM) -> MHz
    nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM | NVML_CLOCK_MEM) -> MHz
    nvmlDeviceGetPowerUsage(h) -> mW             nvmlDeviceGetEnforcedPowerLimit(h) -> mW
    nvmlDeviceGetPowerManagementDefaultLimit(h) -> mW
    nvmlDeviceGetUtilizationRates(h) -> object with .gpu and .memory (%)
    nvmlDeviceGetFanSpeed(h) -> %
    nvmlDeviceGetPerformanceState(h) -> 0..15, or NVML_PSTATE_UNKNOWN
    nvmlDeviceGetCurrentClocksEventReasons(h) -> bitmask (llm_watchdog.nvml.throttle)
        (older bindings: nvmlDeviceGetCurrentClocksThrottleReasons, used when the first is absent)
    nvmlDeviceGetViolationStatus(h, NVML_PERF_POLICY_THERMAL | NVML_PERF_POLICY_POWER)
        -> object with .violationTime (ns, cumulative)
    NVMLError (exception class, error code in .value), NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_GPU_IS_LOST, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED

("A | B" above means "called once with A and once with B": the perf policies are enum values,
POWER = 0 and THERMAL = 1 in nvml.h's nvmlPerfPolicyType_t, not bit flags.)

Failure handling: NVML_ERROR_NOT_SUPPORTED (or any other per-field error) makes that field None
and the sample stands. A lost GPU (NVML_ERROR_GPU_IS_LOST, or its handle cannot be had) gives
one `gpu_lost` event, then NVML is shut down and initialised again with exponential backoff on
the injected clock, and `gpu_recovered` when the GPU answers again. No library or driver:
`start()` returns False, the log says so once, and the first `sample()` carries one
`nvml_unavailable` event. Every call runs on one worker thread; one GPU's reading in
`sample()` runs there as one batch and is waited for at most `call_timeout_s`: past it, one
`nvml_timeout` event, and `gpu_recovered` once the call has returned. See
`_NvmlWorker` for why one thread and what happens while a call hangs.

Logging: the latency-only notice is a WARNING, once per reader. What is returned as a GpuEvent
(gpu_lost, gpu_recovered, nvml_timeout) is logged at INFO only, since whoever stores the
events reports them; a per-field error other than NOT_SUPPORTED is a WARNING once per GPU,
function and error code.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_watchdog.errors import TelemetryError
from llm_watchdog.models import GpuEvent, GpuInfo, GpuSample

_LOG = logging.getLogger(__name__)

REQUIRED_NVML_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetViolationStatus",
)

REQUIRED_NVML_CONSTANTS: tuple[str, ...] = (
    "NVMLError",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_TEMPERATURE_GPU",
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "NVML_TEMPERATURE_THRESHOLD_GPU_MAX",
    "NVML_CLOCK_SM",
    "NVML_CLOCK_MEM",
    "NVML_PSTATE_UNKNOWN",
    "NVML_PERF_POLICY_THERMAL",
    "NVML_PERF_POLICY_POWER",
)

# Re-initialisation after a lost GPU: first try 2 s after the loss, then 4, 8, ... at most
# 5 minutes apart. A GPU that fell off the bus usually needs a reset or a reboot, so hammering
# nvmlInit every second only fills the log; 5 minutes still notices a repaired card soon.
REINIT_BACKOFF_INITIAL_S = 2.0
REINIT_BACKOFF_MAX_S = 300.0


def missing_nvml_names(nvml: Any) -> list[str]:
    """Names from REQUIRED_NVML_FUNCTIONS / REQUIRED_NVML_CONSTANTS that `nvml` lacks."""
    names = REQUIRED_NVML_FUNCTIONS + REQUIRED_NVML_CONSTANTS
    return [name for name in names if not hasattr(nvml, name)]


class NvmlTimeout(TelemetryError):
    """An NVML call did not return within its time limit."""

    def __init__(self, name: str, timeout_s: float) -> None:
        super().__init__(f"{name} did not return within {timeout_s:g} s")
        self.name = name


class _GpuLost(Exception):
    """The GPU being read is gone (NVML_ERROR_GPU_IS_LOST)."""


class _Call:
    __slots__ = ("name", "fn", "args", "done", "result", "error", "started")

    def __init__(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.name = name
        self.fn = fn
        self.args = args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()


class _NvmlWorker:
    """One daemon thread that makes every NVML call; the caller waits at most a timeout.

    A call into the driver is C code: Python cannot interrupt it, so the only way to bound the
    wait is to make the call on another thread and stop waiting. Why exactly one thread, and
    why nothing new is queued while a call hangs: a hung NVML call almost always means the
    driver itself is stuck (a GPU falling off the bus, an Xid storm, a driver lock held), so
    the next call would hang as well, on whatever thread made it. A thread per call, or a fresh
    thread after each timeout, would strand one more blocked thread per sample (86,400 a day at
    1 Hz). So while the timed-out call is still running, `call()` refuses at once (`busy`) and
    the reader samples nothing; when the call finally returns, its late result is dropped and
    the same thread serves again. At most one thread is ever blocked in the driver.

    Not concurrent.futures.ThreadPoolExecutor: Python joins its threads at interpreter exit,
    so a call that never returns would hang the daemon's shutdown. A daemon thread is
    abandoned at exit instead.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._stuck: _Call | None = None
        self._running: _Call | None = None
        self._thread = threading.Thread(target=self._run, name="nvml-worker", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> _Call | None:
        """The call that timed out and has not returned yet, else None."""
        if self._stuck is not None and self._stuck.done.is_set():
            self._stuck = None
        return self._stuck

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, timeout_s: float, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        running = self._running
        if running is not None and threading.current_thread() is self._thread:
            # A batch on the worker (one GPU's whole reading) makes its calls in line: one
            # hand-off per GPU and sample, not one per field. A timeout names the call the
            # batch was in.
            running.name = name
            return fn(*args)
        stuck = self.busy
        if stuck is not None:
            raise NvmlTimeout(stuck.name, timeout_s)
        job = _Call(name, fn, args)
        self._jobs.put(job)
        if not job.done.wait(timeout_s):
            self._stuck = job
            raise NvmlTimeout(job.name, timeout_s)
        if job.error is not None:
            raise job.error
        return job.result

    def close(self, join_timeout_s: float) -> None:
        """Ask the thread to end; wait for it unless it is stuck in the driver."""
        self._jobs.put(None)
        if self.busy is None:
            self._thread.join(join_timeout_s)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._running = job
            try:
                job.result = job.fn(*job.args)
            except BaseException as exc:  # handed to the caller; the thread must survive
                job.error = exc
            finally:
                self._running = None
                job.done.set()


@dataclass
class _Gpu:
    index: int
    handle: Any = None
    info: GpuInfo | None = None
    lost_since: float | None = None
    prev_violation_ns: dict[int, int] = field(default_factory=dict)
    unsupported: set[tuple[Any, ...]] = field(default_factory=set)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):  # older nvidia-ml-py returned bytes
        return value.decode("utf-8", "replace")
    return str(value)


def _num(value: Any, scale: float = 1.0) -> float | None:
    return None if value is None else float(value) / scale


class NvmlReader:
    """Reads GPU telemetry through NVML. See the module docstring for the contract.

    nvml: a pynvml-like module object; None imports `pynvml` inside start().
    indices: NVML indices to sample; None means every GPU NVML sees.
    call_timeout_s: the longest wait for one GPU's reading in sample() (its dozen NVML calls
        run as one batch on the worker thread).
    init_timeout_s: the longest wait for nvmlInit, nvmlShutdown and nvmlDeviceGetHandleByIndex.
        These may initialise the GPU, "a short (order of 1-3 second) startup cost per GPU due
        to ECC scrubbing" without persistence mode (NVIDIA, Driver Persistence, Overview), so
        they get a longer bound than the per-sample reads.
    clock: unix seconds, for sample stamps and the re-initialisation backoff; tests inject it.
    """

    def __init__(
        self,
        nvml: Any | None = None,
        indices: Sequence[int] | None = None,
        call_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        logger: logging.Logger = _LOG,
        init_timeout_s: float = 10.0,
    ) -> None:
        # A pynvml-like module (the real one, or a fake): untyped, as pynvml itself is.
        self._nvml: Any = nvml
        self._indices = None if indices is None else list(indices)
        self._call_timeout_s = call_timeout_s
        self._init_timeout_s = max(init_timeout_s, call_timeout_s)
        self._clock = clock
        self._log = logger
        self._lock = threading.RLock()
        self._worker: _NvmlWorker | None = None
        self._ready = False  # start() succeeded and stop() has not run
        self._session = False  # nvmlInit succeeded and no nvmlShutdown since
        self._said_unavailable = False
        self._warned: set[tuple[Any, ...]] = set()
        self._pending: list[GpuEvent] = []
        self._gpus: dict[int, _Gpu] = {}
        self._driver_version: str | None = None
        self._reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._backoff_s = REINIT_BACKOFF_INITIAL_S
        self._reinit_at: float | None = None
        self._reinit_attempts = 0
        # The NVML call that timed out, the GPU it was on and when: sampling waits for it.
        self._stall: tuple[str, int | None, float] | None = None
        self._abandoned: _NvmlWorker | None = None  # a worker left blocked in the driver

    # -- public ------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """True while an NVML session is up (False means latency-only mode)."""
        return self._ready

    @property
    def stalled(self) -> bool:
        """True while an NVML call that timed out has still not returned."""
        worker = self._worker
        return worker is not None and worker.busy is not None

    def start(self) -> bool:
        """Start NVML and read each GPU's fixed facts. False means latency-only mode."""
        with self._lock:
            if self._ready:
                return True
            if self._nvml is None:
                try:
                    import pynvml
                except ImportError:
                    return self._unavailable(
                        "the pynvml module is not installed; `pip install nvidia-ml-py`"
                    )
                self._nvml = pynvml
            nvml = self._nvml
            if not hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):
                self._reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
            stuck = self._abandoned
            if stuck is not None and stuck.busy is not None:
                # Still blocked from an earlier start: a second thread would block beside it.
                return self._unavailable(f"an earlier {stuck.busy.name} has still not returned")
            self._abandoned = None
            if self._worker is None or not self._worker.alive:
                self._worker = _NvmlWorker()
            try:
                self._slow("nvmlInit")
            except NvmlTimeout as exc:
                return self._unavailable(f"{exc}: is the driver hung? try `nvidia-smi`")
            except Exception as exc:
                return self._unavailable(self._init_failure(exc))
            self._session = True
            self._gpus = {}
            self._reinit_at = None
            events: list[GpuEvent] = []
            try:
                self._driver_version = self._read_driver_version()
                self._open_gpus(events)
            except NvmlTimeout as exc:
                return self._unavailable(f"{exc}: is the driver hung? try `nvidia-smi`")
            except Exception as exc:
                return self._unavailable(f"NVML started but could not list GPUs ({exc})")
            if not self._gpus:
                return self._unavailable("NVML sees no GPU to sample; check `nvidia-smi -L`")
            self._pending.extend(events)
            self._ready = True
            names = ", ".join(
                f"{g.index}: {g.info.name if g.info else '?'}" for g in self._gpus.values()
            )
            self._log.info("NVML started, driver %s, GPUs %s", self._driver_version, names)
            return True

    def sample(self) -> tuple[list[GpuSample], list[GpuEvent]]:
        """One reading of every GPU, and what happened to telemetry since the last call."""
        with self._lock:
            events, self._pending = self._pending, []
            samples: list[GpuSample] = []
            worker = self._worker
            if not self._ready or worker is None:
                return samples, events
            if worker.busy is not None:
                return samples, events  # paused: the hung call still holds the worker
            if self._stall is not None:
                # The timeout was an event (and an alert): its end is one too, or the
                # alert stays firing after the driver has long recovered.
                name, index, since = self._stall
                self._stall = None
                now = self._clock()
                what = "NVML" if index is None else f"GPU {index}"
                detail = (
                    f"{what} answers NVML again after {max(0.0, now - since):.0f} s "
                    f"({name} returned); sampling resumes"
                )
                events.append(GpuEvent(now, "gpu_recovered", index, detail))
                self._log.info("%s", detail)
            gpu_index: int | None = None
            try:
                if self._reinit_due(self._clock()):
                    self._reinit(events)
                for gpu in list(self._gpus.values()):
                    if gpu.lost_since is not None or gpu.handle is None:
                        continue
                    gpu_index = gpu.index
                    try:
                        samples.append(
                            worker.call(self._call_timeout_s, "sample", self._read_sample, gpu)
                        )
                    except _GpuLost as lost:
                        self._mark_lost(gpu, str(lost), events)
                gpu_index = None
            except NvmlTimeout as exc:
                now = self._clock()
                self._stall = (exc.name, gpu_index, now)
                detail = f"{exc}; GPU sampling paused until it returns"
                events.append(GpuEvent(now, "nvml_timeout", gpu_index, detail))
                self._log.info("NVML call timed out on GPU %s: %s", gpu_index, detail)
            return samples, events

    def infos(self) -> list[GpuInfo]:
        """Fixed facts of each sampled GPU, read once per NVML session (last known if lost)."""
        with self._lock:
            return [g.info for g in sorted(self._gpus.values(), key=lambda g: g.index) if g.info]

    def compute_pids(self) -> dict[int, set[int]]:
        """GPU index -> process ids running compute work on it; GPUs that cannot say are left
        out (an unsupported call, a lost GPU, a container that hides host pids)."""
        with self._lock:
            out: dict[int, set[int]] = {}
            if not self._ready or self._worker is None or self._worker.busy is not None:
                return out
            for gpu in self._gpus.values():
                if gpu.lost_since is not None or gpu.handle is None:
                    continue
                try:
                    procs = self._field(gpu, "nvmlDeviceGetComputeRunningProcesses")
                except (_GpuLost, NvmlTimeout):
                    continue
                if procs is None:
                    continue
                out[gpu.index] = {int(p.pid) for p in procs if getattr(p, "pid", None)}
            return out

    def driver_version(self) -> str | None:
        return self._driver_version

    def stop(self) -> None:
        """Shut NVML down and end the worker thread. Bounded in time even if NVML hangs."""
        with self._lock:
            self._ready = False
            self._close_session()

    def __enter__(self) -> NvmlReader:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- sessions and lost GPUs --------------------------------------------------------------

    def _close_session(self) -> None:
        """nvmlShutdown if a session is up and the worker is free; then end the worker."""
        worker, self._worker = self._worker, None
        if worker is not None:
            if self._session and worker.busy is None:
                try:
                    worker.call(self._init_timeout_s, "nvmlShutdown", self._nvml.nvmlShutdown)
                except Exception as exc:
                    self._log.debug("nvmlShutdown failed: %s", exc)
            if worker.busy is not None:
                self._abandoned = worker  # start() must not put a second thread beside it
            worker.close(self._call_timeout_s)
        self._session = False

    def _unavailable(self, why: str) -> bool:
        self._ready = False
        self._close_session()
        if not self._said_unavailable:
            self._said_unavailable = True
            message = f"GPU telemetry off, running in latency-only mode: {why}"
            self._log.warning(message)
            self._pending.append(GpuEvent(self._clock(), "nvml_unavailable", None, message))
        return False

    def _read_driver_version(self) -> str | None:
        try:
            return _text(self._plain("nvmlSystemGetDriverVersion"))
        except self._nvml.NVMLError as exc:
            self._log.debug("nvmlSystemGetDriverVersion failed: %s", exc)
            return None

    def _init_failure(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        nvml = self._nvml
        if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return (
                "the NVML library (libnvidia-ml.so.1) was not found; install the NVIDIA "
                "driver to get GPU telemetry (check with `nvidia-smi`)"
            )
        if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
            return (
                "the NVIDIA kernel driver is not loaded; load it (`sudo modprobe nvidia`) "
                "and check with `nvidia-smi`"
            )
        return f"nvmlInit failed ({exc}); check with `nvidia-smi`"

    def _open_gpus(self, events: list[GpuEvent]) -> None:
        """Take handles and read fixed facts for every wanted GPU in a new NVML session."""
        count = int(self._plain("nvmlDeviceGetCount"))
        wanted = list(range(count)) if self._indices is None else self._indices
        for index in wanted:
            if index >= count:
                self._warn_once(
                    ("absent", index),
                    "GPU index %d is not present (NVML sees %d GPUs); not sampled: check the "
                    "gpu indices in the config",
                    index,
                    count,
                )
                continue
            gpu = self._gpus.setdefault(index, _Gpu(index))
            gpu.unsupported.clear()
            try:
                gpu.handle = self._handle(index)
                gpu.info = self._read_info(gpu)
            except _GpuLost as lost:
                gpu.handle = None
                self._mark_lost(gpu, str(lost), events)
                continue
            if gpu.lost_since is not None:
                down_s = self._clock() - gpu.lost_since
                detail = f"GPU {index} answers again after {down_s:.0f} s"
                events.append(GpuEvent(self._clock(), "gpu_recovered", index, detail))
                self._log.info(detail)
                gpu.lost_since = None
                gpu.prev_violation_ns.clear()  # the counters may have restarted with the GPU

    def _handle(self, index: int) -> Any:
        try:
            return self._slow("nvmlDeviceGetHandleByIndex", index)
        except self._nvml.NVMLError as exc:  # any handle error: the GPU is not reachable
            raise _GpuLost(f"nvmlDeviceGetHandleByIndex({index}): {exc}") from exc

    def _mark_lost(self, gpu: _Gpu, why: str, events: list[GpuEvent]) -> None:
        if gpu.lost_since is not None:
            return
        now = self._clock()
        gpu.lost_since = now
        detail = f"GPU {gpu.index} lost ({why}); re-initialising NVML with backoff"
        events.append(GpuEvent(now, "gpu_lost", gpu.index, detail))
        self._log.info(detail)
        if self._reinit_at is None:
            self._backoff_s = REINIT_BACKOFF_INITIAL_S
            self._reinit_at = now + self._backoff_s

    def _reinit_due(self, now: float) -> bool:
        if self._reinit_at is None:
            return False
        # A wall clock stepped backwards would otherwise postpone the retry by the step.
        stepped_back = now < self._reinit_at - self._backoff_s
        return now >= self._reinit_at or stepped_back

    def _reinit(self, events: list[GpuEvent]) -> None:
        """Shut NVML down and start it again; lost GPUs that answer are recovered."""
        self._reinit_attempts += 1
        try:
            if self._session:
                self._session = False
                try:
                    self._slow("nvmlShutdown")
                except self._nvml.NVMLError as exc:
                    self._log.debug("nvmlShutdown before re-initialising failed: %s", exc)
            self._slow("nvmlInit")
            self._session = True
            self._open_gpus(events)
        except NvmlTimeout as exc:
            if not self._session:
                self._lose_all(f"NVML re-initialisation: {exc}", events)
            self._schedule_reinit()
            raise
        except Exception as exc:
            self._log.debug(
                "NVML re-initialisation attempt %d failed: %s", self._reinit_attempts, exc
            )
            self._lose_all(f"NVML could not be re-initialised: {exc}", events)
        self._schedule_reinit()

    def _lose_all(self, why: str, events: list[GpuEvent]) -> None:
        # NVML was shut down and did not come back: no GPU can be read, so the healthy ones
        # are lost too until it does, which is what really happened to their telemetry.
        for gpu in self._gpus.values():
            gpu.handle = None
            self._mark_lost(gpu, why, events)

    def _schedule_reinit(self) -> None:
        if any(g.lost_since is not None for g in self._gpus.values()):
            self._backoff_s = min(self._backoff_s * 2, REINIT_BACKOFF_MAX_S)
            self._reinit_at = self._clock() + self._backoff_s
        else:
            self._reinit_at = None
            self._backoff_s = REINIT_BACKOFF_INITIAL_S
            self._reinit_attempts = 0

    # -- reading -----------------------------------------------------------------------------

    def _plain(self, name: str, *args: Any) -> Any:
        assert self._worker is not None
        return self._worker.call(self._call_timeout_s, name, getattr(self._nvml, name), *args)

    def _slow(self, name: str, *args: Any) -> Any:
        assert self._worker is not None
        return self._worker.call(self._init_timeout_s, name, getattr(self._nvml, name), *args)

    def _field(self, gpu: _Gpu, name: str, *args: Any) -> Any:
        """One per-GPU NVML read; None when the GPU cannot give it. Raises _GpuLost."""
        key = (name, *args)
        if key in gpu.unsupported:
            return None
        nvml = self._nvml
        try:
            return self._plain(name, gpu.handle, *args)
        except NvmlTimeout:
            raise
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(f"{name}: {exc}") from exc
            if code == nvml.NVML_ERROR_NOT_SUPPORTED:
                gpu.unsupported.add(key)  # fixed per GPU: not asked again this session
                return None
            self._warn_once((gpu.index, name, code), "GPU %d: %s failed: %s", gpu.index, name, exc)
            return None
        except Exception as exc:  # an old binding without the function, a ctypes error
            self._warn_once(
                (gpu.index, name, type(exc)), "GPU %d: %s failed: %r", gpu.index, name, exc
            )
            return None

    def _read_info(self, gpu: _Gpu) -> GpuInfo:
        nvml, f = self._nvml, self._field
        return GpuInfo(
            index=gpu.index,
            uuid=_text(f(gpu, "nvmlDeviceGetUUID")),
            name=_text(f(gpu, "nvmlDeviceGetName")),
            temp_slowdown_c=_num(
                f(
                    gpu,
                    "nvmlDeviceGetTemperatureThreshold",
                    nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                )
            ),
            temp_shutdown_c=_num(
                f(
                    gpu,
                    "nvmlDeviceGetTemperatureThreshold",
                    nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
                )
            ),
            temp_gpu_max_c=_num(
                f(gpu, "nvmlDeviceGetTemperatureThreshold", nvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)
            ),
            sm_clock_max_mhz=_num(f(gpu, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)),
            mem_clock_max_mhz=_num(f(gpu, "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM)),
            power_limit_default_w=_num(f(gpu, "nvmlDeviceGetPowerManagementDefaultLimit"), 1000.0),
            temp_target_c=self._target_c(gpu),
        )

    def _target_c(self, gpu: _Gpu) -> float | None:
        # ACOUSTIC_CURR came with NVML 12; an older binding lacks the constant.
        kind = getattr(self._nvml, "NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR", None)
        if kind is None:
            return None
        value = _num(self._field(gpu, "nvmlDeviceGetTemperatureThreshold", kind))
        return value if value else None  # some drivers answer 0 for "not set"

    def _read_sample(self, gpu: _Gpu) -> GpuSample:
        nvml, f = self._nvml, self._field
        ts = self._clock()
        util = f(gpu, "nvmlDeviceGetUtilizationRates")
        pstate = f(gpu, "nvmlDeviceGetPerformanceState")
        if pstate is not None and pstate == nvml.NVML_PSTATE_UNKNOWN:
            pstate = None
        reasons = f(gpu, self._reasons_fn)
        info = gpu.info
        return GpuSample(
            ts=ts,
            gpu_index=gpu.index,
            uuid=info.uuid if info else None,
            temp_c=_num(f(gpu, "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)),
            sm_clock_mhz=_num(f(gpu, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)),
            sm_clock_max_mhz=info.sm_clock_max_mhz if info else None,
            mem_clock_mhz=_num(f(gpu, "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)),
            mem_clock_max_mhz=info.mem_clock_max_mhz if info else None,
            power_w=_num(f(gpu, "nvmlDeviceGetPowerUsage"), 1000.0),  # mW -> W
            power_limit_w=_num(f(gpu, "nvmlDeviceGetEnforcedPowerLimit"), 1000.0),
            util_gpu_pct=_num(getattr(util, "gpu", None)),
            util_mem_pct=_num(getattr(util, "memory", None)),
            fan_pct=_num(f(gpu, "nvmlDeviceGetFanSpeed")),
            pstate=None if pstate is None else int(pstate),
            throttle_reasons=None if reasons is None else int(reasons),
            thermal_violation_ms=self._violation_ms(gpu, nvml.NVML_PERF_POLICY_THERMAL),
            power_violation_ms=self._violation_ms(gpu, nvml.NVML_PERF_POLICY_POWER),
            temp_slowdown_c=info.temp_slowdown_c if info else None,
            temp_target_c=info.temp_target_c if info else None,
        )

    def _violation_ms(self, gpu: _Gpu, policy: int) -> float | None:
        """Time held back by `policy` since the previous sample; None on the first one."""
        status = self._field(gpu, "nvmlDeviceGetViolationStatus", policy)
        total_ns = getattr(status, "violationTime", None)
        if total_ns is None:
            return None
        total_ns = int(total_ns)
        prev_ns = gpu.prev_violation_ns.get(policy)
        gpu.prev_violation_ns[policy] = total_ns
        if prev_ns is None or total_ns < prev_ns:  # first reading, or the counter restarted
            return None
        return (total_ns - prev_ns) / 1e6  # nvml.h nvmlViolationTime_t: violationTime in ns

    def _warn_once(self, key: tuple[Any, ...], msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self._log.warning(msg, *args)
