"""The daemon itself against the heat lab over real sockets: its NVML reader reads the
simulated card, its probes go to the simulated engine, and the rows it writes show the heat."""

from __future__ import annotations

import statistics

import pytest

from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.sim.gpu import THROTTLE_BITS
from llm_watchdog.sim.server import SimLab
from llm_watchdog.store.db import Store
from tests.sim.test_server import steady_decode_heat_scenario


@pytest.mark.slow
def test_daemon_rows_show_rising_temperature_falling_clocks_reason_bits_rising_ttft(db_path):
    sc = steady_decode_heat_scenario()
    with SimLab(sc, time_scale=40) as lab, Store(db_path) as store:
        settings = settings_from_dict(
            {
                "server": {"url": lab.url},
                "storage": {"path": str(db_path)},
                "drift": {"baseline_probes": 20},
                "api": {"listen": ""},
            },
            "t.toml",
        )
        daemon = Daemon(settings, store, nvml=lab.nvml)
        daemon.startup()
        try:
            while lab.now() < 14.0:
                daemon.sample_gpu()
                daemon.probe_once()
        finally:
            daemon.shutdown(timeout_s=5)
        t0 = store.probes()[0]["ts"]
        probes = store.probes()
        gpu = store.gpu_samples()
        fp = store.latest_fingerprint()
    assert fp["gpu_name"].startswith("NVIDIA GeForce RTX 3090") and fp["engine"] == "vllm"
    early = [g for g in gpu if g["ts"] - t0 < 2.0]
    late = [g for g in gpu if g["ts"] - t0 > 11.0]
    assert early and late
    assert min(g["temp_c"] for g in late) >= 80 > max(g["temp_c"] for g in early)
    assert max(g["sm_clock_mhz"] for g in late) < min(g["sm_clock_mhz"] for g in early) - 100
    assert all(g["throttle_reasons"] & THROTTLE_BITS for g in late)
    early_ttft = statistics.median(
        p["ttft_ms"] for p in probes if p["ts"] - t0 < 2.0 and not p["cold"]
    )
    late_ttft = statistics.median(p["ttft_ms"] for p in probes if p["ts"] - t0 > 11.0)
    assert all(p["ok"] and p["quality_pass"] for p in probes)
    assert late_ttft > 1.1 * early_ttft, (early_ttft, late_ttft)
