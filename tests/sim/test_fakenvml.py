"""The fake NVML over a simulated card, read by the project's real NVML reader."""

from __future__ import annotations

import dataclasses

import pynvml
import pytest

from llm_watchdog.nvml.reader import REQUIRED_NVML_FUNCTIONS, NvmlReader, missing_nvml_names
from llm_watchdog.sim.fakenvml import FakeNvml, StandaloneDevice
from llm_watchdog.sim.gpu import SW_THERMAL_SLOWDOWN
from llm_watchdog.sim.scenario import load_scenario
from tests.helpers.builders import FakeClock


def lab_card(
    name: str = "consumer-warm-room", load: float = 0.0
) -> tuple[FakeNvml, FakeClock, StandaloneDevice]:
    clock = FakeClock()
    dev = StandaloneDevice(load_scenario(name).gpu, load=load)
    return FakeNvml([dev], clock), clock, dev


def test_covers_every_function_and_constant_the_reader_needs() -> None:
    nvml, _, _ = lab_card()
    assert missing_nvml_names(nvml) == []
    for name in REQUIRED_NVML_FUNCTIONS:
        assert callable(getattr(nvml, name))
        assert type(nvml).__dict__.get(name) is not None, f"{name} is not implemented"
    assert callable(nvml.nvmlDeviceGetCurrentClocksThrottleReasons)  # older bindings' name


def test_uses_the_real_pynvml_errors_and_constants() -> None:
    nvml, _, _ = lab_card()
    assert nvml.NVMLError is pynvml.NVMLError
    assert nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetEncoderUtilization(nvml.nvmlDeviceGetHandleByIndex(0))
    nvml.nvmlShutdown()


def test_readings_are_consistent_with_the_card() -> None:
    nvml, clock, _ = lab_card(load=0.9)
    p = load_scenario("consumer-warm-room").gpu
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    clock.now = 30.0
    assert nvml.nvmlDeviceGetName(h) == p.name
    assert (
        nvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX) == 83
    )
    assert (
        nvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 93
    )
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1950
    sm = nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    assert p.sm_clock_min_mhz <= sm <= p.sm_clock_max_mhz
    power_mw = nvml.nvmlDeviceGetPowerUsage(h)
    assert 1000 * p.power_idle_w < power_mw <= nvml.nvmlDeviceGetEnforcedPowerLimit(h)
    util = nvml.nvmlDeviceGetUtilizationRates(h)
    assert util.gpu > 90 and 0 < util.memory <= 100
    assert nvml.nvmlDeviceGetPerformanceState(h) == 0
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons == nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    v = nvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER)
    assert v.referenceTime == 30_000_000 and v.violationTime >= 0
    nvml.nvmlShutdown()


def test_the_real_reader_sees_the_card_heat_and_throttle() -> None:
    nvml, clock, dev = lab_card(load=0.0)
    reader = NvmlReader(nvml=nvml, clock=clock)
    try:
        assert reader.start()
        info = reader.infos()[0]
        assert info.temp_slowdown_c == 93 and info.sm_clock_max_mhz == 1950
        idle, _ = reader.sample()
        assert idle[0].throttle_reasons == pynvml.nvmlClocksEventReasonGpuIdle
        assert idle[0].pstate == 8
        dev.set_load(0.85, clock.now)
        rows = []
        for minute in range(1, 21):
            clock.now = 60.0 * minute
            samples, events = reader.sample()
            assert events == []
            rows.append(samples[0])
        temps = [r.temp_c for r in rows]
        assert temps[-1] > temps[0] + 20 and temps[-1] >= 80
        assert rows[-1].sm_clock_mhz < rows[1].sm_clock_mhz - 100
        assert rows[-1].throttle_reasons & SW_THERMAL_SLOWDOWN
        assert rows[-1].thermal_violation_ms == pytest.approx(60_000, rel=0.05)
        assert rows[0].fan_pct is not None and rows[-1].fan_pct > rows[0].fan_pct
    finally:
        reader.stop()


def test_a_passive_card_has_no_fan_reading() -> None:
    nvml, clock, _ = lab_card("datacenter", load=0.5)
    reader = NvmlReader(nvml=nvml, clock=clock)
    try:
        assert reader.start()
        clock.now = 5.0
        samples, _ = reader.sample()
        assert samples[0].fan_pct is None and samples[0].temp_c is not None
    finally:
        reader.stop()


def test_a_lost_gpu_reaches_the_reader_as_an_event() -> None:
    nvml, clock, _ = lab_card(load=0.5)
    reader = NvmlReader(nvml=nvml, clock=clock)
    try:
        assert reader.start()
        nvml.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_GPU_IS_LOST)
        clock.now = 1.0
        _, events = reader.sample()
        assert [e.kind for e in events] == ["gpu_lost"]
    finally:
        reader.stop()


def test_two_cards_are_read_apart() -> None:
    p = load_scenario("workstation").gpu
    clock = FakeClock()
    hot = StandaloneDevice(dataclasses.replace(p, uuid="GPU-hot"), load=1.0)
    idle = StandaloneDevice(dataclasses.replace(p, uuid="GPU-idle"), load=0.0)
    nvml = FakeNvml([hot, idle], clock)
    nvml.nvmlInit()
    clock.now = 300.0
    h0, h1 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert nvml.nvmlDeviceGetCount() == 2
    assert nvml.nvmlDeviceGetUUID(h1) == "GPU-idle"
    t0 = nvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU)
    t1 = nvml.nvmlDeviceGetTemperature(h1, pynvml.NVML_TEMPERATURE_GPU)
    assert t0 > t1 + 20
    nvml.nvmlShutdown()


def test_a_lab_in_another_process_is_read_through_http() -> None:
    from llm_watchdog.sim.remote import remote_nvml
    from llm_watchdog.sim.server import SimLab

    with SimLab("workstation", time_scale=50, batch_streams=8) as lab:
        url = lab.url
        nvml = remote_nvml(url)
        reader = NvmlReader(nvml=nvml)
        try:
            assert reader.start()
            assert reader.infos()[0].name == lab.scenario.gpu.name
            samples, _ = reader.sample()
            local = lab.nvml
            local.nvmlInit()
            h = local.nvmlDeviceGetHandleByIndex(0)
            assert samples[0].temp_c == pytest.approx(
                local.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU), abs=2
            )
            local.nvmlShutdown()
        finally:
            reader.stop()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        remote_nvml(url)  # the lab is gone
