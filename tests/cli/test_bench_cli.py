"""`llm-watchdog bench`, `bench list`, `bench show`, `bench compare` against test servers."""

from __future__ import annotations

import json
import threading

from click.testing import CliRunner

from llm_watchdog.bench.batchset import load_batch_set, synthetic_batch_set
from llm_watchdog.bench.run import BenchPlan, BenchResult, run_bench
from llm_watchdog.cli import cli
from llm_watchdog.nvml.reader import NvmlReader
from llm_watchdog.probe.client import ProbeOptions, Prober
from llm_watchdog.probe.sets import load_probe_set
from llm_watchdog.sim.server import SimLab
from llm_watchdog.store import bench as stored
from llm_watchdog.store.db import Store
from tests.helpers.streamserver import StreamServer, closed_port_url


def bench(*args: str):
    return CliRunner().invoke(cli, ["bench", *args], env={}, obj={})


def chat_set(folder) -> str:
    path = folder / "paris.toml"
    path.write_text('[[prompts]]\nid = "fr"\nquestion = "Capital of France?"\nany_of = ["paris"]\n')
    return str(path)


def run_args(url: str, db, *extra: str) -> list[str]:
    return [
        "--chat-set",
        chat_set(db.parent),
        "--url",
        url,
        "--batch-streams",
        "0,1",
        "--duration",
        "1s",
        "--warmup",
        "0.3s",
        "--document-words",
        "20",
        "--cold-start",
        "none",
        "--db",
        str(db),
        *extra,
    ]


def json_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_a_run_is_stored_listed_shown_and_compared(tmp_path):
    db = tmp_path / "b.db"
    with StreamServer(answer="Paris", first_token_delay_s=0.005, engine="llamacpp") as srv:
        first = bench(*run_args(srv.url, db, "--launch-command", "llama-server --parallel 4"))
        second = bench(*run_args(srv.url, db, "--launch-command", "llama-server --parallel 2"))
    assert first.exit_code == 0, first.output
    assert second.exit_code == 0, second.output
    assert "cold start: not measured" in first.output
    assert "# batch 0: too few probes: " in first.output
    assert "a p95 interval needs 20; run longer levels (--duration)" in first.output
    assert "stored as bench run #1" in first.output
    assert "no batch request finished" not in first.output  # its batch ran

    listed = bench("list", "--db", str(db), "--json")
    assert [r["id"] for r in json_lines(listed.output)] == [2, 1]

    shown = bench("show", "1", "--db", str(db), "--json")
    run = json.loads(shown.output)
    assert run["complete"] and run["launch_command"] == "llama-server --parallel 4"
    assert run["engine"] == "llamacpp" and run["config"]["levels"] == [0, 1]
    assert [lv["batch_streams"] for lv in run["levels"]] == [0, 1]
    assert run["levels"][0]["quality_pass_rate"] is not None
    assert run["levels"][0]["chat_interval_note"].startswith("too few probes: ")
    assert run["levels"][0]["chat_p95_low_ms"] is None
    table = bench("show", "1", "--db", str(db))
    assert "launch   llama-server --parallel 4" in table.output

    with Store(db) as store:
        chat = stored.run_requests(store, 1, "chat")
        batch = stored.run_requests(store, 1, "batch")
    assert chat and all(r["outcome"] == "ok" and r["quality_pass"] == 1 for r in chat)
    assert batch and all(r["level_index"] == 1 for r in batch)

    cmp = bench("compare", "1", "2", "--db", str(db))
    assert cmp.exit_code == 0, cmp.output
    assert "launch command --parallel: 4 -> 2" in cmp.output
    assert "variables differ" not in cmp.output
    # One-second levels: a few probes each, too few for an interval or a verdict.
    assert "too few probes for a p95 interval, so no verdict" in cmp.output
    cmp_json = json.loads(bench("compare", "1", "2", "--db", str(db), "--json").output)
    assert [d["variable"] for d in cmp_json["differences"]] == ["launch command --parallel"]
    assert {lv["verdict"] for lv in cmp_json["levels"]} == {"too few probes"}
    assert all(0 < lv["probes_a"] < 20 for lv in cmp_json["levels"])


def test_wrong_answers_show_in_the_quality_column_not_as_fast(tmp_path):
    with StreamServer(answer="Lyon", first_token_delay_s=0.001) as srv:
        out = bench(*run_args(srv.url, tmp_path / "b.db", "--json", "--batch-streams", "0"))
    assert out.exit_code == 0, out.output
    (row,) = json_lines(out.output)
    assert row["quality_pass_rate"] == 0.0 and row["chat_wrong"] == row["chat_probes"] > 0
    assert row["chat_p95_ms"] is None


def test_bad_input_is_one_line(tmp_path):
    db = tmp_path / "b.db"
    out = bench(*run_args(closed_port_url(), db))
    assert out.exit_code == 1 and "cannot reach" in out.output
    assert len(out.output.strip().splitlines()) == 1
    with StreamServer(answer="Paris") as srv:
        out = bench(*run_args(srv.url, db, "--chat-set", "no-such-set"))
        assert out.exit_code == 1 and "no-such-set" in out.output
        assert "Traceback" not in out.output
        out = bench(*run_args(srv.url, db, "--batch-set", str(tmp_path / "missing.toml")))
        assert out.exit_code == 1 and "batch set" in out.output
    out = bench("--batch-streams", "0,-1", "--db", str(db))
    assert out.exit_code == 2
    out = bench("show", "7", "--db", str(db))
    assert out.exit_code == 1 and "no bench run #7" in out.output


