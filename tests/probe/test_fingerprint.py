"""Fingerprints: assembly, the words for a change, the config hash."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from llm_watchdog.models import Fingerprint
from llm_watchdog.probe.fingerprint import build_fingerprint, config_hash, describe_change

BASE: dict[str, Any] = dict(
    engine="llamacpp",
    engine_version="b4500",
    model="smollm2-135m",
    launch_command=["llama-server", "-m", "/models/SmolLM2 135M.gguf", "--port", "8080"],
    driver_version="550.54.15",
    gpu_name="NVIDIA GeForce RTX 4090",
    gpu_uuid="GPU-0f3c",
    probe_set_hash="a" * 64,
    config_hash="c" * 16,
)


def test_build_fingerprint_fills_unknowns_and_joins_argv() -> None:
    fp = build_fingerprint(**BASE)
    assert fp.launch_command == "llama-server -m '/models/SmolLM2 135M.gguf' --port 8080"
    assert fp.model == "smollm2-135m"
    bare = build_fingerprint(
        engine=None,
        engine_version="",
        model=None,
        launch_command=None,
        driver_version=None,
        gpu_name=None,
        gpu_uuid=None,
        probe_set_hash=None,
        config_hash=None,
    )
    assert bare == Fingerprint()
    assert set(bare.key_fields().values()) == {"unknown"}
    assert build_fingerprint(**{**BASE, "launch_command": []}).launch_command == "unknown"


def test_fingerprint_id_follows_the_key_fields() -> None:
    a = build_fingerprint(**BASE)
    as_text = "llama-server -m '/models/SmolLM2 135M.gguf' --port 8080"
    same = build_fingerprint(**{**BASE, "launch_command": as_text})
    assert same.id == a.id
    assert build_fingerprint(**{**BASE, "model": "other"}).id != a.id


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"model": "qwen2.5-7b"}, ["model changed: smollm2-135m → qwen2.5-7b"]),
        ({"driver_version": "555.42.02"}, ["driver changed: 550.54.15 → 555.42.02"]),
        ({"engine_version": None}, ["engine version changed: b4500 → unknown"]),
        ({"probe_set_hash": "b" * 64}, ["probe set changed: aaaaaaaaaaaa → bbbbbbbbbbbb"]),
        (
            {"gpu_name": "NVIDIA H100", "gpu_uuid": "GPU-9"},
            [
                "GPU changed: NVIDIA GeForce RTX 4090 → NVIDIA H100",
                "GPU UUID changed: GPU-0f3c → GPU-9",
            ],
        ),
        ({}, []),
    ],
)
def test_describe_change(change: dict, expected: list[str]) -> None:
    old = build_fingerprint(**BASE)
    new = build_fingerprint(**{**BASE, **change})
    assert describe_change(old, new) == expected
    # The same from a row as the store returns it (id, times and extra alongside).
    row = {**old.key_fields(), "id": old.id, "first_seen": 1.0, "last_seen": 2.0, "extra": {}}
    assert describe_change(row, new) == expected


def test_describe_change_shortens_long_commands() -> None:
    old = build_fingerprint(**BASE)
    long_cmd = ["vllm", "serve", "org/model", *[f"--opt-{i}=value" for i in range(30)]]
    (line,) = describe_change(old, build_fingerprint(**{**BASE, "launch_command": long_cmd}))
    assert line.startswith("launch command changed: llama-server -m ")
    after = line.split(" → ")[1]
    assert len(after) == 79 and after.startswith("vllm serve org/model") and "…" in after
    assert after.endswith("--opt-29=value")


SETTINGS = {
    "server": {"url": "http://127.0.0.1:8080", "api_key_file": "/etc/key", "model": "auto"},
    "probe": {"interval_s": 10.0, "seed": 1234, "headers": {"X-Token": "abc", "X-Id": "1"}},
    "gateway": {"control_token_env": "TOK", "Password": "hunter2", "classes": [{"secret": 1}]},
    "storage": {"path": "/var/lib/w.db"},
    "logging": {"level": "info"},
    "control": {"enabled": True, "dry_run": False},
    "alerts": {"sink": []},
    "drift": {"shift_ratio": 1.3},
    "api": {"listen": "127.0.0.1:9108"},
    "gpu": {"interval_s": 1.0},
}


def _edit(section: str, key: str, value: object) -> dict:
    return {**SETTINGS, section: {**SETTINGS[section], key: value}}  # type: ignore[dict-item]


def test_config_hash_is_stable_and_ignores_order() -> None:
    h = config_hash(SETTINGS)
    assert len(h) == 16 and int(h, 16) >= 0
    reordered = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(SETTINGS.items()))}
    assert config_hash(reordered) == h


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("server", "api_key_file", "/etc/other-key"),
        ("probe", "headers", {"X-Token": "changed", "X-Id": "1"}),
        ("gateway", "control_token_env", "OTHER"),
        ("gateway", "Password", "changed"),
        ("gateway", "classes", [{"secret": 2}]),
        ("storage", "path", "/tmp/elsewhere.db"),
        ("logging", "level", "debug"),
        ("control", "dry_run", True),
        ("control", "enabled", False),
        ("alerts", "sink", [{"type": "log"}]),
        ("drift", "shift_ratio", 1.5),
        ("api", "listen", "127.0.0.1:9200"),
        ("gpu", "interval_s", 5.0),
    ],
)
def test_config_hash_leaves_out_secrets_and_unrelated_sections(
    section: str, key: str, value: object
) -> None:
    assert config_hash(_edit(section, key, value)) == config_hash(SETTINGS)


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("server", "url", "http://127.0.0.1:8081"),
        ("server", "model", "other-model"),
        ("probe", "interval_s", 5.0),
        ("probe", "headers", {"X-Token": "abc", "X-Id": "2"}),
    ],
)
def test_config_hash_changes_with_what_shapes_a_measurement(
    section: str, key: str, value: object
) -> None:
    assert config_hash(_edit(section, key, value)) != config_hash(SETTINGS)


def test_config_hash_accepts_a_settings_dataclass() -> None:
    @dataclass(frozen=True)
    class Probe:
        interval_s: float = 10.0
        api_token: str = "s3cret"

    @dataclass(frozen=True)
    class Settings:
        probe: Probe = field(default_factory=Probe)

    assert config_hash(Settings()) == config_hash({"probe": {"interval_s": 10.0}})
    assert config_hash(Settings(Probe(api_token="x"))) == config_hash(Settings())


def test_a_real_config_change_outside_server_and_probe_keeps_the_fingerprint() -> None:
    from llm_watchdog.config import settings_from_dict

    plain = settings_from_dict({}, "t").to_dict()
    for change in (
        {"control": {"dry_run": True}},
        {"alerts": {"sink": [{"type": "log"}]}},
        {"drift": {"baseline_probes": 50}},
        {"api": {"listen": "127.0.0.1:9999"}},
    ):
        assert config_hash(settings_from_dict(change, "t").to_dict()) == config_hash(plain)
    probe = settings_from_dict({"probe": {"cache_mode": "cached"}}, "t").to_dict()
    assert config_hash(probe) != config_hash(plain)
