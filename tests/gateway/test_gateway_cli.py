"""`llm-watchdog gateway`: options, one-line errors, and a real foreground process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from llm_watchdog.gateway import GatewayConfig
from llm_watchdog.gateway import cli as cli_module
from llm_watchdog.gateway.cli import gateway, parse_listen, read_key_classes
from llm_watchdog.gateway.config import ENGINE_SLOTS_AUTO


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8090", ("127.0.0.1", 8090)),
        ("9000", ("127.0.0.1", 9000)),
        ("[::1]:0", ("::1", 0)),
        (":8100", ("127.0.0.1", 8100)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["localhost", "1.2.3.4:http", "127.0.0.1:70000"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT like 127.0.0.1:8090"):
        parse_listen(text)


def test_key_classes_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# who is who\nsk-batch-job = batch\n\nsk-people = chat  # the UI\n")
    assert read_key_classes(str(path)) == {"sk-batch-job": "batch", "sk-people": "chat"}
    path.write_text("sk-x = gold\n")
    with pytest.raises(ValueError, match=r"keys:1: expected `KEY = CLASS`"):
        read_key_classes(str(path))


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--listen", "nowhere"], 2, "expected HOST:PORT like 127.0.0.1:8090"),
        (["--token-file", "/nonexistent/token"], 78, "cannot read control token file"),
        (["--batch-allowance", "9", "--batch-ceiling", "4"], 2, "--batch-allowance must"),
        (["--upstream", "http://127.0.0.1:8000/v1"], 2, "must be the engine's root"),
        (["--max-queue-wait", "soon"], 2, "expected a duration like 10s"),
        (["--priority", "batch=low"], 2, "expected CLASS=INTEGER like batch=10"),
        (["--upstream-first-byte-timeout", "0"], 2, "--upstream-first-byte-timeout must be > 0"),
        (["--header-timeout", "soon"], 2, "expected a duration like 10s"),
        (["--client-stall-timeout", "soon"], 2, "expected a duration like 10s"),
        (["--max-connections", "0"], 2, "0 is not in the range x>=1"),
        (["--engine-slots", "-1"], 2, "is neither auto nor a count of slots >= 0"),
    ],
)
def test_bad_options_exit_with_one_line(args: list[str], code: int, message: str) -> None:
    result = CliRunner().invoke(gateway, args)
    assert result.exit_code == code
    assert message in result.output


def test_port_in_use_exits_1_saying_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(gateway, ["--listen", f"127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"llm-watchdog gateway: cannot listen on 127.0.0.1:{port} (Address already in use): "
        "is another gateway running? pick another port with --listen"
    )


@pytest.fixture
def process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    token = tmp_path / "token"
    token.write_text("tok-from-file\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_WATCHDOG")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from llm_watchdog.gateway.cli import gateway; gateway()",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
            "--token-file",
            str(token),
            "--batch-allowance",
            "3",
            "--engine-slots",
            "16",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    url = ""
    lines: list[str] = []
    deadline = time.monotonic() + 20
    while not url and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"gateway listening on (http://127\.0\.0\.1:\d+)", line)
        url = found.group(1) if found else ""
    assert url, "".join(lines)
    # Keep draining stderr so the process never blocks on a full pipe.
    drain = threading.Thread(target=proc.stderr.read, daemon=True)
    drain.start()
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        drain.join(5)
        proc.stderr.close()


@pytest.mark.slow
def test_foreground_process_serves_control_and_stops_on_sigterm(
    process: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = process
    with httpx.Client(timeout=5) as http:
        batch = http.get(url + "/control").json()["classes"]["batch"]
        assert (batch["allowance"], batch["slot_line"]) == (3, 14)
        refused = http.put(url + "/control/classes/batch", json={"allowance": 1})
        assert refused.status_code == 401
        accepted = http.put(
            url + "/control/classes/batch",
            json={"allowance": 1, "lease_s": 60},
            headers={"Authorization": "Bearer tok-from-file"},
        )
        assert accepted.status_code == 200
        dead_engine = http.post(url + "/v1/chat/completions", json={"model": "m"})
        assert dead_engine.status_code == 502
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


@pytest.mark.parametrize(
    ("args", "slots"),
    [
        ([], ENGINE_SLOTS_AUTO),
        (["--engine-slots", "auto"], ENGINE_SLOTS_AUTO),
        (["--engine-slots", "0"], 0),
        (["--engine-slots", "32"], 32),
    ],
)
def test_engine_slots_are_asked_of_the_engine_unless_given(
    args: list[str], slots: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[GatewayConfig] = []

    def fake_serve(config: GatewayConfig, *rest: object, **kw: object) -> None:
        seen.append(config)

    monkeypatch.setattr(cli_module, "serve", fake_serve)
    result = CliRunner().invoke(gateway, ["--upstream", "http://127.0.0.1:9", *args])
    assert result.exit_code == 0, result.output
    assert [c.engine_slots for c in seen] == [slots]


@pytest.mark.parametrize(
    ("args", "env", "stall_s"),
    [
        ([], {}, 60.0),
        (["--client-stall-timeout", "0"], {}, 0.0),
        (["--client-stall-timeout", "2m"], {}, 120.0),
        ([], {"LLM_WATCHDOG_GATEWAY_CLIENT_STALL_TIMEOUT": "15s"}, 15.0),
    ],
)
def test_client_stall_timeout_from_the_command_line_or_the_environment(
    args: list[str], env: dict[str, str], stall_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert served_with(args, env, monkeypatch).client_stall_timeout_s == stall_s


def served_with(
    args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> GatewayConfig:
    """The config `gateway` would serve with, given these arguments and environment."""
    seen: list[GatewayConfig] = []

    def fake_serve(config: GatewayConfig, *rest: object, **kw: object) -> None:
        seen.append(config)

    monkeypatch.setattr(cli_module, "serve", fake_serve)
    result = CliRunner().invoke(gateway, ["--upstream", "http://127.0.0.1:9", *args], env=env)
    assert result.exit_code == 0, result.output
    (config,) = seen
    return config


@pytest.mark.parametrize(
    ("args", "env", "total"),
    [
        ([], {}, 256 * 1024 * 1024),
        (["--max-body-total", "100000000"], {}, 100_000_000),
        ([], {"LLM_WATCHDOG_GATEWAY_MAX_BODY_TOTAL": "50000000"}, 50_000_000),
    ],
)
def test_max_body_total_from_the_command_line_or_the_environment(
    args: list[str], env: dict[str, str], total: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert served_with(args, env, monkeypatch).max_body_total_bytes == total


def test_a_body_budget_under_the_body_limit_is_refused() -> None:
    result = CliRunner().invoke(gateway, ["--max-body-total", "1000"])
    assert result.exit_code == 2
    assert "--max-body-total (1000) must be at least --max-body" in result.output
