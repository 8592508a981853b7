"""Where a GPU's clocks start to fall under heat: the threshold heat is judged against.

Pure: GpuInfo and GpuSample values in, an `Onset` out; no NVML call, no clock. NVML reports
several temperature thresholds (nvml.h, nvmlTemperatureThresholds_t). The one that matters
for chat latency is where the driver's software slowdown begins, which is the lowest of:

- ACOUSTIC_CURR, the "GPU Target Temperature" of `nvidia-smi -q`: on GeForce cards the
  driver lowers clocks to hold it (83 °C on most), well below SLOWDOWN;
- GPU_MAX, the "GPU Max Operating Temperature";
- SLOWDOWN, where hardware slowdown (clock halved or worse) engages.

A card may leave any of them unsupported. With none reported, the temperature at which this
card (by UUID) was first seen to raise SwThermalSlowdown stands in: `SlowdownLearner` finds it
from samples, and the store keeps it across restarts (llm_watchdog.store.thresholds).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_watchdog.models import GpuInfo, GpuSample
from llm_watchdog.nvml.throttle import SW_THERMAL_SLOWDOWN

# Names as evidence and alert messages spell them, with what a person reads next to
# `nvidia-smi -q -d TEMPERATURE`.
SOURCES = {
    "target": "target temperature",
    "gpu_max": "max operating temperature",
    "slowdown": "slowdown temperature",
    "learned": "temperature it first throttled at",
}


@dataclass(frozen=True)
class Onset:
    """The temperature where clocks start to fall, and which threshold it came from."""

    temp_c: float
    source: str  # one of SOURCES

    @property
    def label(self) -> str:
        return SOURCES[self.source]


def throttle_onset(
    *,
    target_c: float | None,
    gpu_max_c: float | None,
    slowdown_c: float | None,
    learned_c: float | None = None,
) -> Onset | None:
    """The lowest reported threshold; else the learned one; None when nothing is known.

    On a tie the earlier name in SOURCES is kept: "target" says more than "gpu_max".
    """
    reported = [
        Onset(t, name)
        for t, name in ((target_c, "target"), (gpu_max_c, "gpu_max"), (slowdown_c, "slowdown"))
        if t is not None and t > 0
    ]
    if reported:
        return min(reported, key=lambda o: o.temp_c)
    if learned_c is not None:
        return Onset(learned_c, "learned")
    return None


def onset_of(info: GpuInfo | None, learned_c: float | None = None) -> Onset | None:
    """`throttle_onset` over one GPU's fixed facts."""
    if info is None:
        return None if learned_c is None else Onset(learned_c, "learned")
    return throttle_onset(
        target_c=info.temp_target_c,
        gpu_max_c=info.temp_gpu_max_c,
        slowdown_c=info.temp_slowdown_c,
        learned_c=learned_c,
    )


class SlowdownLearner:
    """The temperature each card (by UUID) was first seen to raise SwThermalSlowdown at.

    `add` returns (uuid, temp_c) the first time a card shows the bit, so the caller stores it
    once; `known` seeds it with what was stored before.
    """

    def __init__(self, known: dict[str, float] | None = None) -> None:
        self.learned: dict[str, float] = dict(known or {})

    def add(self, sample: GpuSample) -> tuple[str, float] | None:
        uuid, temp, mask = sample.uuid, sample.temp_c, sample.throttle_reasons
        if uuid is None or temp is None or mask is None or uuid in self.learned:
            return None
        if not mask & SW_THERMAL_SLOWDOWN:
            return None
        self.learned[uuid] = temp
        return uuid, temp

    def get(self, uuid: str | None) -> float | None:
        return None if uuid is None else self.learned.get(uuid)
