"""The engine's launch command: where it was read (launch_command_source), the engine's
systemd unit where its process cannot be read, and secrets redacted before anything keeps it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llm_watchdog.probe.fingerprint import build_fingerprint, redact_command, redact_command_text
from llm_watchdog.probe.procinfo import NO_LISTENER, OTHER_USER, launch_command, unit_exec_start
from tests.probe.test_procinfo import _fake_proc, _hex4, _line


def test_a_readable_listener_is_the_source(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path, tcp=[_line(_hex4("127.0.0.1"), 9000, "0A", 11)], tcp6=[], pids={77: 11}
    )
    argv, source = launch_command(9000, "127.0.0.1", proc=proc)
    assert source == "process" and argv is not None and argv[0] == "llama-server"


def test_another_users_listener_says_so(tmp_path: Path) -> None:
    # The socket is listed in /proc/net/tcp, but no readable fd points at it.
    proc = _fake_proc(tmp_path, tcp=[_line(_hex4("127.0.0.1"), 9000, "0A", 11)], tcp6=[], pids={})
    assert launch_command(9000, "127.0.0.1", proc=proc) == (None, OTHER_USER)
    assert launch_command(9001, "127.0.0.1", proc=proc) == (None, NO_LISTENER)


SHOW = (
    "{ path=/usr/bin/vllm ; argv[]=/usr/bin/vllm serve Qwen/Qwen2.5-7B --max-num-seqs 32 "
    "--api-key sk-live-123 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; "
    "pid=0 ; code=(null) ; status=0/0 }\n"
)


def fake_systemctl(stdout: str, returncode: int = 0, stderr: str = ""):
    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    return run, calls


def test_the_engine_unit_is_read_where_the_process_cannot_be(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, tcp=[_line(_hex4("127.0.0.1"), 9000, "0A", 11)], tcp6=[], pids={})
    run, calls = fake_systemctl(SHOW)
    argv, source = launch_command(9000, "127.0.0.1", engine_unit="vllm.service", proc=proc, run=run)
    assert calls == [["systemctl", "show", "-p", "ExecStart", "--value", "--", "vllm.service"]]
    assert source == "systemd unit vllm.service"
    assert argv is not None and argv[:3] == ["/usr/bin/vllm", "serve", "Qwen/Qwen2.5-7B"]


def test_a_unit_that_is_not_there_says_why(tmp_path: Path) -> None:
    run, _ = fake_systemctl("", returncode=1, stderr="Unit nope.service could not be found.\n")
    argv, why = unit_exec_start("nope.service", run=run)
    assert argv is None and "could not be found" in why
    argv, source = launch_command(None, "10.0.0.5", engine_unit="nope.service", run=run)
    assert argv is None and source.startswith("unreadable") and "nope.service" in source


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl")
def test_systemctl_itself_answers_without_systemd_running() -> None:
    argv, why = unit_exec_start("llm-watchdog-no-such-unit.service")
    assert argv is None and why  # an answer, never an exception


# Tokenizer, token limits and key files shape the numbers: none of them is a secret.
KEPT = ["x", "--tokenizer", "t", "--max-tokens", "9", "MAX_TOKENS=9", "--ssl-keyfile", "k.pem"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["vllm", "serve", "m", "--api-key", "SECRET"], ["vllm", "serve", "m", "--api-key", "***"]),
        (["x", "--hf-token=hf_SECRET"], ["x", "--hf-token=***"]),
        (
            ["env", "HF_TOKEN=SECRET", "OPENAI_API_KEY=SECRET", "x"],
            ["env", "HF_TOKEN=***", "OPENAI_API_KEY=***", "x"],
        ),
        (
            ["x", "--upstream", "http://ann:SECRET@host:1/v1"],
            ["x", "--upstream", "http://ann:***@host:1/v1"],
        ),
        (
            ["x", "--ssl-keyfile-password", "SECRET", "--client-secret=SECRET"],
            ["x", "--ssl-keyfile-password", "***", "--client-secret=***"],
        ),
        (KEPT, KEPT),  # what shapes the numbers stays
    ],
)
def test_secrets_in_command_lines_are_redacted(argv: list[str], expected: list[str]) -> None:
    assert redact_command(argv) == expected


def test_the_fingerprint_never_holds_the_secret() -> None:
    for command in (
        ["llama-server", "-m", "m.gguf", "--api-key", "sk-SECRET"],
        "llama-server -m m.gguf --api-key 'sk-SECRET' HF_TOKEN=SECRET",
    ):
        fp = build_fingerprint("llamacpp", "b1", "m", command, None, None, None, None, None)
        assert "SECRET" not in fp.launch_command and "--api-key" in fp.launch_command
    assert "SECRET" not in redact_command_text("a --token 'un closed SECRET")


def test_where_the_command_is_read_from_is_not_part_of_the_config_hash() -> None:
    from llm_watchdog.config import settings_from_dict
    from llm_watchdog.probe.fingerprint import config_hash

    plain = settings_from_dict({}, "t.toml")
    with_unit = settings_from_dict({"server": {"engine_unit": "vllm.service"}}, "t.toml")
    assert config_hash(plain.to_dict()) == config_hash(with_unit.to_dict())
    other = settings_from_dict({"server": {"launch_command": "x"}}, "t.toml")
    assert config_hash(other.to_dict()) != config_hash(plain.to_dict())
