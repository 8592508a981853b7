from __future__ import annotations

import json

from click.testing import CliRunner

from llm_watchdog.bench.loadgen import BatchLoad, document, extraction_messages
from llm_watchdog.cli import cli
from tests.helpers.streamserver import StreamServer


def test_documents_are_unique_and_sized():
    a, b = document(1, 700), document(2, 700)
    assert a != b and document(1, 700) == a
    assert 650 <= len(a.split()) <= 750
    assert "JSON" in extraction_messages(1, 50)[1]["content"]


def test_batch_load_sends_batch_class_requests_and_counts_output():
    with StreamServer(answer='{"dates": []}', token_gap_s=0.001) as srv:
        with BatchLoad(srv.url, "m", streams=2, words=50) as load:
            deadline = 50
            while load.stats.ok < 4 and deadline:
                import time

                time.sleep(0.05)
                deadline -= 1
        posts = srv.chat_requests()
    assert load.stats.ok >= 4 and load.stats.output_chars > 0
    assert all(
        {k.lower(): v for k, v in r.headers.items()}["x-traffic-class"] == "batch" for r in posts
    )
    assert len({json.dumps(r.json["messages"]) for r in posts}) == len(posts)  # cache-busted


def test_bench_command_prints_one_row_per_level(tmp_path):
    with StreamServer(answer="Paris", first_token_delay_s=0.005) as srv:
        out = CliRunner().invoke(
            cli,
            [
                "bench",
                "--url",
                srv.url,
                "--batch-streams",
                "0,1",
                "--duration",
                "1s",
                "--document-words",
                "20",
                "--db",
                str(tmp_path / "bench.db"),
                "--json",
            ],
            env={},
            obj={},
        )
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    assert [r["batch_streams"] for r in rows] == [0, 1]
    assert rows[0]["chat_probes"] > 0 and rows[0]["chat_failed"] == 0
    assert rows[1]["batch_requests_ok"] >= 1


def test_bench_rejects_bad_levels():
    out = CliRunner().invoke(cli, ["bench", "--batch-streams", "a,b"], env={}, obj={})
    assert out.exit_code == 2 and "--batch-streams" in out.output
