"""Which engine serves the model, and which model: read from the server's own endpoints.

`detect_engine` asks, in this order and only as far as needed (each a small GET):

    /v1/models        every OpenAI-compatible server: model ids, and `owned_by`, which vLLM
                      ("vllm"), SGLang ("sglang") and llama.cpp ("llamacpp") fill with their name
    /props            llama.cpp: `build_info` is its version (also `total_slots`, `model_path`)
    /api/version      Ollama: {"version": ...}; its models from /api/tags
    /info             TGI: `model_id` and `version`
    /get_server_info  SGLang: `version`
    /version          vLLM: {"version": ...}

It never raises for a server that cannot be reached: it returns `engine="unreachable"` with a
one-line `detail` saying what to try. Where nothing identifies the engine it returns
`engine="unknown"` with whatever models it found. When `owned_by` names the engine but its info
endpoint does not answer (a proxy that passes only `/v1`), the engine is named with version
"unknown".

Base URLs are accepted with or without the `/v1` suffix: `http://host:8000` and
`http://host:8000/v1` mean the same server.
"""

from __future__ import annotations

import functools
import json
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from llm_watchdog.errors import EngineError
from llm_watchdog.probe.fingerprint import flags

UNREACHABLE = "unreachable"
UNKNOWN = "unknown"

# The most an info document may hold: /v1/models of a server with hundreds of models is tens
# of KiB, and an answer that never ends must not fill the daemon's (or the gateway's) memory.
MAX_DOC_BYTES = 1 << 20


class ModelResolveError(EngineError, RuntimeError):
    """`model = "auto"` could not be resolved. The message is one line with what to try."""


@dataclass(frozen=True)
class EngineInfo:
    engine: str  # llamacpp, vllm, sglang, tgi, ollama, unknown, unreachable
    version: str
    models: tuple[str, ...]
    # The engine's own info document (llama.cpp /props, TGI /info, ...); for an unreachable
    # server {"error": "connection refused"} (a few words; `detail` has the whole line).
    props: dict[str, Any] = field(default_factory=dict, compare=False)
    detail: str = ""  # why the engine is unreachable or unknown, one line


def engine_slots(info: EngineInfo) -> int | None:
    """Sequences the engine runs at once, where its info document says (None: it does not).

    llama.cpp's /props has `total_slots` (--parallel); SGLang's /get_server_info has
    `max_running_requests`. vLLM, Ollama and TGI do not publish theirs.
    """
    key = {"llamacpp": "total_slots", "sglang": "max_running_requests"}.get(info.engine)
    value = info.props.get(key) if key else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


# The launch flag that sets the slots, per engine, where the engine does not publish them.
SLOT_FLAGS = {
    "vllm": ("--max-num-seqs", "--max_num_seqs"),
    "llamacpp": ("--parallel", "-np"),
    "sglang": ("--max-running-requests", "--max_running_requests"),
}


