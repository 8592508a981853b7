"""Settings of the gateway: a frozen dataclass that only holds values.

The TOML `[gateway]` section and the `gateway` command both fill a `GatewayConfig`;
`__post_init__` rejects what cannot work, with one line naming the field and what to use.
The control token is a secret: it is read from a file or an environment variable
(`read_token`), never taken from a command line, and never shown by `repr`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from llm_watchdog.control.slots import slots_kept
from llm_watchdog.urls import check_http_url

CHAT = "chat"
BATCH = "batch"
CLASSES = (CHAT, BATCH)

TOKEN_ENV = "LLM_WATCHDOG_GATEWAY_TOKEN"
# One batch request let in every 2 s after a raise; the heat lab's gateway uses it too.
DEFAULT_BATCH_RAMP_PER_S = 0.5
# An allowance batch has left unused this long, with nobody waiting, ramps again: longer than
# the moment between one request ending and its stream sending the next, far shorter than a
# job's pause between runs.
DEFAULT_BATCH_RAMP_IDLE_S = 10.0
# `engine_slots` that asks the engine: llama.cpp's /props and SGLang's /get_server_info say.
ENGINE_SLOTS_AUTO = -1


@dataclass(frozen=True)
class GatewayConfig:
    """What the gateway listens on, where it forwards, and how it treats each class."""

    upstream_url: str = "http://127.0.0.1:8000"
    listen_host: str = "127.0.0.1"
    listen_port: int = 8090
    # Where batch goes when its queue wait runs out, instead of a 429 (None: reject).
    secondary_upstream_url: str | None = None
    default_class: str = CHAT
    # API key (the bearer token a client sends) -> class. Keys are secrets: not in repr.
    key_classes: Mapping[str, str] = field(default_factory=dict, repr=False)
    batch_default_allowance: int = 8
    batch_ceiling: int = 64
    # How long a batch request waits for room before a 429; time the ramp alone holds it
    # back (the allowance has room, the climb has not reached it) does not count.
    max_queue_wait_s: float = 30.0
    # After a raise, batch in flight climbs to the new allowance at this many requests a
    # second, from what runs: many long prefills started at once stall chat (0: at once).
    batch_ramp_per_s: float = DEFAULT_BATCH_RAMP_PER_S
    # ... and so does a job that starts, or comes back, into an allowance it left unused this
    # long with nobody waiting: the limit falls back to what runs (0: never).
    batch_ramp_idle_s: float = DEFAULT_BATCH_RAMP_IDLE_S
    # Batch requests waiting at once; one more is rejected at once (memory stays bounded).
    max_queued: int = 1024
    # A cut of the batch allowance under what runs ends the newest batch requests in flight
    # (503 or an error event; the client retries), instead of letting them run to their end
    # while a chat burst waits behind them. Chat is never pre-empted.
    preempt_batch: bool = False
    # Sequences the engine runs at once (vLLM's max_num_seqs, llama.cpp's --parallel); 0:
    # not known, no slot line; ENGINE_SLOTS_AUTO: asked of the engine while the gateway runs.
    # Known, batch is let in only while batch and chat in flight stay under the slots less
    # an eighth of them, at least 1 and at most 4 (`slots_kept`): a chat request that
    # arrives finds a slot free instead of waiting behind batch requests that hold theirs
    # for minutes.
    engine_slots: int = 0
    # Class -> priority with vLLM's meaning (lower runs first). Empty: nothing injected.
    priorities: Mapping[str, int] = field(default_factory=dict)
    priority_field: str = "priority"
    # SGLang without --schedule-low-priority-values-first runs higher values first:
    # set this and the injected value is negated, so the ranks above keep their meaning.
    priority_higher_first: bool = False
    control_token: str | None = field(default=None, repr=False)
    upstream_connect_timeout_s: float = 10.0
    # Idle kept-alive connections kept per engine: as many as it runs requests at once
    # (vLLM's max_num_seqs, llama.cpp's --parallel) is all a pool can use.
    upstream_pool_size: int = 256
    # From the request written upstream to the answer's status line. A streamed answer's
    # headers come at once; a non-streamed one's come with its last token, so a long
    # non-streamed batch answer needs this raised. None: wait forever.
    upstream_first_byte_timeout_s: float | None = 300.0
    # Silence allowed between two chunks of an upstream answer; a long prefill is silent.
    upstream_read_timeout_s: float | None = 600.0
    # A client gets this long to send its request headers, and then this long for the body
    # (slowloris): past either it gets 408 and the connection closes.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # An answer held back for a client that takes none of its bytes for this long is ended:
    # the engine's reading is paused meanwhile (backpressure), so no read timeout fires,
    # and the request would keep its class's place and its engine connection forever.
    # 0: never.
    client_stall_timeout_s: float = 60.0
    # Open client connections; one more is answered 503 (each holds a file descriptor:
    # the systemd unit's LimitNOFILE must be above it).
    max_connections: int = 4096
    # Request bodies over this are answered 413: the proxy's (a long prompt, images as
    # base64) and the control API's (a few fields).
    max_body_bytes: int = 32 * 1024 * 1024
    max_control_body_bytes: int = 64 * 1024
    # Request-body bytes held at once across all connections: a body is held whole from
    # its headers (its declared length) until it goes upstream, and max_connections bodies
    # of max_body_bytes each would be 128 GiB. One that would go past it gets 503.
    max_body_total_bytes: int = 256 * 1024 * 1024
    # Recent TTFTs kept per class for GET /control/observed and the p50/p95 in GET /control.
    ttft_ring_size: int = 2048
    observed_window_s: float = 300.0
    shutdown_timeout_s: float = 10.0

    @property
    def slot_line(self) -> int | None:
        """Batch and chat in flight together under which batch is let in (None: no line, or
        not known before the engine says: `Gateway.slot_line` is the running one)."""
        return slot_line(self.engine_slots)

    def __post_init__(self) -> None:
        _check_url("upstream_url", self.upstream_url)
        if self.secondary_upstream_url is not None:
            _check_url("secondary_upstream_url", self.secondary_upstream_url)
        if self.default_class not in CLASSES:
            raise ValueError(
                f"default_class must be one of {', '.join(CLASSES)}, got {self.default_class!r}"
            )
        for key, cls in self.key_classes.items():
            if cls not in CLASSES:
                raise ValueError(
                    f"key_classes: class for key ending …{key[-4:]} must be one of "
                    f"{', '.join(CLASSES)}, got {cls!r}"
                )
        if not _is_int(self.batch_ceiling) or self.batch_ceiling < 0:
            raise ValueError(f"batch_ceiling must be an integer >= 0, got {self.batch_ceiling!r}")
        if not _is_int(self.batch_default_allowance) or not (
            0 <= self.batch_default_allowance <= self.batch_ceiling
        ):
            raise ValueError(
                f"batch_default_allowance must be an integer in [0, {self.batch_ceiling}] "
                f"(batch_ceiling), got {self.batch_default_allowance!r}"
            )
        if not _is_seconds(self.max_queue_wait_s):
            raise ValueError(f"max_queue_wait_s must be >= 0 seconds, got {self.max_queue_wait_s}")
        if not _is_seconds(self.batch_ramp_per_s):
            raise ValueError(
                f"batch_ramp_per_s must be >= 0 requests a second (0: no ramp), "
                f"got {self.batch_ramp_per_s}"
            )
        if not _is_seconds(self.batch_ramp_idle_s):
            raise ValueError(
                f"batch_ramp_idle_s must be >= 0 seconds (0: never ramp again), "
                f"got {self.batch_ramp_idle_s}"
            )
        if not isinstance(self.preempt_batch, bool):
            raise ValueError(f"preempt_batch must be true or false, got {self.preempt_batch!r}")
        if not _is_int(self.engine_slots) or self.engine_slots < ENGINE_SLOTS_AUTO:
            raise ValueError(
                f"engine_slots must be an integer >= 0 (the engine's max_num_seqs or "
                f"--parallel; 0: not known) or {ENGINE_SLOTS_AUTO} (ask the engine), "
                f"got {self.engine_slots!r}"
            )
        if not _is_int(self.max_queued) or self.max_queued < 0:
            raise ValueError(f"max_queued must be an integer >= 0, got {self.max_queued!r}")
        for cls, value in self.priorities.items():
            if cls not in CLASSES or not _is_int(value):
                raise ValueError(
                    f"priorities must map chat/batch to integers, got {cls!r} = {value!r}"
                )
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listen_port must be in [0, 65535], got {self.listen_port}")
        for name in ("upstream_first_byte_timeout_s", "upstream_read_timeout_s"):
            value = getattr(self, name)
            if value is not None and (not _is_seconds(value) or value <= 0):
                raise ValueError(f"{name} must be > 0 seconds or None (no limit), got {value!r}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not _is_seconds(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if not _is_seconds(self.client_stall_timeout_s):
            raise ValueError(
                f"client_stall_timeout_s must be >= 0 seconds (0: never), "
                f"got {self.client_stall_timeout_s!r}"
            )
        for name in (
            "max_connections",
            "max_body_bytes",
            "max_control_body_bytes",
            "max_body_total_bytes",
            "upstream_pool_size",
        ):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max_body_total_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_body_total_bytes ({self.max_body_total_bytes}) must be at least "
                f"max_body_bytes ({self.max_body_bytes}): a body the one allows, the other "
                "would refuse every time"
            )
        if self.ttft_ring_size < 1:
            raise ValueError(f"ttft_ring_size must be >= 1, got {self.ttft_ring_size}")
        # Frozen means frozen: a caller's dict changed later must not change the gateway.
        object.__setattr__(self, "key_classes", MappingProxyType(dict(self.key_classes)))
        object.__setattr__(self, "priorities", MappingProxyType(dict(self.priorities)))


def slot_line(engine_slots: int) -> int | None:
    """The gateway's slot line on an engine of `engine_slots` (0: not known, no line): the
    heat lab's gateway draws it the same way."""
    if engine_slots <= 0:
        return None
    return engine_slots - slots_kept(engine_slots)


def read_token(
    token_file: str | os.PathLike[str] | None = None,
    env_name: str = TOKEN_ENV,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The control token from `token_file`, else from the environment variable `env_name`.

    A named file that cannot be read, or is empty, raises ValueError saying what to do.
    Returns None when neither is given: the control API then refuses every change.
    """
    if token_file:
        path = Path(token_file)
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(
                f"cannot read control token file {path} ({exc.strerror}): "
                "create it (mode 0600) with one line holding the token"
            ) from exc
        if not token:
            raise ValueError(f"control token file {path} is empty: write the token into it")
        return token
    env = os.environ if environ is None else environ
    token = env.get(env_name, "").strip()
    return token or None


def _check_url(name: str, url: str) -> None:
    try:
        check_http_url(url, "http://127.0.0.1:8000")
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    parts = urlsplit(url)
    if parts.path.rstrip("/").endswith("/v1"):
        raise ValueError(
            f"{name} must be the engine's root, like http://127.0.0.1:8000, not {url!r}: "
            "the gateway forwards the client's path (/v1/...) as it is"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_seconds(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
