"""The shipped Prometheus rules and Grafana dashboard: promtool passes them, and every metric
and label they name is one the daemon's and the gateway's /metrics really export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llm_watchdog.daemon.api import ApiServer, ProbeMetrics
from llm_watchdog.daemon.install import observability_files
from llm_watchdog.gateway import GatewayConfig, GatewayServer
from llm_watchdog.models import GpuSample
from tests.daemon.test_api import status_of

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
RULES = SYSTEMD / "llm-watchdog-rules.yml"
RULE_TESTS = SYSTEMD / "llm-watchdog-rules.test.yml"
DASHBOARD = SYSTEMD / "llm-watchdog-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (.ci/run installs Debian's prometheus)"
)
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
SELECTOR = re.compile(r"\b(llm_watchdog_[a-z0-9_]+)\b(\{[^}]*\})?")
LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")


@pytest.fixture(scope="module")
def exported() -> Iterator[dict[str, set[str]]]:
    """Sample name -> label names, from a daemon and a gateway with something in every family."""
    probes = ProbeMetrics()
    probes.add(True, None, 120.0, False, True, model_name="m", engine="vllm")
    probes.add(False, "timeout", None, False, None)
    probes.add_gpu(
        [GpuSample(ts=1.0, gpu_index=0, thermal_violation_ms=5.0, power_violation_ms=1.0)]
    )
    api = ApiServer("127.0.0.1", 0, status_of, probes).start()
    gateway = GatewayServer(
        GatewayConfig(upstream_url="http://127.0.0.1:9", listen_port=0, shutdown_timeout_s=2.0)
    ).start()
    try:
        texts = [
            httpx.get(api.url + "/metrics", timeout=5).text,
            httpx.get(gateway.url + "/metrics", timeout=5).text,
        ]
    finally:
        api.stop()
        gateway.stop()
    names: dict[str, set[str]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                names.setdefault(s.name, set()).update(s.labels)
    yield names


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def named(exprs: list[str]) -> list[tuple[str, set[str]]]:
    out = []
    for expr in exprs:
        for m in SELECTOR.finditer(expr):
            labels = {lm.group(1) for lm in LABEL.finditer(m.group(2) or "")}
            out.append((m.group(1), labels))
        for m in re.finditer(r"(?:by|on)\s*\(([^)]*)\)", expr):
            out.append(("", {x.strip() for x in m.group(1).split(",") if x.strip()}))
    return out


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_and_label_named_is_exported(
    source: str, exported: dict[str, set[str]]
) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    uses = named(exprs)
    assert len(uses) > 10
    all_labels = set().union(*exported.values()) | TARGET_LABELS | {"le"}
    for name, labels in uses:
        if name:
            assert name in exported, f"{source} names {name}, which no endpoint exports"
            unknown = labels - exported[name] - TARGET_LABELS
            assert not unknown, f"{source}: {name} has no label {unknown}"
        else:
            assert labels <= all_labels, f"{source} groups by {labels - all_labels}"


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    dash = json.loads(DASHBOARD.read_text())
    text = json.dumps(dash)
    for needed in (
        "llm_watchdog_gateway_ttft_seconds_bucket",
        "llm_watchdog_gpu_temperature_celsius",
        "llm_watchdog_gpu_sm_clock_mhz",
        "llm_watchdog_gpu_clock_event_active",
        "llm_watchdog_gateway_allowance",
        "llm_watchdog_gateway_inflight",
    ):
        assert needed in text
    assert any("llm_watchdog_drift_open" in a["expr"] for a in dash["annotations"]["list"])
    # Every query is per box: the $host variable picks the instances of one or more boxes.
    assert all("$host" in e for e in dashboard_exprs() if "label_values" not in e)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    run = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


@needs_promtool
def test_promtool_runs_the_rule_unit_tests() -> None:
    run = subprocess.run(
        [str(PROMTOOL), "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=SYSTEMD,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_every_alert_has_a_rule_test() -> None:
    alerts = {
        r["alert"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    tested = {
        t["alertname"]
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for t in group.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    assert alerts == tested


def test_install_lists_the_files_it_ships() -> None:
    listed = {path.name for _, path in observability_files()}
    assert listed == {RULES.name, RULE_TESTS.name, DASHBOARD.name}
    assert all(path.is_file() for _, path in observability_files())