def slots_from_launch(engine: str, command: str | None) -> int | None:
    """Sequences the engine runs at once as its launch command sets them (None: the command
    is not known or sets none; the engine's own default is not guessed)."""
    if not command:
        return None
    given = flags(command)
    value = next((given[name] for name in SLOT_FLAGS.get(engine, ()) if name in given), "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def api_root(base_url: str) -> str:
    """The server root for a base URL given with or without `/v1` (and trailing slashes)."""
    url = base_url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(
            f"server URL {base_url!r} must look like http://HOST:PORT or http://HOST:PORT/v1"
        )
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def models_url(base_url: str, api: str = "openai") -> str:
    """The URL a person can `curl` to see whether the server is up."""
    root = api_root(base_url)
    return f"{root}/api/tags" if api == "ollama" else f"{root}/v1/models"


def detect_engine(
    base_url: str,
    api_key: str | None = None,
    transport: httpx.BaseTransport | None = None,
    timeout_s: float = 3.0,
) -> EngineInfo:
    """Find out which engine serves `base_url`, its version and its models. Never raises
    for an unreachable server (see the module docstring)."""
    root = api_root(base_url)
    with engine_client(api_key, transport, timeout_s) as client:
        models_doc, problem = _get_json(client, f"{root}/v1/models")
        if problem is not None and problem.unreachable:
            return EngineInfo(UNREACHABLE, UNKNOWN, (), {"error": problem.reason}, problem.text)
        models = _model_ids(models_doc)
        owned_by = _owned_by(models_doc)

        if owned_by in (None, "llamacpp"):
            props, _ = _get_json(client, f"{root}/props")
            if isinstance(props, dict) and (
                "build_info" in props or "default_generation_settings" in props
            ):
                return EngineInfo("llamacpp", _str(props.get("build_info")), models, props)
            if owned_by == "llamacpp":  # behind a proxy that passes only /v1, say
                return EngineInfo("llamacpp", UNKNOWN, models, {}, "/props did not answer")
        if owned_by is None or owned_by == "library":
            ver, _ = _get_json(client, f"{root}/api/version")
            if isinstance(ver, dict) and isinstance(ver.get("version"), str):
                tags, _ = _get_json(client, f"{root}/api/tags")
                names = models or _ollama_names(tags)
                return EngineInfo("ollama", ver["version"], names, {"version": ver, "tags": tags})
            if owned_by == "library":
                return EngineInfo("ollama", UNKNOWN, models, {}, "/api/version did not answer")
        if owned_by is None:
            info, _ = _get_json(client, f"{root}/info")
            if isinstance(info, dict) and "model_id" in info:
                names = models or (_str(info["model_id"]),)
                return EngineInfo("tgi", _str(info.get("version")), names, info)
        if owned_by in (None, "sglang"):
            info, _ = _get_json(client, f"{root}/get_server_info")
            if isinstance(info, dict) and "version" in info:
                return EngineInfo("sglang", _str(info.get("version")), models, info)
            if owned_by == "sglang":
                return EngineInfo("sglang", UNKNOWN, models, {}, "/get_server_info did not answer")
        if owned_by in (None, "vllm"):
            ver, _ = _get_json(client, f"{root}/version")
            if isinstance(ver, dict) and isinstance(ver.get("version"), str):
                return EngineInfo("vllm", ver["version"], models, ver)
            if owned_by == "vllm":
                return EngineInfo("vllm", UNKNOWN, models, {}, "/version did not answer")
        detail = problem.text if problem is not None else "no engine-specific endpoint answered"
        return EngineInfo(UNKNOWN, UNKNOWN, models, {}, detail)


def resolve_model(
    base_url: str,
    api_key: str | None = None,
    transport: httpx.BaseTransport | None = None,
    timeout_s: float = 5.0,
) -> str:
    """The model to probe when the configuration says `auto`: the first id of /v1/models,
    else the first of Ollama's /api/tags. Raises ModelResolveError with a one-line message."""
    root = api_root(base_url)
    with engine_client(api_key, transport, timeout_s) as client:
        doc, problem = _get_json(client, f"{root}/v1/models")
        ids = _model_ids(doc)
        if ids:
            return ids[0]
        if problem is not None and problem.unreachable:
            raise ModelResolveError(problem.text)
        tags, _ = _get_json(client, f"{root}/api/tags")
        names = _ollama_names(tags)
        if names:
            return names[0]
    why = problem.text if problem is not None else f"{root}/v1/models lists no model"
    raise ModelResolveError(
        f"cannot pick a model automatically: {why}; set the model name explicitly"
    )


@dataclass(frozen=True)
class _Problem:
    text: str  # one line with what to try
    unreachable: bool
    reason: str = ""  # a few words: "connection refused", "timed out"


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every short-lived client: building one loads the CA bundle, about
    50 ms of CPU, and the daemon opens clients every minute to re-read the engine's identity."""
    return httpx.create_ssl_context()


def engine_client(
    api_key: str | None, transport: httpx.BaseTransport | None, timeout_s: float
) -> httpx.Client:
    """A client for a few requests to the engine (or the gateway before it)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # trust_env=False: a proxy from the environment must not sit between the probe and the engine.
    return httpx.Client(
        transport=transport,
        timeout=timeout_s,
        headers=headers,
        trust_env=False,
        verify=tls_context(),
    )


def gateway_identity(
    base_url: str, transport: httpx.BaseTransport | None = None, timeout_s: float = 5.0
) -> dict[str, Any] | None:
    """The upstream engine's identity when `base_url` is an llm-watchdog gateway (its
    GET /control/identity: engine, version, models, launch command and where it was read,
    engine pid), else None. Behind the gateway the listening process is the gateway, so this
    is how the daemon and `bench` name the engine they measure."""
    try:
        url = api_root(base_url) + "/control/identity"
        with engine_client(None, transport, timeout_s) as client:
            status, body = _get_capped(client, url)
        doc = json.loads(body) if status == 200 else None
    except (httpx.HTTPError, ValueError, _TooLarge):
        return None
    if isinstance(doc, dict) and doc.get("gateway") == "llm-watchdog":
        return doc
    return None


class _TooLarge(Exception):
    """An answer past MAX_DOC_BYTES."""


def _get_capped(client: httpx.Client, url: str) -> tuple[int, bytes]:
    """GET `url`: its status and body, read as it comes and given up past MAX_DOC_BYTES or
    twice the client's read timeout in all (httpx's timeout is per read, so an answer that
    trickles forever would otherwise never end)."""
    deadline = time.monotonic() + 2 * (client.timeout.read or 5.0)
    with client.stream("GET", url) as response:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_DOC_BYTES:
            raise _TooLarge
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_DOC_BYTES:
                raise _TooLarge
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the answer did not end in time")
        return response.status_code, bytes(body)


def _get_json(client: httpx.Client, url: str) -> tuple[Any, _Problem | None]:
    try:
        status, body = _get_capped(client, url)
    except _TooLarge:
        return None, _Problem(
            f"{url} answered more than {MAX_DOC_BYTES >> 20} MiB, which no engine's info "
            "document is: is this URL the LLM server?",
            unreachable=False,
        )
    except httpx.TimeoutException:
        return None, _Problem(
            f"no answer from {url} within {client.timeout.read} s: is the server hung or still "
            f"starting? try `curl -m 5 {url}`",
            unreachable=True,
            reason="timed out",
        )
    except httpx.TransportError as exc:
        reason = connect_reason(exc)
        return None, _Problem(
            f"cannot reach {url} ({reason}): is the server running? try `curl {url}`",
            unreachable=True,
            reason=reason,
        )
    if status in (401, 403):
        return None, _Problem(f"{url} answered HTTP {status}: check the API key", unreachable=False)
    if status != 200:
        return None, _Problem(f"{url} answered HTTP {status}", unreachable=False)
    try:
        return json.loads(body), None
    except ValueError:
        return None, _Problem(f"{url} did not answer JSON", unreachable=False)


def connect_reason(exc: BaseException) -> str:
    """A few words for why a connection failed, from an httpx/OS error."""
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if "name or service not known" in low or "nodename nor servname" in low or "getaddrinfo" in low:
        return "host name not found"
    if "unreachable" in low:
        return "network unreachable"
    if "timed out" in low or isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return " ".join(text.split())[:100]


def _model_ids(doc: Any) -> tuple[str, ...]:
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        return ()
    return tuple(
        m["id"] for m in doc["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)
    )


def _owned_by(doc: Any) -> str | None:
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        for m in doc["data"]:
            if isinstance(m, dict) and m.get("owned_by") in (
                "vllm",
                "sglang",
                "llamacpp",
                "library",
            ):
                return str(m["owned_by"])
    return None


def _ollama_names(doc: Any) -> tuple[str, ...]:
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        return ()
    out = []
    for m in doc["models"]:
        if isinstance(m, dict):
            name = m.get("name") or m.get("model")
            if isinstance(name, str) and name:
                out.append(name)
    return tuple(out)


def _str(value: Any) -> str:
    return value if isinstance(value, str) and value else UNKNOWN
