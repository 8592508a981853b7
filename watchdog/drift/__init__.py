"""Drift: baselines, cold starts, a detector that names its cause, the quality gate, replay.

Pure logic: observations and their timestamps in, events out. See `monitor.DriftMonitor`.
"""

from llm_watchdog.drift.baseline import BaselineLearner, baseline_from_observations
from llm_watchdog.drift.cold import ColdVerdict, classify_cold
from llm_watchdog.drift.monitor import DriftMonitor, MonitorState
from llm_watchdog.drift.replay import ReplayError, events_to_jsonl, parse_trace, replay_file
from llm_watchdog.drift.values import (
    BASELINE_INVALIDATED,
    CAUSES,
    CHANGES,
    KINDS,
    Baseline,
    DriftConfig,
    DriftEvent,
    Observation,
    observation_from,
)

__all__ = [
    "BASELINE_INVALIDATED",
    "CAUSES",
    "CHANGES",
    "KINDS",
    "Baseline",
    "BaselineLearner",
    "ColdVerdict",
    "DriftConfig",
    "DriftEvent",
    "DriftMonitor",
    "MonitorState",
    "Observation",
    "ReplayError",
    "baseline_from_observations",
    "classify_cold",
    "events_to_jsonl",
    "observation_from",
    "parse_trace",
    "replay_file",
]
