"""The llamacpp-cpu scenario against what a real llama.cpp server measured (see its header).

Measured: llama-server, SmolLM2-135M on 2 CPU cores, --parallel 8, cache-busted chat canary.
The lab must reproduce the shape: the tail explodes while the median barely moves, and
batch throughput saturates early.
"""

from __future__ import annotations

import dataclasses

import pytest

from llm_watchdog.sim.scenario import load_scenario
from llm_watchdog.sim.virtual import RunResult, run_virtual

MEASURED_P50_MS = {0: 159, 2: 192, 4: 211, 7: 279}
MEASURED_P95_MS = {0: 182, 2: 5960, 4: 10100, 7: 6700}
MEASURED_CHARS_PER_S = {2: 29, 7: 41}


@pytest.fixture(scope="module")
def runs() -> dict[int, RunResult]:
    sc = load_scenario("llamacpp-cpu")
    return {n: run_virtual(sc, 1800, batch_streams=n, seed=1) for n in MEASURED_P50_MS}


def test_without_batch_chat_ttft_matches_the_measurement(runs: dict[int, RunResult]) -> None:
    r = runs[0]
    assert r.chat_ttft_p50_ms == pytest.approx(MEASURED_P50_MS[0], rel=0.15)
    assert r.chat_ttft_p95_ms == pytest.approx(MEASURED_P95_MS[0], rel=0.15)


@pytest.mark.parametrize("streams", [2, 4, 7])
def test_batch_explodes_the_tail_but_barely_moves_the_median(
    runs: dict[int, RunResult], streams: int
) -> None:
    base, r = runs[0], runs[streams]
    assert base.chat_ttft_p50_ms is not None and base.chat_ttft_p95_ms is not None
    assert r.chat_ttft_p50_ms is not None and r.chat_ttft_p95_ms is not None
    # measured: p50 ×1.2 .. ×1.75, p95 ×33 .. ×55
    assert r.chat_ttft_p50_ms < 2.0 * base.chat_ttft_p50_ms
    assert r.chat_ttft_p95_ms > 15 * base.chat_ttft_p95_ms
    assert 3000 < r.chat_ttft_p95_ms < 15000  # seconds, as measured (6–10 s)


def test_batch_throughput_saturates_early(runs: dict[int, RunResult]) -> None:
    two, seven = runs[2].batch_chars_per_s, runs[7].batch_chars_per_s
    assert two == pytest.approx(MEASURED_CHARS_PER_S[2], rel=0.3)
    assert seven == pytest.approx(MEASURED_CHARS_PER_S[7], rel=0.3)
    assert seven / two < 2.0  # 3.5× the streams, well under 2× the output (measured 1.41×)
    assert runs[4].batch_chars_per_s <= seven * 1.05


def test_four_slots_with_cached_prompts_match_the_measured_median() -> None:
    """--parallel 4, prompts cached (one token to prefill), batch streams decoding: measured
    chat TTFT p50 17, 29, 37, 49 ms with 0, 1, 2, 3 batch streams."""
    sc = load_scenario("llamacpp-cpu")
    sc = dataclasses.replace(
        sc,
        engine=dataclasses.replace(sc.engine, max_running_seqs=4),
        chat=dataclasses.replace(sc.chat, prompt_tokens_min=1, prompt_tokens_max=1),
        batch=dataclasses.replace(
            sc.batch,
            prompt_tokens_min=1,
            prompt_tokens_max=1,
            output_tokens_min=400,
            output_tokens_max=600,
            think_time_s=0.0,
            max_requests_per_s=0.0,
        ),
    )
    measured = [17, 29, 37, 49]
    got = []
    for n, want in enumerate(measured):
        r = run_virtual(sc, 300, batch_streams=n, seed=2)
        assert r.chat_ttft_p50_ms is not None
        assert r.chat_ttft_p50_ms == pytest.approx(want, rel=0.25)
        got.append(r.chat_ttft_p50_ms)
    assert got == sorted(got)
