"""The fleet path end to end: a real Prometheus (Debian's) scrapes two boxes' daemon /metrics,
and `report --prometheus` and `history --prometheus` read them back per instance."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.daemon.api import ApiServer, ProbeMetrics
from llm_watchdog.nvml.throttle import SW_POWER_CAP, SW_THERMAL_SLOWDOWN
from llm_watchdog.report.prometheus import PrometheusError, fleet, from_prometheus
from tests.daemon.test_api import status_of

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (.ci/run installs Debian's prometheus)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Box:
    """One box's daemon endpoint, with canaries landing while Prometheus scrapes."""

    def __init__(self, ttft_ms: float, temp_c: float, reasons: int) -> None:
        self.probes = ProbeMetrics()
        st = status_of()
        st["gpus"][0]["temp_c"] = temp_c
        st["gpus"][0]["throttle_reasons"] = reasons
        self.api = ApiServer("127.0.0.1", 0, lambda: st, self.probes).start()
        self.ttft_ms = ttft_ms
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._probe, daemon=True)
        self.thread.start()

    def _probe(self) -> None:
        while not self.stop.wait(0.05):
            self.probes.add(True, None, self.ttft_ms, False, True, model_name="m", engine="vllm")

    @property
    def instance(self) -> str:
        return self.api.url.removeprefix("http://")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.api.stop()


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Box, Box]]:
    # The cool box at its power cap; the hot one slowed by heat, at its cap as well.
    fast = Box(ttft_ms=80.0, temp_c=62.0, reasons=SW_POWER_CAP)
    hot = Box(ttft_ms=1800.0, temp_c=86.0, reasons=SW_THERMAL_SLOWDOWN | SW_POWER_CAP)
    work = tmp_path_factory.mktemp("prom")
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: llm-watchdog\n"
        f"    static_configs: [{{targets: ['{fast.instance}', '{hot.instance}']}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = httpx.get(
                    url + "/api/v1/query",
                    params={"query": "count(rate(llm_watchdog_ttft_seconds_count[1m]) > 0)"},
                    timeout=2,
                )
                result = r.json()["data"]["result"]
                if result and float(result[0]["value"][1]) == 2:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape both boxes within 60 s")
        yield url, fast, hot
    finally:
        proc.terminate()
        proc.wait(10)
        fast.close()
        hot.close()


@pytest.mark.slow
@needs_prometheus
def test_report_reads_one_box_from_prometheus(prom: tuple[str, Box, Box]) -> None:
    url, fast, hot = prom
    now = time.time()
    r = from_prometheus(url, now - 120, now, instance=hot.instance)
    p95 = [v for v in r.ttft_p95_ms.values if v is not None]
    temps = [v for v in r.temp_c.values if v is not None]
    # 1.8 s canaries land in the (1 s, 2.5 s] bucket; the 86 °C box, not the 62 °C one.
    assert p95 and 1000 < max(p95) <= 2500, p95
    assert temps and set(temps) == {86.0}
    assert r.target_p95_ms == 1500.0
    assert r.throttled and all(p.label.startswith("heat:") for p in r.throttled), r.throttled
    cool = from_prometheus(url, now - 120, now, instance=fast.instance)
    assert cool.throttled and all(p.label.startswith("power cap:") for p in cool.throttled)
    assert [p.label for p in r.drift][:1] == ["chat_slowed (thermal)"]
    assert r.scatter and not r.notes
    # histogram_quantile over a rate: each point is the 5 minutes before it, not a window.
    assert r.window_label == "over the 5 min before each point"


@pytest.mark.slow
@needs_prometheus
def test_history_lists_the_fleet_one_row_per_box(prom: tuple[str, Box, Box]) -> None:
    url, fast, hot = prom
    rows: dict[str, dict[str, Any]] = {row["instance"]: row for row in fleet(url)}
    assert set(rows) == {fast.instance, hot.instance}
    assert rows[hot.instance]["temp_c"] == 86.0 and rows[fast.instance]["temp_c"] == 62.0
    assert rows[hot.instance]["up"] == 1.0
    result = CliRunner().invoke(cli, ["history", "--prometheus", url, "--csv"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("instance,up,canary_p95_ms,temp_c")


@pytest.mark.slow
@needs_prometheus
def test_report_cli_writes_a_fleet_page(prom: tuple[str, Box, Box], tmp_path: Path) -> None:
    url, _, _ = prom
    out = tmp_path / "fleet.html"
    result = CliRunner().invoke(
        cli, ["report", "--prometheus", url, "--since", "5m", "--out", str(out), "--target", "1s"]
    )
    assert result.exit_code == 0, result.output
    assert "fleet" in out.read_text()


def test_a_url_that_is_not_prometheus_says_so() -> None:
    with pytest.raises(PrometheusError, match="give the Prometheus URL"):
        fleet("localhost:9090")
    api = ApiServer("127.0.0.1", 0, status_of, ProbeMetrics()).start()
    try:
        with pytest.raises(PrometheusError, match="is this Prometheus"):
            fleet(api.url)
    finally:
        api.stop()
