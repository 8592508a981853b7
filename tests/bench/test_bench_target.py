"""The target of a run: a gateway and the engine behind it are two paths to the engine
(`bench compare` names the difference), and behind a gateway the engine's queue figures are
read on the engine, not on the gateway."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from llm_watchdog.bench.compare import compare_runs, differences, endpoint
from llm_watchdog.bench.observe import metrics_source
from llm_watchdog.cli import cli
from tests.bench.test_compare import run
from tests.helpers.streamserver import StreamServer, closed_port_url

GATEWAY = {"via": "gateway", "engine_url": "http://127.0.0.1:8080"}
DIRECT = {"via": "direct", "engine_url": None}


def at(url: str, **config) -> dict:
    return run(url=url, config={"duration_s": 20, "levels": [0, 2], **config})


def names(a: dict, b: dict) -> list[str]:
    return [d["variable"] for d in differences(a, b)]


def test_through_the_gateway_and_straight_at_the_engine_differ_in_target():
    a = at("http://127.0.0.1:8090", **GATEWAY, metrics_url="http://127.0.0.1:8080")
    b = at("http://127.0.0.1:8080", **DIRECT, metrics_url="http://127.0.0.1:8080")
    assert differences(a, b) == [
        {
            "variable": "target",
            "a": "http://127.0.0.1:8090 (llm-watchdog gateway to http://127.0.0.1:8080)",
            "b": "http://127.0.0.1:8080",
        }
    ]
    # The target is one variable: it gets no "variables differ" warning of its own.
    assert not any("variables differ" in w for w in compare_runs(a, b, [], [])["warnings"])


def test_runs_stored_before_the_path_was_kept_differ_by_host_and_port():
    assert names(at("http://127.0.0.1:8090"), at("http://127.0.0.1:8080")) == ["target"]
    assert names(at("http://gpu-a:8080"), at("http://gpu-b:8080")) == ["target"]
    assert names(at("http://127.0.0.1:8080/v1"), at("http://localhost:8080/")) == []
    assert names(at("http://h"), at("http://h:80/v1")) == []


def test_straight_at_an_engine_relaunched_on_another_port_is_the_same_path():
    # As --port in the launch command: where it listens, not how it runs.
    a, b = at("http://127.0.0.1:8080", **DIRECT), at("http://127.0.0.1:8081", **DIRECT)
    assert names(a, b) == []
    assert names(at("http://gpu-a:8080", **DIRECT), at("http://gpu-b:8080", **DIRECT)) == ["target"]


def test_a_gateway_put_on_the_engines_port_is_a_different_path():
    a = at("http://127.0.0.1:8080", **DIRECT)
    b = at("http://127.0.0.1:8080", **GATEWAY)
    assert names(a, b) == ["target"]


def test_where_the_queue_figures_were_read_is_not_a_setting_of_its_own():
    a = at("http://127.0.0.1:8080", **DIRECT, metrics_url="http://127.0.0.1:8080")
    b = at("http://127.0.0.1:8080", **DIRECT, metrics_url="http://127.0.0.1:9000")
    assert names(a, b) == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://localhost:8080/v1/", "http://127.0.0.1:8080"),
        ("https://gpu.lan/v1", "https://gpu.lan:443"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        (None, None),
    ],
)
def test_endpoint(url, expected):
    assert endpoint(url) == expected


def test_metrics_are_read_on_the_engine_the_gateway_names_unless_told():
    gw = "http://127.0.0.1:8090"
    ident = {"gateway": "llm-watchdog", "upstream": "http://127.0.0.1:8080"}
    at_, line = metrics_source(gw, ident)
    assert at_ == "http://127.0.0.1:8080"
    assert line == (
        "engine queue figures: read on the engine at http://127.0.0.1:8080/metrics, which the "
        "gateway at http://127.0.0.1:8090 names (--metrics-url to read them elsewhere)"
    )
    assert metrics_source(gw, ident, "http://10.0.0.5:8080") == ("http://10.0.0.5:8080", None)
    assert metrics_source("http://127.0.0.1:8080", None) == ("http://127.0.0.1:8080", None)
    # A gateway that names no engine: its own /metrics, said plainly, with what to do.
    at_, line = metrics_source(gw, {"gateway": "llm-watchdog"})
    assert at_ == gw and line is not None
    assert "are the gateway's, not the engine's: pass --metrics-url" in line


@pytest.mark.parametrize(
    ("upstream", "gateway", "read_at"),
    [
        # From another machine, the gateway's loopback engine is on the gateway's host.
        ("http://127.0.0.1:8000", "http://box.lan:8090", "http://box.lan:8000"),
        ("http://localhost:8000/v1", "http://10.0.0.7:8090", "http://10.0.0.7:8000/v1"),
        ("http://[::1]:8000", "http://[fd00::7]:8090", "http://[fd00::7]:8000"),
        # On the gateway's own machine, or an engine named by a routable address: as named.
        ("http://127.0.0.1:8000", "http://127.0.0.1:8090", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000", "http://localhost:8090", "http://127.0.0.1:8000"),
        ("http://10.0.0.5:8000", "http://box.lan:8090", "http://10.0.0.5:8000"),
    ],
)
def test_a_loopback_engine_is_read_on_the_gateways_host_from_another_machine(
    upstream, gateway, read_at
):
    at_, line = metrics_source(gateway, {"gateway": "llm-watchdog", "upstream": upstream})
    assert at_ == read_at
    assert line is not None and f"{read_at.removesuffix('/v1')}/metrics" in line
    assert ("a loopback address of its own machine" in line) is (read_at != upstream)


# -- through a real gateway ------------------------------------------------------------------

VLLM_METRICS = (
    b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3.0\n"
    b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2.0\n"
)


def bench(*args: str):
    return CliRunner().invoke(cli, ["bench", *args], env={}, obj={})


def args(url: str, db, *extra: str) -> list[str]:
    chat = db.parent / "paris.toml"
    chat.write_text('[[prompts]]\nid = "fr"\nquestion = "Capital of France?"\nany_of = ["paris"]\n')
    return [
        *("--url", url, "--chat-set", str(chat), "--batch-streams", "0", "--duration", "0.5s"),
        *("--cold-start", "none", "--launch-command", "vllm serve m", "--db", str(db), *extra),
    ]


def level(output: str) -> dict:
    (row,) = [json.loads(x) for x in output.splitlines() if x.startswith("{")]
    return row


def test_behind_the_gateway_the_queue_figures_are_the_engines_and_compare_names_the_path(
    tmp_path,
):
    from llm_watchdog.gateway import GatewayConfig, GatewayServer

    db = tmp_path / "b.db"
    engine = StreamServer(answer="Paris", engine="vllm", static={"/metrics": (200, VLLM_METRICS)})
    with engine as srv, GatewayServer(GatewayConfig(upstream_url=srv.url, listen_port=0)) as gw:
        through = bench(*args(gw.url, db, "--json"))
        direct = bench(*args(srv.url, db, "--json"))
        told = bench(*args(gw.url, db, "--json", "--metrics-url", closed_port_url()))
    assert through.exit_code == 0, through.output
    assert direct.exit_code == 0, direct.output
    # The engine's gauges, read on the engine: the gateway's /metrics has no vllm: series.
    assert level(through.output)["engine_waiting_mean"] == 3.0
    assert (
        f"# engine queue figures: read on the engine at {srv.url}/metrics, which the gateway "
        f"at {gw.url} names" in through.output
    )
    assert level(direct.output)["engine_waiting_mean"] == 3.0
    assert "engine queue figures" not in direct.output
    # --metrics-url wins, and nothing is said about it.
    assert level(told.output)["engine_waiting_mean"] is None
    assert "engine queue figures" not in told.output

    shown = json.loads(bench("show", "1", "--db", str(db), "--json").output)
    assert shown["config"]["via"] == "gateway" and shown["config"]["engine_url"] == srv.url
    assert shown["config"]["metrics_url"] == srv.url
    shown_table = bench("show", "1", "--db", str(db)).output
    assert f"server   {gw.url} (llm-watchdog gateway to {srv.url}): vllm" in shown_table
    cmp = json.loads(bench("compare", "1", "2", "--db", str(db), "--json").output)
    assert cmp["differences"] == [
        {
            "variable": "target",
            "a": f"{gw.url} (llm-watchdog gateway to {srv.url})",
            "b": srv.url,
        }
    ]
    table = bench("compare", "1", "2", "--db", str(db)).output
    assert f"  target: {gw.url} (llm-watchdog gateway to {srv.url}) -> {srv.url}" in table


def test_a_gateway_whose_engine_does_not_answer_from_here_says_so(tmp_path):
    from llm_watchdog.bench.observe import answers, unreachable_line

    dead = closed_port_url()
    assert not answers(dead)
    line = unreachable_line(dead, "http://gw:8090")
    assert dead in line and "does not answer from here" in line and "--metrics-url" in line
    # Tried at the gateway's host, it says both: what the gateway named and where it was tried.
    line = unreachable_line("http://gw:8080", "http://gw:8090", "http://127.0.0.1:8080")
    assert "names (http://127.0.0.1:8080, tried here at http://gw:8080) does not" in line
