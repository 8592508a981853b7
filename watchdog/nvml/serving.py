"""Which GPUs serve the engine, and which of them heat and cause are judged on.

Pure: NVML's running compute processes and the engine's process tree in, GPU indices out. An
engine split over two cards (tensor parallel) runs at the pace of its slowest one, so drift is
judged on the worst of them: the one with thermal throttle bits on, else the one nearest (or
furthest past) the temperature its clocks fall at, else the one with the lowest clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_watchdog.models import GpuSample
from llm_watchdog.nvml.thresholds import Onset
from llm_watchdog.nvml.throttle import is_thermal

# Degrees under its threshold a card with none known is taken to be: SLOWDOWN on most cards
# sits near 90 °C, so temperature alone then ranks them.
UNKNOWN_ONSET_C = 90.0


def serving_indices(
    compute_pids: Mapping[int, set[int]], engine_pids: set[int], sampled: Sequence[int]
) -> list[int]:
    """The sampled GPUs running one of the engine's processes; all sampled ones when none is
    known to (no pid, a container hiding host pids, an engine behind another host)."""
    mine = [i for i in sampled if compute_pids.get(i, set()) & engine_pids]
    return mine or list(sampled)


def worst_gpu(samples: Sequence[GpuSample], onsets: Mapping[int, Onset | None]) -> GpuSample | None:
    """The sample of the GPU the engine waits on most (see the module docstring)."""

    def key(s: GpuSample) -> tuple[bool, float, float]:
        onset = onsets.get(s.gpu_index)
        limit = onset.temp_c if onset is not None else UNKNOWN_ONSET_C
        over = (s.temp_c - limit) if s.temp_c is not None else -1e9
        clock = (
            s.sm_clock_mhz / s.sm_clock_max_mhz
            if s.sm_clock_mhz is not None and s.sm_clock_max_mhz
            else 1.0
        )
        return (is_thermal(s.throttle_reasons), over, -clock)

    return max(samples, key=key) if samples else None
