"""`llm-watchdog report` from a heat-lab run, opened in headless Chromium: every chart drawn."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure
from PIL import Image

from llm_watchdog.cli import cli
from llm_watchdog.demo import DemoOptions, run_demo
from llm_watchdog.report.charts import _time_axis, draw_scatter, draw_ttft, report_png
from llm_watchdog.report.data import from_rows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (.ci/run installs Debian's chromium)"
)
BOX = re.compile(r'id="chart-(\w+)" class="chart" data-box="(\d+),(\d+),(\d+),(\d+)"')


@pytest.fixture(scope="module")
def heat_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A short demo: the heat lab heats, chat slows, the watchdog cuts and gives back."""
    db = tmp_path_factory.mktemp("heat") / "heat.db"
    run_demo(
        DemoOptions(duration_s=50, time_scale=40, baseline_probes=20, db_path=db),
        say=lambda line: None,
    )
    yield db


def coloured_share(img: Image.Image, box: tuple[int, int, int, int]) -> float:
    """Share of pixels in `box` that are a colour (not white, grey or black): data, not axes."""
    x, y, w, h = box
    rgb = np.asarray(img.convert("RGB"), dtype=np.int16)[y : y + h, x : x + w]
    spread = rgb.max(axis=2) - rgb.min(axis=2)
    return float((spread > 60).mean())


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_chromium
def test_report_page_draws_every_chart_in_chromium(heat_run: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = CliRunner().invoke(
        cli, ["report", "--db", str(heat_run), "--since", "10m", "--out", str(page)]
    )
    assert result.exit_code == 0, result.output
    text = page.read_text()
    boxes = {m.group(1): tuple(int(v) for v in m.groups()[1:]) for m in BOX.finditer(text)}
    assert set(boxes) == {"ttft", "gpu", "batch", "scatter"}
    assert 'data-drawn="0"' not in text, "a chart had nothing to draw"
    # The demo's probes carry the batch in flight: the headroom map has rows to show.
    assert "<h2>Headroom</h2>" in text and "<th>confidence</th>" in text
    shot = tmp_path / "shot.png"
    bottom = max(y + h for _, y, _, h in boxes.values()) + 40
    run = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size=1100,{bottom}",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), run.stderr[-2000:]
    img = Image.open(shot)
    assert img.size == (1100, bottom)
    for name, box in boxes.items():
        share = coloured_share(img, box)  # type: ignore[arg-type]
        # A chart with nothing to draw has axes, grid and grey text only: 0 coloured.
        assert share > 0.002, f"chart {name} looks blank in Chromium ({share:.4f} coloured)"
    # Between the charts the page is white: the boxes are where the charts are.
    x, y, w, h = boxes["ttft"]
    gap = (x, y + h + 2, w, 2)
    assert coloured_share(img, gap) == 0.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_report_png_and_what_it_says(heat_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.png"
    result = CliRunner().invoke(
        cli,
        ["report", "--db", str(heat_run), "--since", "10m", "--out", str(out), "--target", "1s"],
    )
    assert result.exit_code == 0, result.output
    assert "drift events" in result.output and "control actions" in result.output
    img = Image.open(out)
    assert img.size[0] == 1050 and img.size[1] > 1200
    assert coloured_share(img, (0, 0, img.size[0], img.size[1])) > 0.004


def test_an_empty_chart_has_no_coloured_pixels(tmp_path: Path) -> None:
    T0 = 1_796_100_000.0
    png = tmp_path / "empty.png"
    empty = from_rows(source="t", since_ts=T0, until_ts=T0 + 60, probes=[], gpu=[])
    png.write_bytes(report_png(empty))
    img = Image.open(png)
    assert coloured_share(img, (0, 0, img.size[0], img.size[1])) == 0.0


def test_bad_arguments_get_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["report", "--out", str(tmp_path / "r.pdf"), "--db", "x.db"])
    assert r.exit_code == 2 and ".html or .png" in r.output
    r = runner.invoke(cli, ["report", "--out", str(tmp_path / "r.html"), "--db", "nope.db"])
    assert r.exit_code == 1 and "no database at nope.db" in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(
        cli, ["report", "--out", str(tmp_path / "r.html"), "--prometheus", "http://127.0.0.1:9"]
    )
    assert r.exit_code == 1 and "cannot reach Prometheus" in r.output


def test_the_scatter_counts_batch_in_whole_requests_and_times_read_as_clock_times() -> None:
    T0 = 1_796_100_000.0
    r = from_rows(source="t", since_ts=T0, until_ts=T0 + 90, probes=[], gpu=[])
    r.scatter = [(1800.0 - 40 * i, 100.0 + 20 * i, float(i % 3)) for i in range(12)]
    fig = Figure()
    ax = fig.add_subplot()
    assert draw_scatter(ax, r)
    fig.canvas.draw()
    bar = ax.collections[0].colorbar.ax  # type: ignore[union-attr]
    ticks = [t for t in bar.get_yticks() if bar.get_ylim()[0] <= t <= bar.get_ylim()[1]]
    assert ticks and all(t == int(t) for t in ticks)  # 0, 1, 2: no half requests
    time_ax = Figure().add_subplot()
    time_ax.plot([], [])
    _time_axis(time_ax, r)  # 90 s: ticks every few seconds
    time_ax.figure.canvas.draw()
    labels = [t.get_text() for t in time_ax.get_xticklabels() if t.get_text()]
    # A whole minute may read 04:40; no tick is a bare "30".
    assert labels and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", text) for text in labels), labels


@pytest.mark.parametrize(
    ("counts", "title"),
    [
        ([None] * 12, "batch in flight not counted (no gateway)"),
        ([0.0] * 12, "batch in flight 0 throughout"),
        ([None] * 6 + [2.0] * 6, "batch in flight 2 wherever counted"),
    ],
    ids=["no-gateway", "constant", "partly"],
)
def test_a_scatter_with_no_varying_count_has_no_colour_bar(counts, title) -> None:
    # A bar for one count (or none) reads -0.1 to 0.1: the title says what there is instead.
    r = from_rows(source="t", since_ts=0.0, until_ts=90.0, probes=[], gpu=[])
    r.scatter = [(1800.0 - 40 * i, 100.0 + 20 * i, c) for i, c in enumerate(counts)]
    fig = Figure()
    ax = fig.add_subplot()
    assert draw_scatter(ax, r)
    assert ax.collections[0].colorbar is None
    assert ax.get_title().endswith(title)
    assert len(fig.axes) == 1  # no inset bar beside the plot


def test_canaries_before_the_count_are_grey_beside_the_coloured_ones() -> None:
    # The demo's first canaries come before the gateway counts batch: they are drawn grey
    # and named, and the counted ones keep their colours and bar.
    r = from_rows(source="t", since_ts=0.0, until_ts=90.0, probes=[], gpu=[])
    counts = [None] * 4 + [float(i % 3) for i in range(8)]
    r.scatter = [(1800.0 - 40 * i, 100.0 + 20 * i, c) for i, c in enumerate(counts)]
    fig = Figure()
    ax = fig.add_subplot()
    assert draw_scatter(ax, r)
    grey, coloured = ax.collections
    assert len(grey.get_offsets()) == 4 and len(coloured.get_offsets()) == 8
    assert coloured.colorbar is not None
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["batch not counted"]
    assert ax.get_title().endswith("coloured by batch in flight")


def test_the_p95_legend_names_its_window_and_a_window_too_small_for_a_tail() -> None:
    """A window of fewer than 20 probes has its slowest probe for its nearest-rank p95, so a
    spike there is one slow probe: the legend says so, and says nothing where windows hold
    20 or more."""

    def legend_of(interval_s: float, span_s: float) -> list[str]:
        n = int(span_s / interval_s)
        probes = [
            {"ts": i * interval_s, "ok": True, "cold": False, "ttft_ms": 100.0 + i % 7}
            for i in range(n)
        ]
        r = from_rows(source="t", since_ts=0.0, until_ts=span_s, probes=probes, gpu=[])
        ax = Figure().add_subplot()
        assert draw_ttft(ax, r)
        return [t.get_text() for t in ax.get_legend().get_texts()]

    # 0.5 s apart over 3 minutes: 10-s windows of 20 probes, a true p95.
    assert legend_of(0.5, 180.0) == ["p50", "p95 per 10 s window"]
    # 0.6 s apart: 10-s windows of 16 or 17, each p95 its slowest probe.
    assert legend_of(0.6, 180.0) == ["p50", "p95 per 10 s window of ~17 probes: its slowest"]
    # The daemon's 10-s default over an hour: 2-minute windows of 12.
    assert legend_of(10.0, 3600.0) == ["p50", "p95 per 2 min window of ~12 probes: its slowest"]


def test_the_title_gives_a_short_span_to_the_second_and_no_axis_has_an_offset_label() -> None:
    from llm_watchdog.report.charts import _span

    t0 = 1_796_100_291.0  # 2026-12-01 04:44:51 UTC
    r = from_rows(source="t", since_ts=t0, until_ts=t0 + 212.0, probes=[], gpu=[])
    assert _span(r) == "2026-12-01 04:44:51 to 04:48:23 UTC"
    r = from_rows(source="t", since_ts=t0, until_ts=t0 + 86400.0, probes=[], gpu=[])
    assert _span(r) == "2026-12-01 04:44 to 2026-12-02 04:44 UTC"
    ax = Figure().add_subplot()
    _time_axis(ax, r)
    formatter = ax.xaxis.get_major_formatter()
    assert formatter.format_ticks(ax.xaxis.get_major_locator()())  # as a drawing does
    assert formatter.get_offset() == ""


def test_the_picture_carries_the_pages_facts_and_headroom_rows() -> None:
    # A PNG has no page around it: the header's figures and the headroom table go under
    # its title, as lines.
    from llm_watchdog.report.charts import report_figure

    probes = [
        {"ts": float(i), "ok": True, "cold": False, "ttft_ms": 100.0 + 400 * (i > 150)}
        for i in range(0, 300, 2)
    ]
    r = from_rows(source="t", since_ts=0.0, until_ts=300.0, probes=probes, gpu=[],
                  target_p95_ms=400.0)  # fmt: skip
    r.headroom = [
        {"state": "cool", "allowance": 4, "bound": "at least", "confidence": "likely",
         "n": 93, "unit": "probes", "settle": ""},
        {"state": "hot", "allowance": None, "bound": "none", "confidence": "not enough data",
         "n": 3, "unit": "probes", "settle": "more"},
    ]  # fmt: skip
    title = report_figure(r).get_suptitle().replace("\n", " ")
    assert "windows over target 5 of 10" in title and "target p95 400 ms" in title
    assert "headroom (batch in flight chat holds at): cool ≥ 4 (likely, 93 probes) · hot not " \
        "enough data yet" in title  # fmt: skip
    assert "peak temperature" not in title  # latency-only: no GPU facts
