"""Where clocks start to fall: the threshold heat is judged against, and which one it is."""

from __future__ import annotations

import pynvml

from llm_watchdog.models import GpuInfo, GpuSample
from llm_watchdog.nvml.reader import NvmlReader
from llm_watchdog.nvml.serving import serving_indices, worst_gpu
from llm_watchdog.nvml.thresholds import Onset, SlowdownLearner, onset_of, throttle_onset
from llm_watchdog.sim.fakenvml import TWO_GPU_ENGINE_PID, FakeNvml, StandaloneDevice, two_gpu_nvml
from llm_watchdog.sim.scenario import load_scenario
from tests.helpers.builders import FakeClock


def info(**kw: float | None) -> GpuInfo:
    values: dict[str, object] = {
        "index": 0,
        "uuid": "GPU-a",
        "name": "card",
        "temp_slowdown_c": 93.0,
        "temp_shutdown_c": 98.0,
        "temp_gpu_max_c": 88.0,
        "sm_clock_max_mhz": 1950.0,
        "mem_clock_max_mhz": 9751.0,
        "power_limit_default_w": 350.0,
        "temp_target_c": 83.0,
    }
    values.update(kw)
    return GpuInfo(**values)  # type: ignore[arg-type]


def test_the_lowest_reported_threshold_wins_and_is_named() -> None:
    assert onset_of(info()) == Onset(83.0, "target")
    assert onset_of(info(temp_target_c=None)) == Onset(88.0, "gpu_max")
    assert onset_of(info(temp_target_c=None, temp_gpu_max_c=None)) == Onset(93.0, "slowdown")
    # A target set above SLOWDOWN (a user's choice) does not hide the hardware slowdown.
    assert onset_of(info(temp_target_c=95.0, temp_gpu_max_c=None)) == Onset(93.0, "slowdown")


def test_the_learned_threshold_stands_in_only_where_none_is_reported() -> None:
    none = info(temp_target_c=None, temp_gpu_max_c=None, temp_slowdown_c=None)
    assert onset_of(none) is None
    assert onset_of(none, learned_c=81.0) == Onset(81.0, "learned")
    assert onset_of(info(), learned_c=70.0) == Onset(83.0, "target")
    assert throttle_onset(target_c=0.0, gpu_max_c=None, slowdown_c=None) is None  # 0: "not set"


def sample(temp: float, reasons: int, uuid: str = "GPU-a", index: int = 0) -> GpuSample:
    return GpuSample(ts=1.0, gpu_index=index, uuid=uuid, temp_c=temp, throttle_reasons=reasons)


def test_the_learner_keeps_the_first_temperature_with_sw_thermal_slowdown() -> None:
    learner = SlowdownLearner({"GPU-old": 79.0})
    assert learner.add(sample(80.0, 0x4)) is None  # SwPowerCap is not heat
    assert learner.add(sample(84.0, 0x20)) == ("GPU-a", 84.0)
    assert learner.add(sample(86.0, 0x20)) is None  # once per card
    assert learner.get("GPU-a") == 84.0 and learner.get("GPU-old") == 79.0
    assert learner.add(sample(84.0, 0x20, uuid="GPU-old")) is None


def test_the_fake_answers_every_threshold_or_not_supported() -> None:
    clock = FakeClock()
    p = load_scenario("demo").gpu
    nvml = FakeNvml([StandaloneDevice(p)], clock)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    get = nvml.nvmlDeviceGetTemperatureThreshold
    assert get(h, pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR) == 83
    assert get(h, pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN) == 65
    assert get(h, pynvml.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX) == 91
    assert get(h, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX) == 88
    assert get(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 93
    for kind in (
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPS_CURR,
    ):
        try:
            get(h, kind)
        except pynvml.NVMLError_NotSupported:
            pass
        else:
            raise AssertionError(f"threshold {kind} should be unsupported on this card")
    nvml.nvmlShutdown()


def test_a_card_that_reports_no_threshold_gets_none_from_the_reader() -> None:
    import dataclasses

    clock = FakeClock()
    p = dataclasses.replace(
        load_scenario("demo").gpu, nvml_unsupported_thresholds="acoustic_curr,gpu_max,slowdown"
    )
    reader = NvmlReader(nvml=FakeNvml([StandaloneDevice(p)], clock), clock=clock)
    try:
        assert reader.start()
        got = reader.infos()[0]
        assert (got.temp_target_c, got.temp_gpu_max_c, got.temp_slowdown_c) == (None, None, None)
        assert onset_of(got) is None
        samples, _ = reader.sample()
        assert samples[0].temp_target_c is None
    finally:
        reader.stop()


def test_the_reader_reads_the_target_temperature() -> None:
    clock = FakeClock()
    reader = NvmlReader(
        nvml=FakeNvml([StandaloneDevice(load_scenario("demo").gpu)], clock), clock=clock
    )
    try:
        assert reader.start()
        assert reader.infos()[0].temp_target_c == 83.0
        samples, _ = reader.sample()
        assert samples[0].temp_target_c == 83.0
        assert onset_of(reader.infos()[0]) == Onset(83.0, "target")
    finally:
        reader.stop()


def test_two_cards_only_the_second_overheats_and_it_is_the_one_judged() -> None:
    clock = FakeClock()
    nvml, _ = two_gpu_nvml(load_scenario("demo").gpu, clock, load=1.0)
    reader = NvmlReader(nvml=nvml, clock=clock)
    try:
        assert reader.start()
        clock.now = 1200.0  # twenty minutes at full load
        samples, _ = reader.sample()
        pids = reader.compute_pids()
        assert pids == {0: {TWO_GPU_ENGINE_PID}, 1: {TWO_GPU_ENGINE_PID}}
        infos = {i.index: i for i in reader.infos()}
        onsets = {i: onset_of(infos[i]) for i in infos}
        assert onsets[1] == Onset(88.0, "gpu_max")  # the second card reports no target
        cool, hot = samples
        assert hot.temp_c is not None and cool.temp_c is not None and hot.temp_c > cool.temp_c
        assert hot.throttle_reasons is not None and hot.throttle_reasons & 0x20
        assert not (cool.throttle_reasons or 0) & 0x20
        wanted = serving_indices(pids, {TWO_GPU_ENGINE_PID}, [0, 1])
        assert wanted == [0, 1]
        assert worst_gpu([s for s in samples if s.gpu_index in wanted], onsets) == hot
    finally:
        reader.stop()


def test_serving_gpus_follow_the_engines_processes() -> None:
    pids = {0: {10}, 1: {77, 78}, 2: set()}
    assert serving_indices(pids, {77, 99}, [0, 1, 2]) == [1]
    assert serving_indices(pids, {5}, [0, 1, 2]) == [0, 1, 2]  # unknown: all sampled
    assert serving_indices({}, set(), [0]) == [0]


def test_the_worst_gpu_is_the_one_nearest_its_own_threshold() -> None:
    a = GpuSample(ts=1.0, gpu_index=0, temp_c=80.0, sm_clock_mhz=1900, sm_clock_max_mhz=1950)
    b = GpuSample(ts=1.0, gpu_index=1, temp_c=78.0, sm_clock_mhz=1900, sm_clock_max_mhz=1950)
    # b runs cooler but its clocks fall at 79 °C, a's at 88 °C.
    assert worst_gpu([a, b], {0: Onset(88.0, "gpu_max"), 1: Onset(79.0, "learned")}) == b
    assert worst_gpu([a, b], {}) == a
    assert worst_gpu([], {}) is None
