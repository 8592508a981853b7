"""A report of a daemon without NVML (latency-only mode): said once, no empty GPU charts.

The databases come from the real daemon and store: canaries to a local streaming server,
NVML from a named fake scenario, time from an injected clock so the probes span minutes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from PIL import Image

from llm_watchdog.cli import cli
from llm_watchdog.config import settings_from_dict
from llm_watchdog.daemon.service import Daemon
from llm_watchdog.report.charts import CHARTS, DPI, HEIGHT_IN, charts_for, report_figure
from llm_watchdog.report.data import NO_BATCH_NOTE, NO_GPU_NOTE, Report, from_rows
from llm_watchdog.report.prometheus import from_prometheus
from llm_watchdog.store.db import Store
from tests.helpers.builders import FakeClock
from tests.helpers.fakenvml import scenario_basic, scenario_library_missing
from tests.helpers.streamserver import StreamServer

T0 = 1_796_100_000.0
CHART_IDS = re.compile(r'id="chart-(\w+)"')


def daemon_run(db: Path, nvml: Any, probes: int = 30, interval_s: float = 10.0) -> None:
    """`probes` canaries `interval_s` apart, with a GPU reading before each (none come back
    without NVML, as in the daemon's own loop)."""
    clock = FakeClock(T0)
    with StreamServer(answer="Paris") as srv, Store(db) as store:
        settings = settings_from_dict(
            {
                "server": {"url": srv.url, "model": "auto"},
                "probe": {"interval": f"{interval_s}s", "jitter": "0s"},
                "storage": {"path": str(db)},
            },
            "test.toml",
        )
        daemon = Daemon(settings, store, nvml=nvml, clock=clock)
        daemon.startup()
        try:
            for _ in range(probes):
                daemon.sample_gpu()
                daemon.probe_once()
                clock.now += interval_s
        finally:
            daemon.shutdown(timeout_s=2)


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("latency-only")
    made = {}
    scenarios: dict[str, Callable[[], Any]] = {
        "no_nvml": scenario_library_missing,
        "with_gpu": scenario_basic,
    }
    for name, scenario in scenarios.items():
        made[name] = folder / f"{name}.db"
        daemon_run(made[name], scenario())
    return made


def render(db: Path, out: Path) -> str:
    result = CliRunner().invoke(
        cli,
        ["report", "--db", str(db), "--since", str(int(T0 - 60)), "--until",
         str(int(T0 + 600)), "--target", "1s", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.output


def test_the_store_holds_probes_and_no_gpu_samples(databases: dict[str, Path]) -> None:
    with Store(databases["no_nvml"]) as store:
        assert len(store.probes()) == 30 and store.gpu_samples() == []
        assert [e["kind"] for e in store.gpu_events()] == ["nvml_unavailable"]
    with Store(databases["with_gpu"]) as store:
        assert store.gpu_samples(), "the GPU scenario wrote no samples: the contrast is void"


def test_a_latency_only_page_says_so_once_and_draws_no_gpu_chart(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    render(databases["no_nvml"], page)
    text = page.read_text()
    # No gateway either: the batch chart is left out too, with its own note.
    assert CHART_IDS.findall(text) == ["ttft"]
    assert text.count(NO_BATCH_NOTE) == 1
    assert 'id="chart-ttft" class="chart"' in text and 'data-drawn="1"' in text
    sentence = "No GPU telemetry was recorded in this span (latency-only mode"
    assert text.count(sentence) == 1
    assert "cannot be put down to heat or the power cap" in text
    # The latency facts stay; the GPU's are not shown as zeros.
    assert "<b>worst window p95</b>" in text and "<b>windows over target</b>" in text
    assert "peak temperature" not in text and "slowed by heat</b>" not in text
    # The tables start under the last chart, not where four charts would have ended.
    boxes = [tuple(map(int, m)) for m in re.findall(r'data-box="(\d+),(\d+),(\d+),(\d+)"', text)]
    tables_top = int(re.search(r"#tables \{[^}]*top:(\d+)px", text).group(1))  # type: ignore[union-attr]
    assert tables_top - (boxes[-1][1] + boxes[-1][3]) < 100


def test_a_page_with_gpu_samples_still_draws_them(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    render(databases["with_gpu"], page)
    text = page.read_text()
    assert CHART_IDS.findall(text) == [name for name, _ in CHARTS if name != "batch"]
    for name in ("gpu", "scatter"):
        figure = re.search(rf'id="chart-{name}"[^>]*data-drawn="(\d)"', text)
        assert figure is not None and figure.group(1) == "1", f"{name} chart not drawn"
    assert "No GPU telemetry" not in text and "<b>peak temperature</b>" in text


def test_a_latency_only_png_is_shorter_and_carries_the_note(
    databases: dict[str, Path], tmp_path: Path
) -> None:
    heights = {}
    for name, db in databases.items():
        out = tmp_path / f"{name}.png"
        render(db, out)
        with Image.open(out) as img:
            heights[name] = img.size[1]
    # Two charts fewer; the note's lines take a little of that back.
    chart_px = HEIGHT_IN * DPI
    saved = heights["with_gpu"] - heights["no_nvml"]
    assert saved > 1.5 * chart_px, f"latency-only PNG only {saved} px shorter"
    assert saved < 2 * chart_px, f"latency-only PNG {saved} px shorter: the note was lost"
    # The picture has no page to carry the note: it is under the title, whole and once.
    title = " ".join(report_figure(report_of(databases["no_nvml"])).get_suptitle().splitlines())
    assert title.count(NO_GPU_NOTE) == 1 and title.count(NO_BATCH_NOTE) == 1
    title = " ".join(report_figure(report_of(databases["with_gpu"])).get_suptitle().splitlines())
    assert NO_GPU_NOTE not in title and title.count(NO_BATCH_NOTE) == 1


def report_of(db: Path) -> Report:
    with Store(db) as store:
        return from_rows(
            source=str(db),
            since_ts=T0 - 60,
            until_ts=T0 + 600,
            probes=store.probes(),
            gpu=store.gpu_samples(),
        )


def test_a_span_with_no_probes_is_not_called_latency_only(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    Store(db).close()
    page = tmp_path / "report.html"
    render(db, page)
    text = page.read_text()
    assert "No GPU telemetry" not in text and "is the daemon running?" in text
    assert CHART_IDS.findall(text) == [name for name, _ in CHARTS]


@pytest.mark.parametrize("with_gpu", [False, True], ids=["daemon_without_nvml", "with_gpu"])
def test_prometheus_without_gpu_series_is_latency_only(with_gpu: bool) -> None:
    # Canary TTFT histograms answer; the GPU series answer only where a card was read.
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        step_s = float(request.url.params["step"])
        result: list[dict[str, Any]] = []
        gpu_query = "gpu_temperature" in query or "gpu_sm_clock" in query
        if "histogram_quantile" in query or (with_gpu and gpu_query):
            values = [[T0 + step_s * i, "0.2" if "histogram" in query else "60"] for i in range(8)]
            result = [{"metric": {}, "values": values}]
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        return httpx.Response(200, content=json.dumps(body))

    r = from_prometheus(
        "http://prom.test:9090", T0, T0 + 600, transport=httpx.MockTransport(handler)
    )
    assert r.latency_only is not with_gpu
    assert (NO_GPU_NOTE in r.notes) is not with_gpu
    # Nor a batch series: its note is the other one.
    assert r.ttft_p95_ms and r.notes[-1] == NO_BATCH_NOTE
    assert len(r.notes) == (1 if with_gpu else 2)
    names = [name for name, _ in charts_for(r)]
    assert ("gpu" in names, "scatter" in names) == (with_gpu, with_gpu)
