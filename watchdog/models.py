"""Values passed between layers.

Small frozen dataclasses with the unit in every field name. Nothing here does I/O;
every layer (probe, gpu, store, drift, control, sim) speaks in these types.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Error classes a probe can end in. Every failure is a ProbeResult carrying one of these,
# never an exception that escapes the probe.
ERROR_CLASSES = (
    "connect_refused",  # nothing listening at the address
    "connect_timeout",  # no TCP/TLS connection within probe.connect_timeout
    "first_token_timeout",  # connected, but no content token within probe.first_token_timeout
    "total_timeout",  # tokens came, but the answer did not finish within probe.total_timeout
    "http_status",  # the server answered with a non-2xx status
    "protocol_error",  # the stream could not be parsed (not SSE/NDJSON, broken JSON, no tokens)
    "server_error",  # the server sent an error event inside a 200 stream
    "stale_connection",  # a pooled keep-alive connection was closed by the server before answering
    "over_length",  # the answer ran past the probe's token or byte bound (max_tokens ignored)
)


@dataclass(frozen=True)
class ProbeResult:
    """One canary chat request and what it measured. Times in milliseconds."""

    ts: float  # UTC unix seconds when the request was sent
    prompt_id: str
    probe_set: str
    url: str
    model: str
    ok: bool
    cache_mode: str  # "bust" or "cached"
    cache_bust: str  # how the cache was busted: "cache_prompt_false", "system_nonce", "none"
    connection: str = "fresh"  # "fresh", "reused", "retried_stale"
    error_class: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    ttft_ms: float | None = None  # request sent -> first delta with content/reasoning/tool call
    first_event_ms: float | None = None  # request sent -> first SSE/NDJSON event of any kind
    total_ms: float | None = None
    output_tokens: int | None = None
    gap_p50_ms: float | None = None  # inter-token gaps after the first token
    gap_max_ms: float | None = None
    answer: str = ""
    quality_pass: bool | None = None  # None when there was no answer to judge
    load_duration_ms: float | None = None  # Ollama: model load time (cold start)
    cold: bool = False
    # The serving layer's batch state when the probe was sent (None without a gateway):
    # what tells "load" from heat, kept so an exported trace replays to the same cause.
    batch_inflight: int | None = None
    batch_allowance: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuInfo:
    """What does not change while a GPU is attached: read once per NVML session."""

    index: int
    uuid: str | None
    name: str | None
    temp_slowdown_c: float | None
    temp_shutdown_c: float | None
    temp_gpu_max_c: float | None
    sm_clock_max_mhz: float | None
    mem_clock_max_mhz: float | None
    power_limit_default_w: float | None
    # NVML ACOUSTIC_CURR, the "GPU Target Temperature": where GeForce clocks start to fall.
    temp_target_c: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of one GPU. A field the GPU does not support is None."""

    ts: float  # UTC unix seconds
    gpu_index: int
    uuid: str | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    fan_pct: float | None = None
    pstate: int | None = None
    throttle_reasons: int | None = None  # NVML clocks-event reasons bitmask
    thermal_violation_ms: float | None = None  # time throttled by heat since the previous sample
    power_violation_ms: float | None = None  # power-capped time since previous sample
    temp_slowdown_c: float | None = None
    temp_target_c: float | None = None  # NVML ACOUSTIC_CURR, from GpuInfo

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuEvent:
    """Something that happened to telemetry itself: a GPU lost or back, NVML missing."""

    ts: float
    kind: str  # "nvml_unavailable", "gpu_lost", "gpu_recovered", "nvml_timeout", "nvml_restarted"
    gpu_index: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Fingerprint:
    """What produced a number. A baseline belongs to exactly one fingerprint."""

    engine: str = "unknown"
    engine_version: str = "unknown"
    model: str = "unknown"
    launch_command: str = "unknown"
    driver_version: str = "unknown"
    gpu_name: str = "unknown"
    gpu_uuid: str = "unknown"
    probe_set_hash: str = "unknown"
    config_hash: str = "unknown"
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def key_fields(self) -> dict[str, str]:
        d = asdict(self)
        d.pop("extra")
        return d

    @property
    def id(self) -> str:
        import hashlib

        blob = json.dumps(self.key_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
