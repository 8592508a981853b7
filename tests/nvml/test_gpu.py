from __future__ import annotations

import ctypes
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pynvml
import pytest

from llm_watchdog.models import GpuEvent, GpuSample
from llm_watchdog.nvml import throttle
from llm_watchdog.nvml.reader import (
    REINIT_BACKOFF_INITIAL_S,
    REQUIRED_NVML_CONSTANTS,
    REQUIRED_NVML_FUNCTIONS,
    NvmlReader,
    missing_nvml_names,
)
from tests.helpers.builders import FakeClock
from tests.helpers.fakenvml import (
    FakeGpu,
    FakeNvml,
    LegacyFakeNvml,
    scenario_basic,
    scenario_driver_not_loaded,
    scenario_fields_not_supported,
    scenario_gpu_lost,
    scenario_hung_call,
    scenario_library_missing,
    scenario_throttled,
)

LOGGER = "llm_watchdog.nvml.reader"


@pytest.fixture
def readers() -> Iterator[list[NvmlReader]]:
    """Readers made by a test are stopped at its end, so no worker thread outlives it."""
    made: list[NvmlReader] = []
    yield made
    for reader in made:
        reader.stop()


def make(readers: list[NvmlReader], nvml: object, clock: FakeClock, **kw: object) -> NvmlReader:
    reader = NvmlReader(nvml=nvml, clock=clock, **kw)  # type: ignore[arg-type]
    readers.append(reader)
    return reader


def by_index(samples: list[GpuSample]) -> dict[int, GpuSample]:
    return {s.gpu_index: s for s in samples}


def kinds(events: list[GpuEvent]) -> list[tuple[str, int | None]]:
    return [(e.kind, e.gpu_index) for e in events]


def nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# -- the published NVML surface ---------------------------------------------------------------


def test_scenario_basic_provides_every_required_name() -> None:
    assert missing_nvml_names(scenario_basic()) == []


def test_required_names_exist_in_the_real_binding_and_the_check_can_fail() -> None:
    assert missing_nvml_names(pynvml) == []
    assert missing_nvml_names(object()) == list(REQUIRED_NVML_FUNCTIONS + REQUIRED_NVML_CONSTANTS)
    assert missing_nvml_names(LegacyFakeNvml([])) == ["nvmlDeviceGetCurrentClocksEventReasons"]


def test_importing_the_module_does_not_import_pynvml() -> None:
    code = "import sys, llm_watchdog.nvml.reader; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- readings and units -----------------------------------------------------------------------


def test_basic_two_gpus_units_and_infos(readers: list[NvmlReader], clock: FakeClock) -> None:
    reader = make(readers, scenario_basic(), clock)
    assert reader.start() is True
    assert reader.available
    assert reader.driver_version() == "550.54.15"

    infos = reader.infos()
    assert [i.index for i in infos] == [0, 1]
    assert infos[0].name == "NVIDIA RTX 6000 Ada Generation"
    assert infos[0].uuid == "GPU-0b7e0c6c-5c1f-4a55-9d2b-000000000000"
    assert (infos[0].temp_slowdown_c, infos[0].temp_shutdown_c, infos[0].temp_gpu_max_c) == (
        94.0,
        97.0,
        89.0,
    )
    assert (infos[0].sm_clock_max_mhz, infos[0].mem_clock_max_mhz) == (3105.0, 10001.0)
    assert infos[0].power_limit_default_w == 300.0
    assert infos[1].power_limit_default_w == 450.0

    samples, events = reader.sample()
    assert events == []
    first = by_index(samples)
    busy = first[0]
    assert busy.ts == clock.now
    assert busy.uuid == infos[0].uuid
    assert busy.temp_c == 52.0
    assert (busy.sm_clock_mhz, busy.sm_clock_max_mhz) == (2475.0, 3105.0)
    assert (busy.mem_clock_mhz, busy.mem_clock_max_mhz) == (10001.0, 10001.0)
    assert busy.power_w == pytest.approx(182.345)  # 182345 mW
    assert busy.power_limit_w == 300.0
    assert (busy.util_gpu_pct, busy.util_mem_pct, busy.fan_pct) == (73.0, 41.0, 46.0)
    assert busy.pstate == 2
    assert busy.throttle_reasons == 0
    assert busy.temp_slowdown_c == 94.0
    # Violation counters are cumulative: the first sample has nothing to subtract from.
    assert busy.thermal_violation_ms is None and busy.power_violation_ms is None

    idle = first[1]
    assert idle.pstate == 8
    assert throttle.reason_names(idle.throttle_reasons) == ["gpu_idle"]
    assert not throttle.is_throttled(idle.throttle_reasons)
    assert idle.power_w == pytest.approx(21.8)

    clock.now += 1
    second = by_index(reader.sample()[0])
    assert second[0].ts == clock.now
    assert second[0].power_violation_ms == pytest.approx(1.5)  # 1_500_000 ns
    assert second[0].thermal_violation_ms == 0.0
    assert second[1].power_violation_ms == 0.0


