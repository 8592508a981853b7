"""`api.listen` on a port another process holds: one line that names the setting and says
what to do, and exit 78, which the unit does not restart (RestartPreventExitStatus=78)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from llm_watchdog.daemon.api import ApiServer, ProbeMetrics
from llm_watchdog.errors import EX_CONFIG, ConfigError
from tests.helpers.streamserver import closed_port_url


@pytest.fixture
def taken_port():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield holder.getsockname()[1]


def test_a_port_in_use_names_api_listen_and_what_to_do(taken_port):
    with pytest.raises(ConfigError) as err:
        ApiServer("127.0.0.1", taken_port, dict, ProbeMetrics())
    text = str(err.value)
    assert text.startswith(f"api.listen: cannot listen on 127.0.0.1:{taken_port} (")
    assert "Address already in use" in text and "while attempting" not in text
    assert "pick another port with api.listen" in text and "stop the process" in text


def test_an_address_not_on_this_machine_names_api_listen():
    with pytest.raises(
        ConfigError, match=r"^api\.listen: cannot listen on .*check the api\.listen"
    ):
        ApiServer("192.0.2.1", 9108, dict, ProbeMetrics())  # TEST-NET-1: never local


def test_run_exits_78_with_one_line_when_the_port_is_taken(tmp_path, taken_port):
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nurl = "{closed_port_url()}"\n[gpu]\nenabled = false\n'
        f'[storage]\npath = "{tmp_path / "watchdog.db"}"\n'
        f'[api]\nlisten = "127.0.0.1:{taken_port}"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "llm_watchdog", "--config", str(config), "run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EX_CONFIG, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("llm-watchdog:")]
    assert errors == [
        f"llm-watchdog: api.listen: cannot listen on 127.0.0.1:{taken_port} (Address already in "
        'use): is another llm-watchdog running? pick another port with api.listen ("" turns '
        "the endpoint off), or stop the process that holds it"
    ]
