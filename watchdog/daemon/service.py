"""The long-running watchdog: scheduler jobs that probe, sample the GPU and keep the store tidy.

Wiring only. Measuring lives in `probe` and `gpu`, storing in `store`, judging in `drift`;
this module decides when each runs and hands values between them.

Shape after uvicorn's Server: `startup()` does the I/O that can fail early (database,
NVML, engine identity), `serve()` runs the jobs until `should_exit` is set (by a signal
handler that does nothing else), `shutdown()` stops within a bounded time.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpx
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from llm_watchdog.actuators.base import Actuator
from llm_watchdog.actuators.command import CommandActuator
from llm_watchdog.actuators.haproxy import HaproxyActuator
from llm_watchdog.alerts import AlertConfigError, AlertEvent, AlertManager, LogSink, load_alerts
from llm_watchdog.alerts.manager import attempt_row
from llm_watchdog.config import Settings
from llm_watchdog.daemon.api import ApiServer, ProbeMetrics
from llm_watchdog.daemon.judge import Judge
from llm_watchdog.daemon.memory import release_free_memory
from llm_watchdog.daemon.notify import Heartbeat, Notifier
from llm_watchdog.daemon.steer import Steer, gateway_steer
from llm_watchdog.daemon.storage import OwedAlerts, Say, StorageHealth
from llm_watchdog.drift import classify_cold
from llm_watchdog.durations import human_duration
from llm_watchdog.errors import EXIT_FAILURE, ConfigError, StorageError
from llm_watchdog.models import Fingerprint, GpuEvent, GpuSample, ProbeResult
from llm_watchdog.nvml.reader import NvmlReader
from llm_watchdog.nvml.serving import serving_indices, worst_gpu
from llm_watchdog.nvml.thresholds import Onset, SlowdownLearner, onset_of
from llm_watchdog.probe.client import ProbeOptions, Prober
from llm_watchdog.probe.engine import (
    EngineInfo,
    detect_engine,
    engine_slots,
    gateway_identity,
    resolve_model,
)
from llm_watchdog.probe.fingerprint import build_fingerprint, config_hash, describe_change
from llm_watchdog.probe.procinfo import (
    launch_command,
    listening_pid,
    on_this_machine,
    process_tree,
)
from llm_watchdog.probe.sets import ProbeSet, load_probe_set
from llm_watchdog.store.db import Store
from llm_watchdog.store.records import alert_fired
from llm_watchdog.store.thresholds import learned_thresholds, save_learned_threshold

log = logging.getLogger("llm_watchdog.daemon.service")

# Jobs whose success means a write went through.
_WRITING_JOBS = ("probe", "gpu", "rollup", "fingerprint")
FILE_CHECK_S = 5.0  # how often the database file is checked for deletion or replacement


class Job(NamedTuple):
    """One periodic job: runs every `interval_s` (+ up to `jitter_s`), first after
    `first_after_s` (None: after one interval)."""

    id: str
    interval_s: float
    run: Callable[[], None]
    jitter_s: float = 0.0
    first_after_s: float | None = None


def build_alerts(settings: Settings, store: Store) -> AlertManager:
    """The daemon's alert manager: the configured sinks, or the log when none is configured.

    Raises ConfigError naming the config file and the [alerts] key that is wrong.
    """
    try:
        config, sinks = load_alerts(settings.alerts, env=os.environ)
    except AlertConfigError as exc:
        raise ConfigError(f"{settings.source}: {exc}") from exc
    return AlertManager(sinks or [LogSink()], store, config)


# [probe] keys that are ProbeOptions fields of the same name and unit.
PROBE_OPTION_FIELDS = (
    "connect_timeout_s",
    "first_token_timeout_s",
    "total_timeout_s",
    "cache_mode",
    "seed",
)


def probe_options(settings: Settings, engine: str | None) -> ProbeOptions:
    p = settings.probe
    shared = {name: getattr(p, name) for name in PROBE_OPTION_FIELDS}
    return ProbeOptions(api=settings.server.api, engine=engine, **shared)


def server_port(url: str) -> int | None:
    parts = urlsplit(url)
    if parts.port:
        return parts.port
    return {"http": 80, "https": 443}.get(parts.scheme)


class Daemon:
    """One watchdog over one server and the local GPUs."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        nvml: Any | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_probe: Callable[[ProbeResult, GpuSample | None], None] | None = None,
        alerts: Any | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.transport = transport
        self.on_probe = on_probe
        self.should_exit = threading.Event()
        self.stop_signal: int | None = None  # the signal that asked the daemon to stop
        self.probe_set: ProbeSet = load_probe_set(settings.probe.probe_set)
        self.api_key = settings.api_key()
        gpu = settings.gpu
        indices = None if isinstance(gpu.indices, str) else [int(i) for i in gpu.indices]
        self.reader = NvmlReader(
            nvml=nvml, indices=indices, call_timeout_s=gpu.call_timeout_s, clock=clock
        )
        self.gpu_enabled = gpu.enabled
        # gpu.indices set: judge on those; "all": on the GPUs the engine's processes run on.
        self._indices_fixed = indices is not None
        self.learner = SlowdownLearner()
        self._engine_pids: set[int] = set()
        self._compute_pids: dict[int, set[int]] = {}
        self.engine = EngineInfo(engine="unknown", version="unknown", models=(), props={})
        self.model: str | None = None if settings.server.model == "auto" else settings.server.model
        self.fingerprint: Fingerprint | None = None
        self.fingerprint_id: str | None = None
        self.prober: Prober | None = None
        self._next_prompt = 0
        self._last_ok_ts: float | None = None  # None: the next probe is a cold start
        self._last_ok_fingerprint: str | None = None
        self._lock = threading.Lock()
        self._judge_lock = threading.Lock()
        self._identity_lock = threading.Lock()
        # model = "auto" and the last probe's HTTP status says the model name may be wrong.
        self._model_suspect = False
        self.alerts = alerts
        self.judge = (
            Judge(
                store,
                settings.drift_config(),
                alerts,
                target_p95_ms=settings.control.target_p95_s * 1000.0,
            )
            if settings.drift.enabled
            else None
        )
        self.steer = (
            build_steer(settings, store, alerts, clock=clock, monotonic=monotonic)
            if settings.control.enabled
            else None
        )
        self.last_samples: list[GpuSample] = []
        self.last_result: ProbeResult | None = None
        self.probe_metrics = ProbeMetrics()
        self.api: ApiServer | None = None
        self._busy = 0
        self._busy_cv = threading.Condition()
        self.scheduler: BackgroundScheduler | None = None
        # systemd: READY after the first probe, WATCHDOG=1 only while probes keep finishing.
        # A probe job is due every interval (+ jitter) and bounded by total_timeout; two
        # intervals without one finishing means the loop is stuck.
        self.notifier = notifier if notifier is not None else Notifier()
        p = settings.probe
        self.heartbeat = Heartbeat(
            self.notifier, stale_s=2 * p.interval_s + p.jitter_s + p.total_timeout_s
        )
        self.first_probe = threading.Event()
        self.reload_requested = threading.Event()
        self.storage = StorageHealth(store.path)
        self.owed_storage = OwedAlerts.beside(store.path)
        self._storage_lock = threading.Lock()
        self.exit_code = 0  # what `run` exits with once serve() returns

    # ---- start-up -------------------------------------------------------------------------

    def startup(self) -> None:
        # systemd's watchdog runs from the start, not from READY: reading the engine's
        # identity can take seconds.
        self.heartbeat.start()
        if self.gpu_enabled:
            if not self.reader.start():
                # The reader's own event says why (no library, no GPU, a hung driver); taken
                # here, it is stored once, not again by the first GPU job.
                _, said = self.reader.sample()
                for event in said or [
                    GpuEvent(
                        ts=self.clock(),
                        kind="nvml_unavailable",
                        detail="no NVIDIA driver or NVML library: latency-only mode",
                    )
                ]:
                    self.store.record_gpu_event(event)
            self.learner = SlowdownLearner(learned_thresholds(self.store))
        self.carry_storage_alerts()
        self.refresh_identity()

    def carry_storage_alerts(self) -> None:
        """Carry on the storage alerts an earlier run fired and did not resolve (it stopped,
        or exited on a deleted database, while storage failed): the first write of this run
        that goes through resolves them, to the sinks that got them."""
        owed = self.owed_storage.load()
        if not owed:
            return
        resume = getattr(self.alerts, "resume", None)
        if resume is not None:
            resume(
                {
                    "key": a.key,
                    "kind": a.kind,
                    "severity": a.severity,
                    "sink": sink,
                    "title": a.title,
                    "message": a.message,
                    "sent_ts": a.ts,
                    "start_ts": a.ts,
                    "cause": a.cause,
                }
                for a, sinks in owed
                for sink in sinks
            )
        self.storage.carry(min((a for a, _ in owed), key=lambda a: a.ts))
        log.info(
            "carrying on the storage alert %s from before the restart: resolved at the first "
            "write that goes through",
            ", ".join(a.key for a, _ in owed),
        )

    def refresh_identity(self) -> None:
        """Re-read what serves the probes; a change of identity is a cold start."""
        # The fingerprint job and a probe that just found the model (probe_once) both come
        # here; one at a time, so a change of identity is recorded once.
        with self._identity_lock:
            self._read_identity()

    def _read_identity(self) -> None:
        s = self.settings.server
        info = detect_engine(s.url, api_key=self.api_key, transport=self.transport)
        if info.engine not in ("unreachable",):
            self.engine = info
            if self.steer is not None:
                self.steer.engine_slots(engine_slots(info))
        if s.model == "auto" and info.models:
            self.model = info.models[0]
        elif s.model == "auto" and self.model is None:
            try:
                self.model = resolve_model(s.url, self.api_key, self.transport)
            except Exception as exc:  # unreachable now; the next refresh tries again
                log.debug("model not resolved yet: %s", exc)
        engine_hint = s.engine if s.engine != "auto" else self.engine.engine
        with self._lock:
            if self.prober is None or self.prober.options.engine != engine_hint:
                old = self.prober
                self.prober = Prober(
                    s.url,
                    self.model or "default",
                    probe_options(self.settings, engine_hint),
                    api_key=self.api_key,
                    transport=self.transport,
                )
                if old is not None:
                    old.close()
            elif self.model and self.prober.model != self.model:
                self.prober.model = self.model
        ident = self._gateway_identity()
        self._find_engine_gpus(ident)
        self._record_fingerprint(ident)

    def _find_engine_gpus(self, ident: dict[str, Any] | None) -> None:
        """The engine's process tree and the processes NVML sees on each GPU, re-read with the
        fingerprint: an engine restarted on other cards is followed within a minute. Behind
        an llm-watchdog gateway the probed port is the gateway's, so the engine's pid is the
        one the gateway's identity names."""
        if self._indices_fixed or not self.reader.available:
            return
        if ident is not None:
            pid = ident.get("engine_pid")
            engine_pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
            self._engine_pids = process_tree(engine_pid) if engine_pid is not None else set()
        else:
            port = server_port(self.settings.server.url)
            host = urlsplit(self.settings.server.url).hostname or ""
            if port is not None and on_this_machine(host):
                pid = listening_pid(port, host=host)
                self._engine_pids = process_tree(pid) if pid is not None else set()
        self._compute_pids = self.reader.compute_pids()

    def _launch_command(self, ident: dict[str, Any] | None) -> tuple[str | list[str] | None, str]:
        """The engine's command line and where it was read (the fingerprint's
        launch_command_source): the config, the gateway in front of the engine, the
        listening process, the engine's systemd unit, or why it could not be read."""
        s = self.settings.server
        if s.launch_command != "auto":
            return s.launch_command, "config"
        if ident is not None:
            command = ident.get("launch_command")
            source = ident.get("launch_command_source") or "unknown"
            return (command if isinstance(command, str) else None), f"gateway: {source}"
        port = server_port(s.url)
        host = urlsplit(s.url).hostname or ""
        if not on_this_machine(host):
            if s.engine_unit:
                return launch_command(None, host, engine_unit=s.engine_unit)
            return None, f"unreadable: {host} is not this machine; set server.launch_command"
        return launch_command(port, host, engine_unit=s.engine_unit)

    def _gateway_identity(self) -> dict[str, Any] | None:
        """The upstream's identity when server.url is an llm-watchdog gateway, else None."""
        return gateway_identity(self.settings.server.url, self.transport)

    def _record_fingerprint(self, ident: dict[str, Any] | None) -> None:
        infos = self.reader.infos() if self.reader.available else []
        first = infos[0] if infos else None
        command, source = self._launch_command(ident)
        fp = build_fingerprint(
            engine=self.engine.engine,
            engine_version=self.engine.version,
            model=self.model or "unknown",
            launch_command=command,
            driver_version=self.reader.driver_version() if self.reader.available else None,
            gpu_name=first.name if first else None,
            gpu_uuid=first.uuid if first else None,
            probe_set_hash=self.probe_set.sha256,
            config_hash=config_hash(self.settings.to_dict()),
            extra={"launch_command_source": source},
        )
        if self.fingerprint is not None and fp.id != self.fingerprint.id:
            changes = describe_change(self.fingerprint.key_fields(), fp)
            # A new model, driver or launch is re-baselined as designed: news, not a fault.
            log.info("runtime changed: %s", "; ".join(changes) or fp.id)
        elif self.fingerprint is None:
            # The last run's runtime, if another: its baseline stays with it, and this one
            # learns its own; said, so that a relearning after a restart has a reason.
            last = self.store.latest_fingerprint()
            if last is not None and last.get("id") != fp.id:
                changes = describe_change(last, fp)
                log.info(
                    "runtime changed since the last run: %s; its baseline stays with it, "
                    "this one is learned anew unless it was seen before",
                    "; ".join(changes) or fp.id,
                )
        self.fingerprint = fp
        before, self.fingerprint_id = self.fingerprint_id, self.store.record_fingerprint(fp)
        if self.steer is not None and self.fingerprint_id != before:
            # Another engine, model or launch is another card's worth of headroom.
            self.steer.seed_headroom(self.fingerprint_id)
        if self.judge is not None:
            with self._judge_lock:
                self.judge.set_fingerprint(self.fingerprint_id, self.clock())
                self.judge.reload_baseline(self.clock())

    # ---- jobs -----------------------------------------------------------------------------

    def probe_once(self) -> ProbeResult:
        """Send the next prompt of the set and record what it measured."""
        prompts = self.probe_set.prompts
        prompt = prompts[self._next_prompt % len(prompts)]
        self._next_prompt += 1
        self._check_model()
        with self._lock:
            prober = self.prober
        assert prober is not None, "startup() first"
        result = prober.probe(prompt, self.probe_set.name, now=self.clock)
        # Judged against the last probe that got an answer: until one does, the engine has
        # not shown it is warm.
        cold = classify_cold(
            ts=result.ts,
            previous_ts=self._last_ok_ts,
            fingerprint_id=self.fingerprint_id,
            previous_fingerprint_id=self._last_ok_fingerprint,
            load_duration_ms=result.load_duration_ms,
            idle_after_s=self.settings.drift.cold_after_idle_s,
        ).cold
        if result.ok:
            self._last_ok_ts = result.ts
            self._last_ok_fingerprint = self.fingerprint_id
        # vLLM and Ollama answer a model name they do not serve with 404 (some servers 400):
        # the engine may have been restarted with another model.
        self._model_suspect = result.error_class == "http_status" and result.http_status in (
            400,
            404,
        )
        steer = self.steer
        result = replace(
            result,
            cold=cold,
            batch_inflight=steer.inflight if steer else None,
            batch_allowance=steer.allowance if steer else None,
        )
        self.store.record_probe(result, self.fingerprint_id)
        self.last_result = result
        self.probe_metrics.add(
            result.ok,
            result.error_class,
            result.ttft_ms,
            result.cold,
            result.quality_pass,
            model_name=self.model,
            engine=self.engine.engine,
        )
        gpu = self.serving_gpu()
        if steer is not None:
            steer.canary(result)
        if self.judge is not None:
            onset = self.onset(gpu)
            with self._judge_lock:
                self.judge.observe(
                    result,
                    gpu,
                    temp_slowdown_c=self._slowdown_c(gpu),
                    temp_target_c=onset.temp_c if onset else None,
                    temp_threshold=onset.source if onset else None,
                    batch_inflight=result.batch_inflight,
                    batch_allowance=result.batch_allowance,
                )
        if self.on_probe:
            self.on_probe(result, gpu)
        return result

    def _check_model(self) -> None:
        """With `model = "auto"`, ask the server for its model before a probe while none is
        known (the daemon started before the engine finished loading) or while the last probe
        was refused for its model name; a model found or changed re-reads the identity, so
        the probe goes out with it instead of failing until the next fingerprint job.

        One GET of /v1/models, bounded by the connect timeout: a server that is still down
        refuses it at once."""
        s = self.settings.server
        if s.model != "auto" or (self.model is not None and not self._model_suspect):
            return
        self._model_suspect = False
        try:
            model = resolve_model(
                s.url, self.api_key, self.transport, timeout_s=self.settings.probe.connect_timeout_s
            )
        except Exception as exc:  # not up yet; the next probe asks again
            log.debug("model not resolved yet: %s", exc)
            return
        if model != self.model:
            log.info("the server answers with model %s; re-reading its identity", model)
            self.refresh_identity()

    def serving_gpu(self) -> GpuSample | None:
        """The GPU the probes are judged against: the worst of those serving the engine (the
        ones `gpu.indices` names, else the ones its processes run on, else all sampled)."""
        samples = self.last_samples
        if not samples:
            return None
        if not self._indices_fixed:
            wanted = serving_indices(
                self._compute_pids, self._engine_pids, [s.gpu_index for s in samples]
            )
            samples = [s for s in samples if s.gpu_index in wanted]
        return worst_gpu(samples, {s.gpu_index: self.onset(s) for s in samples})

    def onset(self, gpu: GpuSample | None) -> Onset | None:
        """Where this GPU's clocks start to fall (llm_watchdog.nvml.thresholds)."""
        if gpu is None:
            return None
        info = next((i for i in self.reader.infos() if i.index == gpu.gpu_index), None)
        return onset_of(info, self.learner.get(gpu.uuid))

    def _slowdown_c(self, gpu: GpuSample | None) -> float | None:
        """NVML's SLOWDOWN, where hardware slowdown engages."""
        return gpu.temp_slowdown_c if gpu is not None else None

    def sample_gpu(self) -> list[GpuSample]:
        samples, events = self.reader.sample()
        if samples:
            self.last_samples = samples
            self.probe_metrics.add_gpu(samples)
            self.store.record_gpu_samples(samples)
            for sample in samples:
                learned = self.learner.add(sample)
                if learned is not None:
                    save_learned_threshold(self.store, *learned, sample.ts, sample.gpu_index)
                    log.info(
                        "GPU %d (%s) first throttled for heat at %.0f °C; kept as its threshold",
                        sample.gpu_index,
                        learned[0],
                        learned[1],
                    )
            if self.judge is not None:
                self.judge.gpu_answered(samples)
            if self.steer is not None:
                serving = self.serving_gpu()
                onset = self.onset(serving)
                self.steer.gpu(serving, onset.temp_c if onset else None)
        for ev in events:
            # A GPU lost or NVML hung loses telemetry; one answering again is the end of that.
            level = logging.INFO if ev.kind == "gpu_recovered" else logging.WARNING
            log.log(level, "GPU telemetry: %s %s", ev.kind, ev.detail)
            self.store.record_gpu_event(ev)
            if self.judge is not None:
                self.judge.gpu_event(ev)
        return samples

    def rollup(self) -> None:
        n = self.store.rollup(self.clock(), self.settings.storage.raw_retention_s)
        if n:
            log.debug("rolled up %d rows", n)
        # After the pass that frees most: the rows it read and the pages pruning let go.
        release_free_memory()

    # ---- scheduling -----------------------------------------------------------------------

    def _guarded(self, name: str, job: Callable[[], object]) -> Callable[[], None]:
        """Run a job, counting it busy for shutdown, logging (never raising) a failure."""

        def run() -> None:
            if self.should_exit.is_set():
                return
            with self._busy_cv:
                self._busy += 1
            try:
                job()
            except StorageError as exc:
                # One line a minute, not a traceback per write (see daemon/storage.py).
                with self._storage_lock:
                    say = self.storage.failed(name, str(exc), self.clock())
                self._say(say, logging.ERROR)
            except Exception:
                log.exception("%s job failed; it runs again at its next interval", name)
            else:
                if name in _WRITING_JOBS and self.storage.failing:
                    with self._storage_lock:
                        say = self.storage.succeeded(self.clock())
                    self._say(say, logging.WARNING)
            finally:
                with self._busy_cv:
                    self._busy -= 1
                    self._busy_cv.notify_all()
                if name == "probe":
                    self.heartbeat.beat()
                    self.first_probe.set()
                    self.notifier.status(self.status_line())

        return run

    def _say(self, say: Say, level: int) -> None:
        if say.log_line:
            log.log(level, "%s", say.log_line)
        alert = say.alert
        if alert is None or self.alerts is None:
            return
        if alert.state == "resolved":
            self._resolve_storage_alerts(alert)
            return
        self._send_storage_alert(alert)
        sinks = [s.name for s in getattr(self.alerts, "sinks", ()) if s.accepts(alert)]
        self.owed_storage.add(alert, sinks)

    def _send_storage_alert(self, alert: AlertEvent) -> None:
        assert self.alerts is not None
        try:
            self.alerts.submit(alert)
        except Exception as exc:  # alerting must not take the daemon down
            log.warning("cannot send the storage alert: %s", exc)

    def _resolve_storage_alerts(self, resolved: AlertEvent) -> None:
        """Resolve every owed storage alert, after writing the firing rows the history lacks:
        those failed to be written, or went to a database since deleted."""
        owed = self.owed_storage.clear()
        for firing, sinks in owed:
            self._record_firing(firing, sinks)
        keys = dict.fromkeys([resolved.key, *(a.key for a, _ in owed)])
        for key in keys:
            self._send_storage_alert(replace(resolved, key=key))

    def _record_firing(self, firing: AlertEvent, sinks: list[str]) -> None:
        try:
            if alert_fired(self.store, firing.key):
                return
            for sink in sinks:
                # Queued to this sink; whether it got through went unrecorded with the row.
                self.store.insert(
                    "alerts", attempt_row(firing, sink, firing.ts, ok=True, attempts=1)
                )
        except Exception as exc:
            log.warning("cannot write the storage alert %s into the history: %s", firing.key, exc)

    def check_database_file(self) -> bool:
        """Exit (code 1, for systemd to restart) when the database was deleted or replaced
        under the daemon: its rows would go to a file nobody reads. True while it is fine."""
        detail = self.store.file_changed()
        if detail is None:
            return True
        self._say(self.storage.file_gone(detail, self.clock()), logging.ERROR)
        if self.alerts is not None:
            flush = getattr(self.alerts, "flush", None)
            if flush is not None:
                flush(timeout_s=5.0)
        self.exit_code = EXIT_FAILURE
        self.should_exit.set()
        return False

    def jobs(self) -> list[Job]:
        """The daemon's periodic work, each job guarded as the scheduler runs it. `start_jobs`
        hands these to APScheduler; a benchmark may step them on a virtual clock instead
        (tests/benchmarks/bench_soak.py --days)."""
        p, g = self.settings.probe, self.settings.gpu

        def job(id: str, interval_s: float, work: Callable[[], object], **kw: Any) -> Job:
            return Job(id, interval_s, self._guarded(id, work), **kw)

        table = [job("probe", p.interval_s, self.probe_once, jitter_s=p.jitter_s, first_after_s=0)]
        if self.gpu_enabled and self.reader.available:
            table.append(job("gpu", g.interval_s, self.sample_gpu, first_after_s=0))
        table.append(job("fingerprint", p.fingerprint_interval_s, self.refresh_identity))
        if self.steer is not None:
            table.append(job("control", self.settings.control.interval_s, self.steer.step))
        table.append(job("rollup", self.settings.storage.rollup_interval_s, self.rollup))
        table.append(job("database-file", FILE_CHECK_S, self.check_database_file))
        return table

    def start_jobs(self) -> None:
        sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30},
            timezone="UTC",
        )
        for job in self.jobs():
            kwargs: dict[str, Any] = {}
            if job.first_after_s is not None:
                # The first probe runs right away (plus jitter), so a fresh start shows a
                # number within seconds; the GPU is sampled at once.
                jitter = random.uniform(0, min(job.jitter_s, job.interval_s))
                kwargs["next_run_time"] = _utc(time.time() + job.first_after_s + jitter)
            sched.add_job(
                job.run,
                "interval",
                seconds=job.interval_s,
                jitter=job.jitter_s or None,
                id=job.id,
                **kwargs,
            )
        sched.start()
        self.scheduler = sched

    def status(self) -> dict[str, Any]:
        """What the daemon knows now, for /status and /metrics: all from memory."""
        judge = self.judge
        with self._judge_lock:
            drift = judge.monitor.snapshot() if judge is not None else None
        return {
            "server": self.settings.server.url,
            "model": self.model,
            "engine": {"name": self.engine.engine, "version": self.engine.version},
            "fingerprint": self.fingerprint.key_fields()
            | self.fingerprint.extra
            | {"id": self.fingerprint_id}
            if self.fingerprint
            else None,
            "last_probe": self.last_result.to_dict() if self.last_result else None,
            "gpus": [s.to_dict() for s in self.last_samples],
            "gpu_info": [
                {"index": i.index, "uuid": i.uuid, "name": i.name} for i in self.reader.infos()
            ],
            "nvml": self.reader.available,
            "drift": drift,
            "control": self._control_status(),
            "alert_deliveries": getattr(self.alerts, "delivery_counts", lambda: None)(),
            "database": self.settings.storage.path,
        }

    def status_line(self) -> str:
        """One line for systemd's STATUS= (systemctl status shows it)."""
        r = self.last_result
        where = f"watching {self.settings.server.url}"
        if r is None:
            return f"{where}; no probe yet"
        if r.ok and r.ttft_ms is not None:
            return f"{where}; last probe ok, TTFT {r.ttft_ms:.0f} ms"
        return f"{where}; last probe failed ({r.error_class or 'error'})"

    def _control_status(self) -> dict[str, Any] | None:
        if self.steer is None:
            return None
        target_ms = self.settings.control.target_p95_s * 1000.0
        return self.steer.snapshot() | {"target_p95_ms": target_ms}

    def start_api(self) -> None:
        listen = self.settings.api.listen
        if not listen:
            return
        host, _, port = listen.rpartition(":")
        self.api = ApiServer(
            host.strip("[]") or "127.0.0.1", int(port), self.status, self.probe_metrics
        ).start()
        log.info("metrics and status at %s/metrics and %s/status", self.api.url, self.api.url)

    def install_signal_handlers(self) -> None:
        def handle(signum: int, frame: object) -> None:
            self.stop_signal = signum  # said by shutdown(): no logging in a signal handler
            self.should_exit.set()

        def reload(signum: int, frame: object) -> None:
            self.reload_requested.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        # SIGHUP's default kills the process (exit 129, which systemd counts as clean).
        signal.signal(signal.SIGHUP, reload)

    def serve(self, reload: Callable[[], Settings | None] | None = None) -> Settings | None:
        """Run the jobs until asked to stop (None) or a SIGHUP brings a config `reload()`
        accepts (the new settings, for the caller to start over with).

        `reload()` returns None when it refused the new config; the daemon keeps running.
        """
        if self.api is None:
            self.start_api()
        self.start_jobs()
        e = self.engine
        # "engine unknown unknown" reads as a fault in the message itself.
        if e.engine in ("unknown", "unreachable"):
            every = human_duration(self.settings.probe.fingerprint_interval_s)
            engine = f"engine not known yet, read again every {every}"
        else:
            engine = f"engine {e.engine}" + (f" {e.version}" if e.version != "unknown" else "")
        log.info(
            "watching %s (model %s, %s); probe every %ss; database %s",
            self.settings.server.url,
            self.model or "auto",
            engine,
            self.settings.probe.interval_s,
            self.settings.storage.path,
        )
        self.heartbeat.start()
        p = self.settings.probe
        deadline = time.monotonic() + 2 * p.interval_s + p.jitter_s + p.total_timeout_s
        while not (self.first_probe.is_set() or self.should_exit.is_set()):
            if time.monotonic() > deadline:
                break
            self.first_probe.wait(0.2)
        self.notifier.ready(self.status_line())
        while not self.should_exit.wait(0.2):
            if not self.reload_requested.is_set():
                continue
            self.reload_requested.clear()
            if reload is None:
                log.info("SIGHUP: nothing to reload")
                continue
            self.notifier.reloading()
            new = reload()
            if new is not None:
                return new
            self.notifier.ready(self.status_line())
        return None

    def shutdown(self, timeout_s: float = 5.0, *, stopping: bool = True) -> bool:
        """Stop the jobs; wait at most `timeout_s` for running ones. True if all finished.

        `stopping=False` (a reload) leaves systemd's state as it is.
        """
        if stopping:
            self.notifier.stopping()
            why = f" on {signal.Signals(self.stop_signal).name}" if self.stop_signal else ""
            log.info("stopping%s", why)
        self.heartbeat.stop()
        self.should_exit.set()
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        with self._lock:
            prober = self.prober
        deadline = time.monotonic() + timeout_s
        with self._busy_cv:
            while self._busy and time.monotonic() < deadline:
                self._busy_cv.wait(deadline - time.monotonic())
            clean = self._busy == 0
        if prober is not None:
            prober.close()
        if self.api is not None:
            self.api.stop()
        if self.steer is not None:
            self.steer.close()
        self.reader.stop()
        if stopping:
            log.info("stopped" if clean else "stopped, a job still running")
        return clean


def build_steer(
    settings: Settings,
    store: Store,
    alerts: Any | None,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> Steer:
    """The control loop over the configured actuator, on the daemon's clocks."""
    c = settings.control
    config = settings.control_config()
    if c.actuator == "gateway":
        return gateway_steer(
            config,
            c.gateway_url,
            settings.control_token(),
            store,
            alerts=alerts,
            dry_run=c.dry_run,
            clock=clock,
            monotonic=monotonic,
        )
    if c.actuator == "haproxy":
        actuator: Actuator = HaproxyActuator(c.haproxy_socket, c.haproxy_backend, c.haproxy_server)
    else:
        actuator = CommandActuator(c.command)
    return Steer(
        config, actuator, store, alerts=alerts, dry_run=c.dry_run, clock=clock, monotonic=monotonic
    )


def _utc(ts: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)
