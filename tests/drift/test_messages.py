"""The chat-slowed line's GPU part: what it says of the temperature."""

from __future__ import annotations

from llm_watchdog.drift.messages import latency_message


def gpu(temp_c: float, slope: float, onset: float | None = 83.0) -> dict[str, object]:
    return {
        "gpu_index": 0,
        "gpu_temp_c": temp_c,
        "temp_slope_c_per_min": slope,
        "temp_slowdown_c": onset,
        "sm_clock_mhz": 600.0,
        "sm_clock_max_mhz": 1950.0,
    }


def test_a_card_still_climbing_toward_its_slowdown_is_rising() -> None:
    line = latency_message("thermal", 900.0, 400.0, gpu(80.0, 9.0))
    assert "GPU 0 80 °C rising 9.0 °C/min, SM 600/1950 MHz" in line


def test_a_card_held_at_its_slowdown_is_not_said_to_rise() -> None:
    # 85 °C and flat for a while, under a thermal slowdown: the slope is the climb that
    # brought it there, and "rising 85.6 °C/min" describes a card that no longer moves.
    line = latency_message("thermal", 900.0, 400.0, gpu(85.0, 85.6))
    assert "GPU 0 85 °C, SM 600/1950 MHz" in line and "rising" not in line
    # Without a known threshold the slope is all there is.
    assert "rising 85.6 °C/min" in latency_message("thermal", 900.0, 400.0, gpu(85.0, 85.6, None))