def test_an_engine_that_rejects_the_batch_set_stops_the_run_with_its_reason(tmp_path):
    db = tmp_path / "b.db"
    with StreamServer(
        answer="Paris",
        fault="status",
        status=400,
        error_body={"error": {"message": "context too long"}},
    ) as bad:
        out = bench(*run_args(bad.url, db, "--batch-streams", "1"))
    assert out.exit_code == 1
    assert "rejected the batch requests (HTTP 400" in out.output
    assert "context too long" in out.output
    listed = json_lines(bench("list", "--db", str(db), "--json").output)
    assert listed and listed[0]["complete"] is False


def test_batch_set_file(tmp_path):
    path = tmp_path / "docs.toml"
    path.write_text(
        'name = "two"\nmax_tokens = 8\n[[documents]]\ntext = "A"\n'
        '[[documents]]\nid = "b"\ntext = "B"\n'
    )
    bs = load_batch_set(str(path))
    assert bs.name == "two" and bs.documents == 2 and bs.max_tokens == 8
    assert bs.messages(0)[1]["content"].endswith("A") and bs.messages(3)[1]["content"].endswith("B")
    path.write_text('[[documents]]\ntxt = "A"\n')
    out = CliRunner().invoke(cli, ["bench", "--batch-set", str(path)], env={}, obj={})
    assert out.exit_code == 1 and "document #1" in out.output


def test_heat_lab_run_records_the_engine_queue_and_the_gpu_and_stops_incomplete():
    pset = load_probe_set("default")
    stop = threading.Event()
    result = BenchResult()
    seen: list[dict] = []

    def level_done(lv: dict) -> None:
        seen.append(lv)
        stop.set()  # as Ctrl-C would, after the first level

    with SimLab("workstation", time_scale=20, batch_streams=0) as lab:
        reader = NvmlReader(nvml=lab.nvml)
        assert reader.start()
        try:
            opts = ProbeOptions(engine="vllm")
            with Prober(lab.url, lab.scenario.engine.model, opts) as prober:
                run_bench(
                    prober,
                    pset,
                    synthetic_batch_set(50),
                    lab.url,
                    lab.scenario.engine.model,
                    "vllm",
                    BenchPlan((2, 4), 3.0, warmup_s=0.5, cold_start="none", observe_interval_s=0.3),
                    reader=reader,
                    stop=stop,
                    level_done=level_done,
                    result=result,
                )
        finally:
            reader.stop()
    assert not result.complete and len(result.levels) == 1
    lv = result.levels[0]
    assert lv["batch_streams"] == 2 and lv["chat_probes"] > 0
    assert lv["engine_waiting_mean"] is not None and lv["engine_note"] == (
        "vllm: queue depth only in its metrics, no queue-time histogram"
    )
    assert lv["temp_c_max"] is not None and lv["sm_clock_mhz_min"] is not None
    assert lv["batch_output_unit"] == "tokens"
    assert result.gpu_rows and result.batch_rows


def test_behind_the_gateway_the_launch_command_is_the_engines_not_the_gateways():
    # What GET /control/identity of an llm-watchdog gateway answers; the listening process
    # here is the gateway, whose own command line `bench compare` must not diff.
    import http.server

    from llm_watchdog.cli.bench import _launch_command

    identity = {
        "gateway": "llm-watchdog",
        "engine": "vllm",
        "launch_command": "vllm serve m --max-num-seqs 8",
        "launch_command_source": "systemd unit vllm.service",
    }

    class Identity(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            known = self.path == "/control/identity"
            body = json.dumps(identity if known else {}).encode()
            self.send_response(200 if known else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Identity)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert _launch_command(url, "auto") == "vllm serve m --max-num-seqs 8"
        assert _launch_command(url + "/v1", "auto") == "vllm serve m --max-num-seqs 8"
        assert _launch_command(url, "llama-server -np 2") == "llama-server -np 2"  # given wins
        identity["gateway"] = "something else"  # not our gateway: its identity is not read
        assert _launch_command(url, "auto") != "vllm serve m --max-num-seqs 8"
    finally:
        server.shutdown()
        server.server_close()


def test_a_level_whose_batch_never_ran_says_so(tmp_path):
    # Behind a gateway whose allowance a watchdog had cut to 0: every batch request waits out
    # --queue-cap, and the level's chat figures are of an engine with no batch on it.
    from llm_watchdog.gateway import GatewayConfig, GatewayServer

    db = tmp_path / "b.db"
    with (
        StreamServer(answer="Paris", first_token_delay_s=0.005) as srv,
        GatewayServer(
            GatewayConfig(upstream_url=srv.url, listen_port=0, batch_default_allowance=0)
        ) as gw,
    ):
        out = bench(*run_args(gw.url, db, "--queue-cap", "0.2s"))
    assert out.exit_code == 0, out.output
    (line,) = [x for x in out.output.splitlines() if "no batch request finished" in x]
    assert line.startswith("# batch 1: no batch request finished (")
    assert "waited past --queue-cap" in line and "GET /control" in line
