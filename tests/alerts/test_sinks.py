"""Command and log sinks with real processes and loggers; `[alerts]` configuration parsing."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llm_watchdog.alerts.config import (
    AlertConfig,
    AlertConfigError,
    alert_config_from_dict,
    load_alerts,
    sinks_from_config,
)
from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.alerts.manager import send_test
from llm_watchdog.alerts.sinks import CommandSink, DeliveryError, LogSink
from llm_watchdog.alerts.webhook import WebhookSink

T0 = 1_700_000_000.0

ALERT = AlertEvent(
    key="drift:chat_slowed:1700000000",
    kind="chat_slowed",
    state="firing",
    ts=T0,
    title="Chat slowed (thermal)",
    message="Chat slowed under heat: p95 TTFT 1.9 s vs 0.8 s baseline; GPU 0 86 °C",
    cause="thermal",
    fields={"p95_ms": 1900.0},
)

WRITE_ENV = (
    "import json, os, sys\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith('LLM_WATCHDOG_')}\n"
    "open(sys.argv[1], 'w', encoding='utf-8').write(json.dumps(env))\n"
)


# -- command sink ------------------------------------------------------------------------


def test_command_gets_the_alert_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    sink = CommandSink([sys.executable, "-c", WRITE_ENV, str(out)], timeout_s=20, host="gpu-box")
    sink.send(ALERT)
    env = json.loads(out.read_text(encoding="utf-8"))
    assert {k: v for k, v in env.items() if k != "LLM_WATCHDOG_JSON"} == {
        "LLM_WATCHDOG_KIND": "chat_slowed",
        "LLM_WATCHDOG_STATE": "firing",
        "LLM_WATCHDOG_SEVERITY": "critical",
        "LLM_WATCHDOG_MESSAGE": ALERT.message,
        "LLM_WATCHDOG_TITLE": "Chat slowed (thermal)",
        "LLM_WATCHDOG_CAUSE": "thermal",
        "LLM_WATCHDOG_TS": "1700000000.000",
        "LLM_WATCHDOG_KEY": "drift:chat_slowed:1700000000",
        "LLM_WATCHDOG_HOST": "gpu-box",
    }
    body = json.loads(env["LLM_WATCHDOG_JSON"])
    assert body["fields"] == {"p95_ms": 1900.0} and body["message"] == ALERT.message


def test_command_nonzero_exit_is_a_failure_with_its_stderr() -> None:
    script = "import sys; sys.stderr.write('pager API said no\\n'); sys.exit(3)"
    sink = CommandSink([sys.executable, "-c", script], timeout_s=20)
    with pytest.raises(DeliveryError) as info:
        sink.send(ALERT)
    assert str(info.value) == f"command {sys.executable} exited with status 3: pager API said no"
    assert info.value.retryable


def test_command_past_its_timeout_is_killed_with_its_children() -> None:
    # The child starts a grandchild that keeps stdout open; killing only the child would
    # leave us waiting on the pipe for 30 s.
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "time.sleep(30)\n"
    )
    sink = CommandSink([sys.executable, "-c", script], timeout_s=1)
    started = time.monotonic()
    with pytest.raises(DeliveryError, match=r"still running after 1 s: killed"):
        sink.send(ALERT)
    assert time.monotonic() - started < 8


@pytest.mark.parametrize(
    ("name", "mode", "text"),
    [
        ("missing", None, "command not found: {path}: check argv"),
        ("not-executable", 0o644, "command not executable: {path}: check its permissions"),
        ("no-shebang", 0o755, "cannot run {path} (Exec format error): is it a program"),
    ],
)
def test_command_that_cannot_start_is_final(
    tmp_path: Path, name: str, mode: int | None, text: str
) -> None:
    path = tmp_path / name
    if mode is not None:
        path.write_bytes(b"\x00\x01 not a program")
        path.chmod(mode)
    with pytest.raises(DeliveryError) as info:
        CommandSink([str(path)]).send(ALERT)
    assert str(info.value).startswith(text.format(path=path))
    assert not info.value.retryable


# -- log sink ----------------------------------------------------------------------------


def test_log_sink_writes_one_line_at_the_severity(caplog: pytest.LogCaptureFixture) -> None:
    sink = LogSink(logging.getLogger("test.alerts"))
    warning = AlertEvent(
        key="h",
        kind="heat_warning",
        state="firing",
        ts=T0,
        title="Heat warning",
        message="GPU 0 heading\nfor it",
    )
    resolved = AlertEvent(
        key="drift:1",
        kind="chat_slowed",
        state="resolved",
        ts=T0,
        title="Resolved",
        message="Chat fast again",
    )
    with caplog.at_level(logging.INFO, logger="test.alerts"):
        for a in (ALERT, warning, resolved):
            sink.send(a)
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        (
            logging.CRITICAL,
            "alert firing critical chat_slowed cause=thermal key=drift:chat_slowed:1700000000: "
            + ALERT.message,
        ),
        (logging.WARNING, "alert firing warning heat_warning key=h: GPU 0 heading for it"),
        (logging.INFO, "alert resolved critical chat_slowed key=drift:1: Chat fast again"),
    ]


def test_send_test_reports_a_failing_command(tmp_path: Path) -> None:
    ok = CommandSink([sys.executable, "-c", WRITE_ENV, str(tmp_path / "t.json")], name="script")
    bad = CommandSink([sys.executable, "-c", "raise SystemExit(1)"], name="broken")
    results = send_test([ok, bad, LogSink()], host="gpu-box")
    assert [(r.sink, r.ok) for r in results] == [("script", True), ("broken", False), ("log", True)]
    assert results[1].error == f"command {sys.executable} exited with status 1"
    env = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert env["LLM_WATCHDOG_STATE"] == "test" and env["LLM_WATCHDOG_KIND"] == "test"


# -- configuration -----------------------------------------------------------------------


def test_alert_settings_parse_with_durations() -> None:
    cfg = alert_config_from_dict(
        {
            "kinds": ["chat_slowed", "probes_failing"],
            "min_severity": "warning",
            "max_per_window": 3,
            "window": "30m",
            "attempts": 4,
            "backoff": "500ms",
            "backoff_max": "1m",
            "sink": [],
        }
    )
    assert cfg == AlertConfig(
        kinds=frozenset({"chat_slowed", "probes_failing"}),
        min_severity="warning",
        max_per_window=3,
        window_s=1800.0,
        max_attempts=4,
        backoff_s=0.5,
        backoff_max_s=60.0,
    )
    assert alert_config_from_dict(None) == AlertConfig()


def test_sinks_from_config_reads_secrets_from_file_and_environment(tmp_path: Path) -> None:
    url_file = tmp_path / "slack-url"
    url_file.write_text("https://hooks.slack.com/services/T0/B0/filetoken\n", encoding="utf-8")
    auth_file = tmp_path / "ntfy-auth"
    auth_file.write_text("Bearer tk_fromfile\n", encoding="utf-8")
    env = {"DISCORD_WEBHOOK": "https://discord.com/api/webhooks/1/envtoken"}
    sinks = sinks_from_config(
        [
            {"type": "webhook", "shape": "slack", "url_file": str(url_file), "blocks": True},
            {"type": "webhook", "shape": "discord", "url_env": "DISCORD_WEBHOOK", "name": "dc"},
            {
                "type": "webhook",
                "shape": "ntfy",
                "url": "https://ntfy.sh/topic-one",
                "headers_file": {"Authorization": str(auth_file)},
                "timeout": "3s",
                "min_severity": "critical",
            },
            {"type": "webhook", "shape": "ntfy", "url": "https://ntfy.sh/topic-two"},
            {"type": "command", "argv": ["/usr/local/bin/page-me", "--team", "ml"]},
            {"type": "log", "kinds": ["heat_warning"]},
        ],
        env=env,
    )
    slack, discord, ntfy, ntfy2, command, log = sinks
    assert isinstance(slack, WebhookSink) and slack.blocks and slack.shape == "slack"
    assert slack.name == "slack https://hooks.slack.com/…"
    assert discord.name == "dc"
    assert isinstance(ntfy, WebhookSink)
    assert ntfy.headers == {"Authorization": "Bearer tk_fromfile"} and ntfy.timeout_s == 3.0
    assert ntfy.min_severity == "critical"
    assert ntfy2.name == "ntfy https://ntfy.sh/… #2"  # default names stay distinct
    assert isinstance(command, CommandSink) and command.argv[1:] == ["--team", "ml"]
    assert isinstance(log, LogSink) and log.kinds == frozenset({"heat_warning"})
    shown = " ".join(s.name + repr(s) for s in sinks)
    assert "filetoken" not in shown and "envtoken" not in shown and "topic-one" not in shown
    for s in sinks:
        s.close()


def test_load_alerts_returns_settings_and_sinks() -> None:
    cfg, sinks = load_alerts({"min_severity": "critical", "sink": {"type": "log"}})
    assert cfg.min_severity == "critical"
    assert [type(s).__name__ for s in sinks] == ["LogSink"]


@pytest.mark.parametrize(
    ("entry", "env", "message"),
    [
        (
            {},
            {},
            "alerts.sink[1].type: missing: expected one of webhook, command, log, alertmanager",
        ),
        (
            {"type": "email"},
            {},
            "alerts.sink[1].type: 'email' is not a sink type: "
            "expected one of webhook, command, log, alertmanager",
        ),
        (
            {"type": "webhook", "url": "https://x.test/h", "shape": "teams"},
            {},
            "alerts.sink[1].shape: 'teams' is not a webhook shape: "
            "expected one of generic, slack, discord, ntfy",
        ),
        (
            {"type": "webhook", "url": "https://x.test/h", "url_env": "X"},
            {},
            "alerts.sink[1]: give the webhook URL as exactly one of url, url_file, url_env or "
            "url_credential",
        ),
        (
            {"type": "webhook"},
            {},
            "alerts.sink[1]: give the webhook URL as exactly one of url, url_file, url_env or "
            "url_credential",
        ),
        (
            {"type": "webhook", "url_env": "SLACK_WEBHOOK"},
            {},
            "alerts.sink[1].url_env: environment variable SLACK_WEBHOOK is not set: "
            "set it in the service's environment (systemd EnvironmentFile=)",
        ),
        (
            {"type": "webhook", "url_file": "/nonexistent/slack-url"},
            {},
            "alerts.sink[1].url_file: cannot read /nonexistent/slack-url "
            "(No such file or directory): put the secret in that file, "
            "readable by the service user only",
        ),
        (
            {"type": "webhook", "url_env": "HOOK"},
            {"HOOK": "hooks.slack.com/x"},
            "alerts.sink[1].url_env: the webhook URL must start with http:// or https://",
        ),
        (
            {"type": "webhook", "url": "https://x.test/h", "urll": "y"},
            {},
            "alerts.sink[1].urll: unknown key: did you mean 'url'? expected one of blocks, "
            "headers, headers_env, "
            "headers_file, kinds, min_severity, name, shape, timeout, type, url, url_credential, "
            "url_env, url_file",
        ),
        (
            {"type": "webhook", "url": "https://x.test/h", "headers": {"X-Key": "a\nb"}},
            {},
            "alerts.sink[1].headers.X-Key: header values must be one line of ASCII text",
        ),
        (
            {"type": "webhook", "url": "https://x.test/h", "timeout": "soon"},
            {},
            "alerts.sink[1].timeout: expected a duration like 10s, 5m, 2h or 1h30m, got 'soon'",
        ),
        (
            {"type": "command", "argv": "notify-send alert"},
            {},
            "alerts.sink[1].argv: expected a non-empty list of strings: "
            "the program and its arguments (no shell)",
        ),
        (
            {"type": "log", "min_severity": "urgent"},
            {},
            "alerts.sink[1].min_severity: 'urgent' is not a severity: "
            "expected one of info, warning, critical",
        ),
        (
            {"type": "log", "kinds": ["chat_slow"]},
            {},
            "alerts.sink[1].kinds: unknown kind 'chat_slow': expected some of chat_slowed, "
            "heat_warning, quality_failed, cold_start_slow, baseline_invalidated, "
            "telemetry_lost, probes_failing, control_not_effective, storage_failing",
        ),
    ],
)
def test_sink_config_errors_name_the_key(
    entry: dict[str, Any], env: dict[str, str], message: str
) -> None:
    with pytest.raises(AlertConfigError) as info:
        sinks_from_config([entry], env=env)
    assert str(info.value) == message


def test_duplicate_sink_names_are_refused() -> None:
    entries = [{"type": "log", "name": "ops"}, {"type": "log", "name": "ops"}]
    with pytest.raises(AlertConfigError) as info:
        sinks_from_config(entries)
    assert str(info.value) == (
        "alerts.sink[2].name: 'ops' is already used by alerts.sink[1]: give each sink its own name"
    )
    assert info.value.key == "alerts.sink[2].name"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"window": "-"}, "alerts.window: expected a duration like 10s, 5m, 2h or 1h30m, got '-'"),
        ({"window": 0}, "alerts.window: expected a duration above zero"),
        ({"max_per_window": 0}, "alerts.max_per_window: expected a whole number ≥ 1, got 0"),
        ({"enabled": "yes"}, "alerts.enabled: expected true or false, got 'yes'"),
        ({"min_severity": "high"}, "alerts.min_severity: 'high' is not a severity"),
        ({"ratelimit": 3}, "alerts.ratelimit: unknown key: expected one of attempts, backoff"),
    ],
)
def test_alert_settings_errors_name_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(AlertConfigError) as info:
        alert_config_from_dict(table)
    assert str(info.value).startswith(message)
