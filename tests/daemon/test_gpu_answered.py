"""The first reading of each GPU after a restart resolves the telemetry alert carried on."""

from __future__ import annotations

from llm_watchdog.alerts.events import AlertEvent
from llm_watchdog.daemon.judge import Judge, telemetry_key
from llm_watchdog.drift import DriftConfig
from llm_watchdog.models import GpuSample
from llm_watchdog.store.db import Store


class CarriedAlerts:
    """The part of AlertManager the judge uses, counting reads of the carried keys."""

    def __init__(self, carried: list[str]) -> None:
        self.carried = carried
        self.reads = 0
        self.sent: list[AlertEvent] = []

    @property
    def carried_keys(self) -> list[str]:
        self.reads += 1
        return [k for k in self.carried if k not in {a.key for a in self.sent}]

    def submit(self, alert: AlertEvent) -> None:
        self.sent.append(alert)


def samples(ts: float, *indices: int) -> list[GpuSample]:
    return [GpuSample(ts=ts, gpu_index=i, temp_c=60.0) for i in indices]


def test_each_gpu_is_checked_once_and_only_its_carried_alert_resolves(store: Store) -> None:
    alerts = CarriedAlerts([telemetry_key(1), telemetry_key(None)])
    judge = Judge(store, DriftConfig(), alerts)
    judge.gpu_answered(samples(10.0, 0))  # GPU 0 and NVML answer; NVML's alert resolves
    assert [(a.key, a.state) for a in alerts.sent] == [("telemetry:None", "resolved")]
    for t in range(11, 200):  # a long run of GPU 0 alone reads nothing more
        judge.gpu_answered(samples(float(t), 0))
    assert alerts.reads == 1
    judge.gpu_answered(samples(300.0, 0, 1))  # GPU 1 comes back: its alert resolves, once
    judge.gpu_answered(samples(301.0, 0, 1))
    assert [(a.key, a.state, a.ts) for a in alerts.sent[1:]] == [("telemetry:1", "resolved", 300.0)]
    assert alerts.reads == 2
