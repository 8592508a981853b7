"""What a new user met in `bench`: the same run compared with itself, a heat lab's own batch
job under bench's levels, and table figures without units."""

from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner

from llm_watchdog.cli import cli
from llm_watchdog.cli.bench import lab_batch_line
from llm_watchdog.sim.server import SimLab
from llm_watchdog.store import bench as stored
from llm_watchdog.store.db import Store
from tests.helpers.streamserver import StreamServer


def bench(*args: str):
    return CliRunner().invoke(cli, ["bench", *args], env={}, obj={})


def paris_set(folder) -> str:
    path = folder / "paris.toml"
    path.write_text('[[prompts]]\nid = "fr"\nquestion = "Capital of France?"\nany_of = ["paris"]\n')
    return str(path)


def short_run(url: str, folder, *extra: str) -> list[str]:
    return [
        "--chat-set",
        paris_set(folder),
        "--url",
        url,
        "--batch-streams",
        "0",
        "--duration",
        "0.5s",
        "--warmup",
        "0s",
        "--cold-start",
        "none",
        *extra,
    ]


LEVEL = {
    "batch_streams": 0,
    "chat_probes": 300,
    "quality_pass_rate": 299 / 300,
    "chat_failed": 0,
    "chat_wrong": 1,
    "temp_c_max": 37.0,
    "sm_clock_mhz_min": 2400.0,
    "throttled_share": 0.4,
    "complete": True,
}


RUN = {
    "started_ts": 1_700_000_000.0,
    "ended_ts": 1_700_000_060.0,
    "complete": True,
    "stop_reason": None,
    "url": "http://127.0.0.1:8000",
    "engine": "vllm",
    "engine_version": "0.6.0",
    "model": "m",
    "launch_command": "vllm serve m",
    "driver_version": "550",
    "gpu_name": "GPU",
    "gpu_uuid": "GPU-1",
    "probe_set_hash": "p" * 64,
    "probe_set": "default",
    "batch_set": "synthetic-700w",
    "batch_set_hash": "b" * 64,
    "fingerprint_id": "fp",
    "config": {"levels": [0]},
    "cold_start": None,
    "levels": [LEVEL],
}


def table_row(output: str, head_start: str) -> dict[str, str]:
    """The first row under the table whose header begins `head_start`, cut at the header's
    column starts (an empty cell leaves only spaces, so split() would shift the rest)."""
    lines = output.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(head_start))
    head, row = lines[i], lines[i + 1].ljust(len(lines[i]))
    starts = [n for n, ch in enumerate(head) if ch != " " and (n == 0 or head[n - 1] == " ")]
    ends = [*starts[1:], len(row)]
    return {head[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def save(db_path) -> int:
    with Store(db_path) as store:
        return stored.save_run(store, RUN)


@pytest.fixture
def stored_run(db_path) -> int:
    return save(db_path)


# ---- compare A A ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_comparing_a_run_with_itself_is_one_line_naming_bench_list(db_path, stored_run, fmt):
    out = bench("compare", str(stored_run), str(stored_run), "--db", str(db_path), *fmt)
    assert out.exit_code == 2
    assert out.output.count("\n") == 1
    assert f"#{stored_run} against itself: the same run, nothing to compare" in out.output
    assert "llm-watchdog bench list" in out.output
    assert "(nothing)" not in out.output


def test_two_runs_with_nothing_different_say_nothing_not_an_empty_arrow(db_path, stored_run):
    again = save(db_path)
    out = bench("compare", str(stored_run), str(again), "--db", str(db_path))
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[lines.index(f"B (#{again}) against A (#{stored_run}): what differs") + 1] == (
        "  nothing"
    )
    assert " -> " not in out.output


# ---- units on the table ------------------------------------------------------------------


def test_the_level_table_gives_percentages_and_units(db_path, stored_run):
    out = bench("show", str(stored_run), "--db", str(db_path))
    assert out.exit_code == 0, out.output
    cells = table_row(out.output, "batch  probes")
    # One wrong answer in 300 is not a perfect score.
    assert cells["quality"] == "99.7%" and cells["throttled"] == "40%"
    assert cells["temp_max_c"] == "37.0" and cells["clk_min_mhz"] == "2400.0"


def test_json_and_csv_keep_the_shares_as_numbers(db_path, stored_run):
    shown = json.loads(bench("show", str(stored_run), "--db", str(db_path), "--json").output)
    assert shown["levels"][0]["quality_pass_rate"] == 299 / 300
    assert shown["levels"][0]["throttled_share"] == 0.4
    csv_out = bench("show", str(stored_run), "--db", str(db_path), "--csv").output.splitlines()
    cells = dict(zip(csv_out[0].split(","), csv_out[1].split(","), strict=False))
    assert float(cells["quality_pass_rate"]) == pytest.approx(299 / 300)
    assert cells["throttled_share"] == "0.4" and cells["temp_c_max"] == "37.0"


def test_compare_table_shows_quality_as_a_percentage(db_path, stored_run):
    again = save(db_path)
    out = bench("compare", str(stored_run), str(again), "--db", str(db_path))
    cells = table_row(out.output, "batch_streams")
    assert (cells["quality_a"], cells["quality_b"]) == ("99.7%", "99.7%")


def test_the_live_line_names_quality_as_the_table_does(tmp_path):
    with StreamServer(answer="Paris", first_token_delay_s=0.005) as srv:
        out = bench(*short_run(srv.url, tmp_path, "--no-store"))
    assert out.exit_code == 0, out.output
    assert "quality 100%" in out.output
    assert table_row(out.output, "batch  probes")["quality"] == "100%"


# ---- the heat lab's own batch job ----------------------------------------------------------


def test_a_lab_with_its_own_batch_streams_is_named_before_the_run(tmp_path):
    with SimLab("workstation", time_scale=20) as lab:
        streams = lab.world.batch_streams
        assert streams > 0  # the scenario's own batch job
        out = bench(*short_run(lab.url, tmp_path, "--sim-gpu", lab.url, "--no-store"))
    assert out.exit_code == 0, out.output
    warning = next(line for line in out.output.splitlines() if "batch streams of its own" in line)
    assert warning == (
        f"# warning: the heat lab at {lab.url} runs {streams} batch streams of its own besides "
        f"bench's, so each level has {streams} more than its row says (batch 0 has {streams}); "
        "for bench's levels alone, start it with `llm-watchdog sim serve --batch-streams 0`"
    )
    # Before the run: ahead of the first level's result.
    lines = out.output.splitlines()
    assert lines.index(warning) < next(i for i, x in enumerate(lines) if x.startswith("# batch 0"))


def test_a_lab_without_batch_streams_gets_no_warning():
    with SimLab("workstation", time_scale=20, batch_streams=0) as lab:
        assert lab_batch_line(lab.url) is None


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(404, text="not found"),
        httpx.Response(200, text="not json"),
        httpx.Response(200, json=["a list"]),
        httpx.Response(200, json={"batch_streams": "many"}),
    ],
    ids=["404", "not-json", "not-an-object", "not-a-number"],
)
def test_a_state_that_cannot_be_read_gives_no_warning(answer):
    transport = httpx.MockTransport(lambda request: answer)
    assert lab_batch_line("http://lab:1", transport) is None


def test_a_lab_that_cannot_be_reached_gives_no_warning():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert lab_batch_line("http://lab:1", httpx.MockTransport(refuse)) is None
