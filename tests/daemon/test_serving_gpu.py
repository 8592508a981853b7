"""The daemon judges heat on the GPUs that serve the engine, the worst of them, against the
threshold where their clocks fall; a card that reports none has it learned and kept."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from llm_watchdog.daemon.service import Daemon
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.nvml.thresholds import Onset
from llm_watchdog.sim.fakenvml import FakeNvml, StandaloneDevice, two_gpu_nvml
from llm_watchdog.sim.scenario import load_scenario
from llm_watchdog.store.db import Store
from llm_watchdog.store.thresholds import learned_thresholds
from tests.daemon.test_daemon import settings_for
from tests.helpers.builders import FakeClock
from tests.helpers.streamserver import StreamServer


def test_the_hot_second_card_of_two_is_the_one_judged_and_named(db_path) -> None:
    clock = FakeClock(1_700_000_000.0)
    nvml, _ = two_gpu_nvml(load_scenario("demo").gpu, clock, load=1.0)
    # This test process stands in for the engine: NVML lists it on both cards.
    for i in range(2):
        nvml.set_compute_pids(i, [os.getpid()])
    with StreamServer(answer="Paris") as srv, Store(db_path) as store:
        daemon = Daemon(settings_for(srv.url, db_path), store, nvml=nvml, clock=clock)
        daemon.startup()
        try:
            clock.now += 1200.0  # twenty minutes at full load: the second card throttles
            daemon.sample_gpu()
            gpu = daemon.serving_gpu()
            daemon.probe_once()
        finally:
            daemon.shutdown(timeout_s=2)
        assert gpu is not None and gpu.gpu_index == 1
        assert daemon.onset(gpu) == Onset(88.0, "gpu_max")  # no target on that card
        state = daemon.judge.monitor.snapshot() if daemon.judge else {}
    assert state["probes"] == 1


def test_behind_the_gateway_the_cards_judged_are_the_engines_not_the_gateways(
    db_path,
) -> None:
    # The engine runs on card 0; another job, also a child of this process, on card 1, which
    # throttles. The probed port is the gateway's: its process (this one) and its children
    # would match both cards; the engine's pid from the gateway's identity matches card 0.
    clock = FakeClock(1_700_000_000.0)
    nvml, _ = two_gpu_nvml(load_scenario("demo").gpu, clock, load=1.0)
    helper = Path(__file__).resolve().parents[1] / "helpers" / "streamserver.py"
    engine = subprocess.Popen(
        [sys.executable, str(helper), "--answer", "Paris"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert engine.stdout is not None
        engine_url = engine.stdout.readline().strip()
        nvml.set_compute_pids(0, [engine.pid])
        nvml.set_compute_pids(1, [other.pid])
        config = GatewayConfig(upstream_url=engine_url, listen_port=0, shutdown_timeout_s=2.0)
        with GatewayServer(config) as gw, Store(db_path) as store:
            daemon = Daemon(settings_for(gw.url, db_path), store, nvml=nvml, clock=clock)
            daemon.startup()
            try:
                clock.now += 1200.0  # card 1 throttles
                daemon.sample_gpu()
                gpu = daemon.serving_gpu()
            finally:
                daemon.shutdown(timeout_s=2)
        assert gpu is not None and gpu.gpu_index == 0
    finally:
        for proc in (other, engine):
            proc.kill()
            proc.wait(timeout=10)
        for pipe in (engine.stdin, engine.stdout):
            if pipe is not None:
                pipe.close()


def test_gpu_indices_name_the_cards_to_judge(db_path) -> None:
    clock = FakeClock(1_700_000_000.0)
    nvml, _ = two_gpu_nvml(load_scenario("demo").gpu, clock, load=1.0)
    with StreamServer(answer="Paris") as srv, Store(db_path) as store:
        settings = settings_for(srv.url, db_path)
        settings = dataclasses.replace(settings, gpu=dataclasses.replace(settings.gpu, indices=[0]))
        daemon = Daemon(settings, store, nvml=nvml, clock=clock)
        daemon.startup()
        try:
            clock.now += 1200.0
            daemon.sample_gpu()
            gpu = daemon.serving_gpu()
        finally:
            daemon.shutdown(timeout_s=2)
    assert gpu is not None and gpu.gpu_index == 0


def test_a_card_without_thresholds_has_its_first_throttle_learned_and_kept(db_path) -> None:
    clock = FakeClock(1_700_000_000.0)
    p = dataclasses.replace(
        load_scenario("demo").gpu,
        ambient_c=70.0,  # the fans have stopped
        nvml_unsupported_thresholds="acoustic_curr,gpu_max,slowdown",
    )
    with StreamServer(answer="Paris") as srv:
        for _ in range(2):  # a second start reads what the first learned
            nvml = FakeNvml([StandaloneDevice(p, load=1.0, start_s=clock.now)], clock)
            with Store(db_path) as store:
                daemon = Daemon(settings_for(srv.url, db_path), store, nvml=nvml, clock=clock)
                daemon.startup()
                try:
                    first = daemon.onset(daemon.sample_gpu()[0])
                    for _ in range(120):  # ten seconds a sample, twenty minutes
                        clock.now += 10.0
                        daemon.sample_gpu()
                    later = daemon.onset(daemon.serving_gpu())
                finally:
                    daemon.shutdown(timeout_s=2)
                kept = learned_thresholds(store)
    assert first is not None and first.source == "learned"  # from the first start
    assert later is not None and later.source == "learned" and 83.0 <= later.temp_c <= 85.0
    assert kept == {p.uuid: later.temp_c}
