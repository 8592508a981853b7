"""Scenario files: the bundled ones load, and a bad file says which file and key is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_watchdog.resources import bundled_dir
from llm_watchdog.sim.scenario import ScenarioError, available_scenarios, load_scenario

REQUIRED = {
    "consumer-warm-room",
    "workstation",
    "datacenter",
    "ambient-step",
    "chat-burst",
    "llamacpp-cpu",
}


def test_every_required_scenario_ships_and_loads() -> None:
    assert REQUIRED <= set(available_scenarios())
    for name in available_scenarios():
        sc = load_scenario(name)
        assert sc.name == name
        assert sc.path is not None and sc.path.parent == bundled_dir("scenarios")
        assert sc.description


HELD_OUT = Path(__file__).resolve().parents[1] / "benchmarks" / "heldout"


@pytest.mark.parametrize("path", sorted(HELD_OUT.glob("*.toml")), ids=lambda p: p.stem)
def test_the_held_out_scenarios_load_by_path_and_name_themselves(path: Path) -> None:
    # docs/control.md gives `sim run -s tests/benchmarks/heldout/<name>.toml` commands.
    sc = load_scenario(str(path))
    assert sc.name == path.stem
    assert sc.description and sc.path == path
    assert sc.duration_s >= 3600


def test_there_are_held_out_scenarios() -> None:
    assert len(list(HELD_OUT.glob("*.toml"))) >= 5


def test_a_scenario_is_found_by_path_too() -> None:
    path = bundled_dir("scenarios") / "datacenter.toml"
    assert load_scenario(str(path)).gpu.has_fan is False


def test_base_is_laid_under_the_file_and_the_schedule_is_its_own() -> None:
    base, step = load_scenario("workstation"), load_scenario("ambient-step")
    assert step.gpu == base.gpu and step.engine == base.engine
    assert [e.ambient_c for e in step.schedule] == [44.0, 30.0]
    assert [e.at_s for e in step.schedule] == [1800.0, 5400.0]
    burst, consumer = load_scenario("chat-burst"), load_scenario("consumer-warm-room")
    assert burst.chat.burst_multiplier != consumer.chat.burst_multiplier
    assert burst.chat.prompt_tokens_max == consumer.chat.prompt_tokens_max  # inherited


def test_compression_speeds_up_heat_and_schedule_only() -> None:
    sc = load_scenario("ambient-step")
    fast = sc.compressed(30.0)
    assert fast.gpu.thermal_time_constant_s == pytest.approx(sc.gpu.thermal_time_constant_s / 30)
    assert fast.schedule[0].at_s == pytest.approx(60.0)
    assert fast.engine == sc.engine and fast.chat == sc.chat


def write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name = "x"\n[gpu]\nambient_c = "hot"\n',
            "mine.toml: key 'gpu.ambient_c': expected a number (°C), got 'hot'",
        ),
        ('name = "x"\n[gpu]\nambiant_c = 30\n', "mine.toml: unknown key 'gpu.ambiant_c'"),
        ('name = "x"\ncolour = 1\n', "mine.toml: unknown key 'colour' at top level"),
        (
            'name = "x"\n[engine]\nscheduling = "lifo"\n',
            "mine.toml: key 'engine.scheduling': expected 'fcfs' or 'priority', got 'lifo'",
        ),
        (
            'name = "x"\n[engine]\nmax_running_seqs = 2.5\n',
            "mine.toml: key 'engine.max_running_seqs': expected a whole number",
        ),
        (
            'name = "x"\n[gpu]\nfan_curve_c_pct = [[60, 50], [40, 80]]\n',
            "mine.toml: key 'gpu.fan_curve_c_pct': temperatures must rise",
        ),
        (
            'name = "x"\n[gpu]\ntemp_slowdown_c = 80\ntemp_max_operating_c = 85\n',
            "mine.toml: key 'gpu.temp_slowdown_c': thresholds must satisfy",
        ),
        (
            'name = "x"\n[traffic.chat]\nprompt_tokens_min = 10\nprompt_tokens_max = 5\n',
            "mine.toml: key 'traffic.chat.prompt_tokens_max'",
        ),
        (
            'name = "x"\n[[schedule]]\nat_s = 10\n',
            "mine.toml: schedule #1: at 10 s nothing changes",
        ),
        (
            'name = "x"\n[[schedule]]\nat_s = 10\nambient = 40\n',
            "mine.toml: unknown key 'schedule[1].ambient'",
        ),
        ('name = "x"\nbase = "no-such"\n', "scenario 'no-such' not found"),
        ("name = [\n", "mine.toml: not valid TOML"),
    ],
)
def test_a_bad_file_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(str(write(tmp_path, text)))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_base_that_leads_back_to_itself_is_refused(tmp_path: Path) -> None:
    write(tmp_path, 'name = "a"\nbase = "b"\n', "a.toml")
    write(tmp_path, 'name = "b"\nbase = "a"\n', "b.toml")
    with pytest.raises(ScenarioError, match="leads back to this file"):
        load_scenario(str(tmp_path / "a.toml"))


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario("no-such-scenario")
    assert "known: " in str(err.value) and "workstation" in str(err.value)
