"""The real-time lab over real sockets: SSE shape, answers, metrics, heat seen by the
project's own probe and NVML reader."""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import time

import httpx
import pytest

from llm_watchdog.nvml.reader import NvmlReader
from llm_watchdog.probe.client import ProbeOptions, Prober
from llm_watchdog.probe.engine import detect_engine
from llm_watchdog.probe.sets import load_probe_set
from llm_watchdog.sim.gpu import THROTTLE_BITS
from llm_watchdog.sim.scenario import Scenario, load_scenario
from llm_watchdog.sim.server import LabError, SimLab

QUESTION = "What is the capital of France? Answer in one word."


def events(lines: list[str]) -> list[str]:
    return [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]


@pytest.fixture(scope="module")
def lab() -> SimLab:
    with SimLab("workstation", batch_streams=0) as lab:
        yield lab


def test_streams_sse_like_an_openai_compatible_engine(lab: SimLab) -> None:
    body = {
        "model": lab.scenario.engine.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": QUESTION}],
    }
    with httpx.Client(base_url=lab.url, timeout=10) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            data = events(list(resp.iter_lines()))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert "paris" in text.lower()
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert len({c["id"] for c in chunks}) == 1


def test_tokens_are_paced_by_the_engine(lab: SimLab) -> None:
    body = {"stream": True, "max_tokens": 20, "messages": [{"role": "user", "content": "Tell me."}]}
    stamps = []
    with httpx.Client(base_url=lab.url, timeout=10) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            for line in resp.iter_lines():
                if '"content"' in line:
                    stamps.append(time.perf_counter())
    assert len(stamps) == 21  # role chunk + 20 tokens (max_tokens cut the filler short)
    gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]
    step_s = lab.scenario.engine.step_base_ms / 1000
    assert sorted(gaps)[len(gaps) // 2] >= 0.8 * step_s  # one token per engine step


def test_the_project_probe_passes_every_default_prompt(lab: SimLab) -> None:
    info = detect_engine(lab.url)
    assert info.engine == "vllm" and info.models == (lab.scenario.engine.model,)
    probe_set = load_probe_set("default")
    with Prober(lab.url, info.models[0], ProbeOptions(engine=info.engine)) as prober:
        results = [prober.probe(p, probe_set.name) for p in probe_set.prompts]
    assert [r.error_detail for r in results if not r.ok] == []
    assert all(r.quality_pass for r in results)
    assert all(r.ttft_ms is not None and r.ttft_ms > 0 for r in results)


def test_non_streaming_and_errors(lab: SimLab) -> None:
    with httpx.Client(base_url=lab.url, timeout=10) as client:
        r = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "What is 2 + 2? Answer with a number."}]
            },
        )
        assert r.status_code == 200 and "4" in r.json()["choices"][0]["message"]["content"]
        bad = client.post("/v1/chat/completions", json={"messages": "hi"})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
        wrong = client.post(
            "/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        )
        assert wrong.status_code == 404 and "nope" in wrong.json()["error"]["message"]
        assert client.get("/version").json()["version"]
        metrics = client.get("/metrics").text
    assert 'vllm:num_requests_running{model_name="' in metrics
    assert "vllm:num_requests_waiting{" in metrics


def test_a_client_that_goes_away_frees_its_place() -> None:
    with SimLab("workstation", batch_streams=0) as lab:
        body = {
            "stream": True,
            "max_tokens": 2000,
            "messages": [{"role": "user", "content": "Go on."}],
        }
        with httpx.Client(base_url=lab.url, timeout=10) as client:
            with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                lines = resp.iter_lines()  # held: dropping it would close the connection
                for line in lines:
                    if '"content"' in line:
                        break
                assert lab.state()["running"] == 1
                resp.close()
                deadline = time.monotonic() + 3
                while lab.state()["running"] and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert lab.state()["running"] == 0
                del lines


def prompt_tokens_total(client: httpx.Client) -> int:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("vllm:prompt_tokens_total{"):
            return int(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:prompt_tokens_total in /metrics")


def test_llamacpp_pose_answers_props_and_caches_prompts() -> None:
    with SimLab("llamacpp-cpu", batch_streams=0) as lab:
        assert detect_engine(lab.url).engine == "llamacpp"
        body = {"max_tokens": 1, "messages": [{"role": "user", "content": QUESTION}]}
        prefilled = []
        with httpx.Client(base_url=lab.url, timeout=10) as client:
            for cache in (True, True, False):
                before = prompt_tokens_total(client)
                resp = client.post("/v1/chat/completions", json={**body, "cache_prompt": cache})
                assert resp.status_code == 200
                prefilled.append(prompt_tokens_total(client) - before)
    cold, cached, busted = prefilled
    assert cold > 10 and cached == 1 and busted == cold  # `cache_prompt: false` prefills all


def test_a_port_in_use_is_a_one_line_error() -> None:
    with SimLab("workstation", batch_streams=0) as first:
        port = int(first.url.rsplit(":", 1)[1])
        with pytest.raises(LabError, match=rf"cannot listen on 127.0.0.1:{port}"):
            SimLab("workstation", port=port).start()


def steady_decode_heat_scenario() -> Scenario:
    """The consumer card under a batch job that decodes long answers (steady steps, no prefill
    bursts to blur TTFT); compressed 40× its heat reaches GPU_MAX within seconds (τ = 6 s)."""
    sc = load_scenario("consumer-warm-room")
    return dataclasses.replace(
        sc,
        engine=dataclasses.replace(sc.engine, load_full_batch_tokens=24),
        batch=dataclasses.replace(
            sc.batch,
            streams=24,
            prompt_tokens_min=50,
            prompt_tokens_max=60,
            output_tokens_min=50_000,
            output_tokens_max=60_000,
        ),
    )


@pytest.mark.slow
def test_probe_and_nvml_reader_see_the_heat_over_real_sockets() -> None:
    sc = steady_decode_heat_scenario()
    probe_set = load_probe_set("default")
    prompt = probe_set.prompts[0]
    rows = []
    with SimLab(sc, time_scale=40) as lab:
        reader = NvmlReader(nvml=lab.nvml, clock=time.time)
        with Prober(lab.url, lab.scenario.engine.model, ProbeOptions()) as prober:
            try:
                assert reader.start()
                while lab.now() < 14.0:
                    sample, _ = reader.sample()
                    result = prober.probe(prompt, probe_set.name)
                    assert result.ok and result.quality_pass, result.error_detail
                    rows.append((lab.now(), sample[0], result))
            finally:
                reader.stop()
    early = [(s, r) for t, s, r in rows if 0.3 < t < 2.0]
    late = [(s, r) for t, s, r in rows if t > 11.0]
    assert len(early) >= 4 and len(late) >= 4
    assert min(s.temp_c for s, _ in late) >= 80 > max(s.temp_c for s, _ in early)
    assert max(s.sm_clock_mhz for s, _ in late) < min(s.sm_clock_mhz for s, _ in early) - 100
    assert all(s.throttle_reasons & THROTTLE_BITS for s, _ in late)
    assert any(s.thermal_violation_ms for s, _ in late)
    early_ms = statistics.median(r.ttft_ms for _, r in early)
    late_ms = statistics.median(r.ttft_ms for _, r in late)
    assert late_ms > 1.1 * early_ms, (early_ms, late_ms, [s.sm_clock_mhz for s, _ in late])
