"""Cold starts: probes that measure a model load or a fresh process, not steady-state chat.

They are recorded and shown apart, never fed to a baseline or the detector; a cold start
slower than `cold_start_limit_ms` is an event of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ollama reports `load_duration` on every native response; a warm model answers with a load
# time of a few milliseconds, a load from disk takes hundreds of ms to minutes. 100 ms sits
# well between the two.
LOAD_DURATION_COLD_MS = 100.0


@dataclass(frozen=True)
class ColdVerdict:
    cold: bool
    # "first_probe", "engine_changed", "engine_restarted", "model_loaded", "idle"; None if warm
    reason: str | None

    def __bool__(self) -> bool:
        return self.cold


def classify_cold(
    *,
    ts: float,
    previous_ts: float | None,
    fingerprint_id: str | None = None,
    previous_fingerprint_id: str | None = None,
    engine_pid: int | None = None,
    previous_engine_pid: int | None = None,
    load_duration_ms: float | None = None,
    idle_after_s: float = 300.0,
) -> ColdVerdict:
    """Whether a probe at `ts` is a cold start, and why.

    `previous_ts` is the previous probe to the same engine (None: the first since the daemon
    started). A changed fingerprint (model, engine version, launch command) or engine process
    id means a restarted engine; `load_duration_ms` is Ollama's evidence of a model load; a gap
    longer than `idle_after_s` means the engine may have unloaded the model (Ollama's default
    keep_alive is 5 minutes) or the GPU dropped to idle clocks.
    """
    if previous_ts is None:
        return ColdVerdict(True, "first_probe")
    if (
        fingerprint_id is not None
        and previous_fingerprint_id is not None
        and fingerprint_id != previous_fingerprint_id
    ):
        return ColdVerdict(True, "engine_changed")
    if (
        engine_pid is not None
        and previous_engine_pid is not None
        and engine_pid != previous_engine_pid
    ):
        return ColdVerdict(True, "engine_restarted")
    if load_duration_ms is not None and load_duration_ms >= LOAD_DURATION_COLD_MS:
        return ColdVerdict(True, "model_loaded")
    if ts - previous_ts > idle_after_s:
        return ColdVerdict(True, "idle")
    return ColdVerdict(False, None)