def test_fields_not_supported_are_none_and_not_asked_again(
    readers: list[NvmlReader], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = scenario_fields_not_supported()
    reader = make(readers, fake, clock)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert reader.start()
    assert reader.infos()[0].power_limit_default_w is None
    for _ in range(3):
        samples, events = reader.sample()
        clock.now += 1
    assert events == []
    (s,) = samples
    assert s.fan_pct is None
    assert s.power_w is None and s.power_limit_w is None
    assert s.thermal_violation_ms is None and s.power_violation_ms is None
    # What the card does give is still there.
    assert (s.temp_c, s.sm_clock_mhz, s.util_gpu_pct, s.pstate) == (52.0, 2475.0, 73.0, 2)
    # NOT_SUPPORTED is fixed per GPU: asked once per session, and not a warning.
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 1
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2  # thermal and power, once each
    assert fake.calls["nvmlDeviceGetTemperature"] == 3
    assert [r for r in caplog.records if r.name == LOGGER] == []


@pytest.mark.parametrize(
    "fault",
    [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_TIMEOUT],
)
def test_other_field_error_is_none_warned_once_and_retried(
    readers: list[NvmlReader], clock: FakeClock, caplog: pytest.LogCaptureFixture, fault: int
) -> None:
    fake = scenario_basic()
    fake.gpus[0].errors["nvmlDeviceGetFanSpeed"] = fault
    reader = make(readers, fake, clock)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert reader.start()
    for _ in range(3):
        samples, events = reader.sample()
        assert events == []
        s = by_index(samples)[0]
        assert s.fan_pct is None and s.temp_c == 52.0
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 6  # 3 samples x 2 GPUs: a transient error
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1
    assert "GPU 0: nvmlDeviceGetFanSpeed failed" in warnings[0]
    del fake.gpus[0].errors["nvmlDeviceGetFanSpeed"]
    assert by_index(reader.sample()[0])[0].fan_pct == 46.0


def test_throttled_scenario(readers: list[NvmlReader], clock: FakeClock) -> None:
    reader = make(readers, scenario_throttled(), clock)
    assert reader.start()
    reader.sample()
    clock.now += 1
    (s,), events = reader.sample()
    assert events == []
    assert s.temp_c == 88.0 and s.temp_slowdown_c == 87.0
    assert s.sm_clock_mhz == 1410.0 and s.sm_clock_max_mhz == 3105.0
    assert throttle.reason_names(s.throttle_reasons) == [
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
    ]
    assert throttle.is_thermal(s.throttle_reasons) and not throttle.is_power(s.throttle_reasons)
    assert s.thermal_violation_ms == pytest.approx(250.0)  # 250_000_000 ns per sample
    assert s.power_violation_ms == 0.0


def test_older_binding_falls_back_to_throttle_reasons(
    readers: list[NvmlReader], clock: FakeClock
) -> None:
    fake = LegacyFakeNvml([FakeGpu(reasons=throttle.SW_POWER_CAP)])
    reader = make(readers, fake, clock)
    assert reader.start()
    (s,), _ = reader.sample()
    assert s.throttle_reasons == throttle.SW_POWER_CAP
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 0


def test_bytes_names_and_unknown_pstate(readers: list[NvmlReader], clock: FakeClock) -> None:
    gpu = FakeGpu(name=b"Tesla T4", uuid=b"GPU-abc", pstate=pynvml.NVML_PSTATE_UNKNOWN)
    reader = make(readers, FakeNvml([gpu]), clock)
    assert reader.start()
    assert (reader.infos()[0].name, reader.infos()[0].uuid) == ("Tesla T4", "GPU-abc")
    (s,), _ = reader.sample()
    assert s.pstate is None and s.uuid == "GPU-abc"


def test_indices_select_gpus_and_an_absent_one_is_warned_once(
    readers: list[NvmlReader], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reader = make(readers, scenario_basic(), clock, indices=[1, 5])
    assert reader.start()
    for _ in range(2):
        samples, _ = reader.sample()
        assert [s.gpu_index for s in samples] == [1]
    assert [i.index for i in reader.infos()] == [1]
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages == [
        "GPU index 5 is not present (NVML sees 2 GPUs); not sampled: check the gpu indices "
        "in the config"
    ]


# -- no NVML: latency-only mode ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "advice"),
    [
        (scenario_library_missing, "libnvidia-ml.so.1) was not found; install the NVIDIA driver"),
        (scenario_driver_not_loaded, "driver is not loaded; load it (`sudo modprobe nvidia`)"),
    ],
)
def test_no_nvml_is_latency_only_said_once(
    readers: list[NvmlReader],
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    scenario: object,
    advice: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    fake = scenario()  # type: ignore[operator]
    reader = make(readers, fake, clock)
    assert reader.start() is False
    assert reader.start() is False  # a second try (config reload) does not log again
    assert not reader.available
    samples, events = reader.sample()
    assert samples == []
    assert kinds(events) == [("nvml_unavailable", None)]
    for _ in range(3):
        assert reader.sample() == ([], [])
    reader.stop()
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 1
    text = records[0].getMessage()
    assert records[0].levelno == logging.WARNING
    assert text.startswith("GPU telemetry off, running in latency-only mode: ")
    assert advice in text
    assert events[0].detail == text
    assert fake.calls["nvmlShutdown"] == 0  # nothing was started, nothing to shut down


def test_no_gpu_visible_is_latency_only(readers: list[NvmlReader], clock: FakeClock) -> None:
    fake = FakeNvml([])
    reader = make(readers, fake, clock)
    assert reader.start() is False
    (event,) = reader.sample()[1]
    assert "NVML sees no GPU to sample" in event.detail
    assert fake.initialized == 0  # the session that found nothing was shut down


@pytest.mark.skipif(nvml_library_present(), reason="this machine has libnvidia-ml.so.1")
def test_real_pynvml_without_a_driver_returns_false(
    readers: list[NvmlReader], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    reader = NvmlReader()  # nvml=None: imports the real pynvml inside start()
    readers.append(reader)
    assert reader.start() is False
    assert reader.sample()[0] == []
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert "libnvidia-ml.so.1) was not found" in record.getMessage()


@pytest.mark.gpu
@pytest.mark.skipif(not nvml_library_present(), reason="needs libnvidia-ml.so.1 and a GPU")
def test_real_gpu(readers: list[NvmlReader]) -> None:
    reader = NvmlReader()
    readers.append(reader)
    assert reader.start() is True
    assert reader.driver_version()
    reader.sample()
    samples, events = reader.sample()
    assert events == []
    assert samples and all(s.temp_c is not None and s.sm_clock_mhz for s in samples)


# -- a lost GPU -------------------------------------------------------------------------------


def test_lost_gpu_backoff_reinit_and_recovery(readers: list[NvmlReader], clock: FakeClock) -> None:
    fake = scenario_gpu_lost(lost_after_samples=2, back_after_inits=3)
    reader = make(readers, fake, clock)
    assert reader.start()
    t0 = clock.now
    inits_at: list[float] = []
    timeline: list[tuple[float, list[int], list[tuple[str, int | None]]]] = []
    for second in range(20):
        clock.now = t0 + second
        before = fake.calls["nvmlInit"]
        samples, events = reader.sample()
        if fake.calls["nvmlInit"] > before:
            inits_at.append(second)
        timeline.append((second, sorted(s.gpu_index for s in samples), kinds(events)))

    lost_at = 2  # GPU 0 answered two samples, then fell off the bus
    assert timeline[0][1:] == ([0, 1], [])
    assert timeline[1][1:] == ([0, 1], [])
    assert timeline[lost_at][1:] == ([1], [("gpu_lost", 0)])
    # Re-initialised 2 s after the loss, then 4 s and 8 s later: backoff on the injected clock,
    # never by sleeping in sample().
    first = lost_at + REINIT_BACKOFF_INITIAL_S
    assert inits_at == [first, first + 4, first + 12]
    back_at = int(first + 12)
    assert timeline[back_at][1:] == ([0, 1], [("gpu_recovered", 0)])
    # GPU 1 kept being sampled all along, GPU 0 not while lost; one event each way.
    assert all(1 in gpus for _, gpus, _ in timeline)
    assert all(0 not in gpus for s, gpus, _ in timeline if lost_at <= s < back_at)
    all_events = [e for _, _, evs in timeline for e in evs]
    assert all_events == [("gpu_lost", 0), ("gpu_recovered", 0)]
    # After the GPU is back its violation counter starts over: the first delta is unknown.
    clock.now = t0 + back_at
    assert fake.calls["nvmlShutdown"] == 3  # each re-initialisation shuts the old session
    samples_after = by_index(reader.sample()[0])
    assert samples_after[0].power_violation_ms == pytest.approx(1.5)


def test_reinit_failure_loses_every_gpu_until_nvml_is_back(
    readers: list[NvmlReader], clock: FakeClock
) -> None:
    fake = scenario_basic()
    reader = make(readers, fake, clock)
    assert reader.start()
    fake.lose(0)
    assert kinds(reader.sample()[1]) == [("gpu_lost", 0)]
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # the driver went with it
    clock.now += REINIT_BACKOFF_INITIAL_S
    samples, events = reader.sample()
    assert samples == [] and kinds(events) == [("gpu_lost", 1)]
    assert "NVML could not be re-initialised: Driver Not Loaded" in events[0].detail
    fake.init_error = None
    fake.restore(0)
    clock.now += 2 * REINIT_BACKOFF_INITIAL_S - 1
    assert reader.sample() == ([], [])  # not due yet
    clock.now += 1
    samples, events = reader.sample()
    assert sorted(s.gpu_index for s in samples) == [0, 1]
    assert kinds(events) == [("gpu_recovered", 0), ("gpu_recovered", 1)]


# -- a hung NVML call -------------------------------------------------------------------------


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvml-worker"]


def wait_until(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_hung_call_is_bounded_and_does_not_pile_up_threads(
    readers: list[NvmlReader], clock: FakeClock
) -> None:
    timeout_s = 0.3
    fake = scenario_hung_call("nvmlDeviceGetPowerUsage", gpu_index=0)
    reader = make(readers, fake, clock, call_timeout_s=timeout_s)
    assert reader.start()
    assert len(worker_threads()) == 1

    started = time.perf_counter()
    samples, events = reader.sample()
    elapsed = time.perf_counter() - started
    assert elapsed < timeout_s + 0.5
    assert fake.hanging.is_set()
    # GPU 0's sample is skipped; GPU 1 after it too, because the one worker is still stuck.
    assert samples == []
    assert kinds(events) == [("nvml_timeout", 0)]
    assert "nvmlDeviceGetPowerUsage did not return within 0.3 s" in events[0].detail
    assert reader.stalled

    calls_while_stuck = sum(fake.calls.values())
    for _ in range(5):
        clock.now += 1
        started = time.perf_counter()
        assert reader.sample() == ([], [])  # the timeout is reported once per hang
        assert time.perf_counter() - started < 0.1  # refused at once, not waited for
    assert sum(fake.calls.values()) == calls_while_stuck  # nothing queued behind the hung call
    assert len(worker_threads()) == 1  # and no second thread started

    fake.release.set()
    wait_until(lambda: not reader.stalled)
    clock.now += 1
    samples, events = reader.sample()
    # The hang's end is told, so that its alert resolves.
    assert kinds(events) == [("gpu_recovered", 0)]
    assert "GPU 0 answers NVML again after 6 s (nvmlDeviceGetPowerUsage returned)" in (
        events[0].detail
    )
    assert by_index(samples)[0].power_w == pytest.approx(182.345)
    assert reader.sample()[1] == []  # told once
    assert len(worker_threads()) == 1

    reader.stop()
    wait_until(lambda: not worker_threads())


def test_stop_while_a_call_hangs_returns_promptly(
    readers: list[NvmlReader], clock: FakeClock
) -> None:
    fake = scenario_hung_call("nvmlDeviceGetTemperature", gpu_index=1)
    reader = make(readers, fake, clock, call_timeout_s=0.2)
    assert reader.start()
    samples, events = reader.sample()
    assert [s.gpu_index for s in samples] == [0]  # GPU 0 came before the hang
    assert kinds(events) == [("nvml_timeout", 1)]
    started = time.perf_counter()
    reader.stop()
    assert time.perf_counter() - started < 0.2
    assert fake.calls["nvmlShutdown"] == 0  # not queued behind the hung call
    assert not reader.available
    fake.release.set()  # the driver comes back: the abandoned thread then ends on its own
    wait_until(lambda: not worker_threads())


def test_hung_init_is_latency_only_within_the_timeout(
    readers: list[NvmlReader], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    fake = scenario_hung_call("nvmlInit", gpu_index=None)
    reader = make(readers, fake, clock, call_timeout_s=0.2, init_timeout_s=0.2)
    started = time.perf_counter()
    assert reader.start() is False
    assert time.perf_counter() - started < 0.7
    assert reader.start() is False  # a retry while nvmlInit still hangs starts no new thread
    assert len(worker_threads()) == 1
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert "nvmlInit did not return within 0.2 s: is the driver hung?" in record.getMessage()
    fake.release.set()
    wait_until(lambda: not worker_threads())


def test_context_manager_starts_and_stops(clock: FakeClock) -> None:
    fake = scenario_basic()
    with NvmlReader(nvml=fake, clock=clock) as reader:
        assert reader.available
        assert len(reader.sample()[0]) == 2
    assert not reader.available
    assert fake.initialized == 0
    wait_until(lambda: not worker_threads())


def test_worker_refuses_new_calls_while_one_hangs() -> None:
    from llm_watchdog.nvml.reader import NvmlTimeout, _NvmlWorker

    worker = _NvmlWorker()
    release = threading.Event()
    ran: list[str] = []
    try:
        with pytest.raises(NvmlTimeout, match="slow did not return within 0.1 s"):
            worker.call(0.1, "slow", release.wait, 10)
        started = time.perf_counter()
        with pytest.raises(NvmlTimeout, match="slow did not return"):
            worker.call(5.0, "next", ran.append, "next")
        assert time.perf_counter() - started < 0.1
        assert ran == []  # refused, not queued behind the hung call
        release.set()
        wait_until(lambda: worker.busy is None)
        assert worker.call(1.0, "next", ran.append, "next") is None
        assert ran == ["next"]
        with pytest.raises(ZeroDivisionError):  # errors come back to the caller
            worker.call(1.0, "div", lambda: 1 / 0)
        assert worker.call(1.0, "add", lambda a, b: a + b, 2, 3) == 5
    finally:
        release.set()
        worker.close(1.0)
    assert not worker.alive


def test_clock_stepped_back_does_not_postpone_reinit(
    readers: list[NvmlReader], clock: FakeClock
) -> None:
    fake = scenario_basic()
    reader = make(readers, fake, clock)
    assert reader.start()
    fake.lose(0)
    assert kinds(reader.sample()[1]) == [("gpu_lost", 0)]
    fake.restore(0)
    clock.now -= 3600  # NTP stepped the wall clock back an hour
    samples, events = reader.sample()
    assert kinds(events) == [("gpu_recovered", 0)]
    assert sorted(s.gpu_index for s in samples) == [0, 1]


def test_one_gpu_reading_is_one_hand_off_to_the_worker(
    readers: list[NvmlReader], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each hand-off costs two thread switches; at 1 Hz over two GPUs, a dozen per reading
    # was most of the daemon's idle CPU.
    fake = scenario_basic()
    reader = make(readers, fake, clock)
    assert reader.start()
    worker = reader._worker
    assert worker is not None
    handed: list[object] = []
    queue = worker._jobs  # the worker thread waits on this one; the spy only adds to it

    class Spy:
        def put(self, job: object) -> None:
            handed.append(job)
            queue.put(job)  # type: ignore[arg-type]

        def get(self) -> object:
            return queue.get()

    monkeypatch.setattr(worker, "_jobs", Spy())
    calls_before = sum(fake.calls.values())
    samples, events = reader.sample()
    assert (len(samples), events) == (2, [])
    assert len(handed) == 2  # one per GPU
    assert sum(fake.calls.values()) - calls_before >= 20  # while NVML was asked every field
    assert by_index(samples)[0].power_w == pytest.approx(182.345)
