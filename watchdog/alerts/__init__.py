"""Alerts: rules over events, deduplicated and rate-limited, delivered to sinks.

The daemon maps its events onto `AlertEvent` and hands them to an `AlertManager`; the
configuration keys are documented in `llm_watchdog.alerts.config`.
"""

from __future__ import annotations

from llm_watchdog.alerts.alertmanager import AlertmanagerSink
from llm_watchdog.alerts.config import (
    AlertConfig,
    AlertConfigError,
    alert_config_from_dict,
    load_alerts,
    sinks_from_config,
)
from llm_watchdog.alerts.events import KINDS, SEVERITIES, AlertEvent
from llm_watchdog.alerts.manager import (
    ALERTS_TABLE,
    AlertLog,
    AlertManager,
    MemoryAlertLog,
    SendResult,
    send_test,
)
from llm_watchdog.alerts.policy import AlertPolicy, AlertRules
from llm_watchdog.alerts.sinks import CommandSink, DeliveryError, LogSink, Sink
from llm_watchdog.alerts.webhook import WebhookSink

__all__ = [
    "ALERTS_TABLE",
    "KINDS",
    "SEVERITIES",
    "AlertConfig",
    "AlertConfigError",
    "AlertEvent",
    "AlertLog",
    "AlertManager",
    "AlertmanagerSink",
    "AlertPolicy",
    "AlertRules",
    "CommandSink",
    "DeliveryError",
    "LogSink",
    "MemoryAlertLog",
    "SendResult",
    "Sink",
    "WebhookSink",
    "alert_config_from_dict",
    "load_alerts",
    "send_test",
    "sinks_from_config",
]
