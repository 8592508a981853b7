"""The real-time heat lab: a simulated engine behind an OpenAI-compatible server over real
sockets, and a fake NVML module over the same simulated card, all on one clock.

    with SimLab("consumer-warm-room", time_scale=20, batch_streams=8) as lab:
        lab.url          # http://127.0.0.1:PORT (OpenAI API under /v1)
        lab.nvml         # a pynvml-like module: hand it to llm_watchdog.nvml.reader.NvmlReader
        lab.set_batch_streams(4)     # the lab's own batch job: how many streams it wants
        lab.set_batch_allowance(2)   # a gateway-style cap on them (None: no cap)

Endpoints: POST /v1/chat/completions (SSE when `stream`: a role-only first chunk, one delta
per token paced by the engine model, a final chunk with finish_reason, a usage chunk when
`stream_options.include_usage`, then `[DONE]`; JSON otherwise), GET /v1/models, /health,
/metrics (Prometheus text, vLLM's names), /version (posing as vLLM) or /props (posing as
llama.cpp), /sim/state (the card and the batch job, as JSON) and /sim/gpu (the card's
parameters and a snapshot, read by llm_watchdog.sim.remote for a daemon in another process).

Requests are chat unless sent with `X-Traffic-Class: batch`; a body `priority` (vLLM's
extension) overrides the class's priority. `time_scale` compresses the card's thermal time
and the scenario's schedule (see Scenario.compressed); tokens keep real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from llm_watchdog import __version__
from llm_watchdog.errors import WatchdogError
from llm_watchdog.sim.answers import Answers
from llm_watchdog.sim.engine import CANCELLED, DONE, Request
from llm_watchdog.sim.fakenvml import FakeNvml
from llm_watchdog.sim.gpu import GpuSnapshot
from llm_watchdog.sim.scenario import GpuParams, Scenario, load_scenario
from llm_watchdog.sim.world import World

PREFIX_CACHE_ENTRIES = 256


class LabError(WatchdogError, RuntimeError):
    """The lab could not start (port taken, thread failed)."""


class _LabDevice:
    """The fake NVML's view of the lab's card: reads catch the world up to `now` first."""

    def __init__(self, lab: SimLab) -> None:
        self._lab = lab
        self.params: GpuParams = lab.scenario.gpu

    def read(self, now_s: float) -> GpuSnapshot:
        with self._lab._lock:
            return self._lab.world.snapshot(max(now_s, self._lab.world.t_s))


class SimLab:
    def __init__(
        self,
        scenario: Scenario | str,
        time_scale: float = 1.0,
        *,
        batch_streams: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        probe_sets: list[str] | None = None,
    ) -> None:
        base = load_scenario(scenario) if isinstance(scenario, str) else scenario
        self.time_scale = time_scale
        self.scenario = base.compressed(time_scale)
        self.world = World(self.scenario, seed=seed)
        if batch_streams is not None:
            self.world.set_batch_streams(batch_streams, 0.0)
        self.host, self.port = host, port
        self.answers = Answers(probe_sets)
        self._lock = threading.RLock()
        self._t0 = time.monotonic()
        self._streams: dict[int, asyncio.Event] = {}
        self._cache: OrderedDict[str, None] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._url: str | None = None
        self._error: BaseException | None = None
        self._stopping = False
        self.nvml_device = _LabDevice(self)
        self.nvml = FakeNvml([self.nvml_device], self.now)

    # -- clock and controls ---------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the lab was made: the one clock of engine, card and schedule."""
        return time.monotonic() - self._t0

    @property
    def url(self) -> str:
        if self._url is None:
            raise LabError("the lab is not started; call start() first")
        return self._url

    def set_batch_streams(self, n: int) -> None:
        """How many batch requests the lab's own batch job wants in flight."""
        with self._lock:
            self.world.set_batch_streams(n, self.now())
        self._poke()

    def set_batch_allowance(self, n: int | None) -> None:
        """Cap the lab's own batch job at `n` requests in flight (None: no cap)."""
        with self._lock:
            self.world.set_allowance(n, self.now())
        self._poke()

    def state(self) -> dict[str, Any]:
        with self._lock:
            now = self.now()
            snap = self.world.snapshot(max(now, self.world.t_s))
            eng = self.world.engine
            return {
                "t_s": round(now, 3),
                "scenario": self.scenario.name,
                "time_scale": self.time_scale,
                "running": eng.num_running,
                "waiting": eng.num_waiting,
                "batch_streams": self.world.batch_streams,
                "batch_allowance": self.world.allowance,
                "batch_inflight": self.world.batch_inflight,
                "gpu": {
                    "temp_c": round(snap.temp_c, 2),
                    "ambient_c": snap.ambient_c,
                    "sm_clock_mhz": snap.sm_clock_mhz,
                    "sm_clock_active_mhz": snap.sm_clock_active_mhz,
                    "sm_clock_max_mhz": self.scenario.gpu.sm_clock_max_mhz,
                    "power_w": round(snap.power_w, 2),
                    "power_limit_w": snap.power_limit_w,
                    "fan_pct": round(snap.fan_pct, 1),
                    "util_gpu_pct": round(snap.util_gpu_pct, 1),
                    "pstate": snap.pstate,
                    "throttle_reasons": snap.reasons,
                    "thermal_violation_ns": snap.thermal_violation_ns,
                    "power_violation_ns": snap.power_violation_ns,
                },
            }

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass  # the loop closed in between: nothing to wake

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Serve in a background thread; returns once the socket accepts connections."""
        if self._thread is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise LabError(
                f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); "
                "pick another --port or stop what uses it"
            ) from exc
        self._sock = sock
        host, bound_port = sock.getsockname()[:2]
        self._url = f"http://{host}:{bound_port}"
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=5,
        )
        self._server = uvicorn.Server(config)
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="sim-lab", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if self._error is not None or not self._thread.is_alive():
                self.stop()
                raise LabError(f"the lab's server did not start ({self._error!r})")
            if time.monotonic() > deadline:
                self.stop()
                raise LabError("the lab's server did not start within 10 s")
            time.sleep(0.005)

    def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.should_exit = True
        self._poke()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> SimLab:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by start() or lost with the thread
            self._error = exc

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        engine_task = asyncio.create_task(self._engine_loop())
        try:
            assert self._server is not None and self._sock is not None
            await self._server.serve(sockets=[self._sock])
        finally:
            self._stopping = True
            for ev in self._streams.values():
                ev.set()
            engine_task.cancel()
            await asyncio.gather(engine_task, return_exceptions=True)

    # -- the engine on the real clock ----------------------------------------------------

    async def _engine_loop(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            with self._lock:
                now = self.now()
                plan = self.world.start_step(now)
                wake_at = self.world.next_wakeup()
            if plan is None:
                timeout = None if math.isinf(wake_at) else max(0.0, wake_at - now)
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
                continue
            delay = plan.end_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            with self._lock:
                self.world.finish_step()
            for ev in self._streams.values():
                ev.set()

    # -- HTTP ---------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models),
            Route("/health", self._health),
            Route("/metrics", self._metrics),
            Route("/sim/state", self._state),
            Route("/sim/gpu", self._gpu),
        ]
        if self.scenario.engine.engine == "llama.cpp":
            routes.append(Route("/props", self._props))
        else:
            routes.append(Route("/version", self._version))
        return Starlette(routes=routes)

    async def _health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    async def _version(self, request: HttpRequest) -> Response:
        return JSONResponse({"version": f"0.0.0+llm-watchdog-sim.{__version__}"})

    async def _props(self, request: HttpRequest) -> Response:
        e = self.scenario.engine
        return JSONResponse(
            {
                "total_slots": e.max_running_seqs,
                "model_alias": e.model,
                "build_info": f"llm-watchdog-sim-{__version__}",
                "default_generation_settings": {"n_ctx": 4096},
            }
        )

    async def _state(self, request: HttpRequest) -> Response:
        return JSONResponse(self.state())

    async def _gpu(self, request: HttpRequest) -> Response:
        """The card's fixed parameters and a fresh snapshot, for llm_watchdog.sim.remote."""
        snap = self.nvml_device.read(self.now())
        return JSONResponse(
            {
                "params": dataclasses.asdict(self.scenario.gpu),
                "snapshot": dataclasses.asdict(snap),
            }
        )

    async def _models(self, request: HttpRequest) -> Response:
        e = self.scenario.engine
        # owned_by as the posed engine writes it, so engine detection finds what it expects
        owner = "llamacpp" if e.engine == "llama.cpp" else "vllm"
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": e.model, "object": "model", "created": 0, "owned_by": owner}],
            }
        )

    async def _metrics(self, request: HttpRequest) -> Response:
        with self._lock:
            eng, w = self.world.engine, self.world
            running, waiting = eng.num_running, eng.num_waiting
            gen = sum(eng.tokens_out.values())
            prompt, done = eng.prompt_tokens_total, dict(eng.finished_total)
            streams, allowance, inflight = w.batch_streams, w.allowance, w.batch_inflight
        label = f'model_name="{self.scenario.engine.model}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} {waiting}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{label}}} {prompt}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {gen}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        for cls, n in sorted(done.items()):
            lines.append(f'vllm:request_success_total{{{label},traffic_class="{cls}"}} {n}')
        lines += [
            "# HELP llm_watchdog_sim_batch_streams Streams the lab's batch job wants in flight.",
            "# TYPE llm_watchdog_sim_batch_streams gauge",
            f"llm_watchdog_sim_batch_streams {streams}",
            "# HELP llm_watchdog_sim_batch_inflight The lab's own batch requests in flight.",
            "# TYPE llm_watchdog_sim_batch_inflight gauge",
            f"llm_watchdog_sim_batch_inflight {inflight}",
            "# HELP llm_watchdog_sim_batch_allowance Cap on them (-1: none).",
            "# TYPE llm_watchdog_sim_batch_allowance gauge",
            f"llm_watchdog_sim_batch_allowance {-1 if allowance is None else allowance}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    def _fail(self, status: int, message: str, kind: str = "invalid_request_error") -> Response:
        body = {"error": {"message": message, "type": kind, "code": status}}
        return JSONResponse(body, status_code=status)

    async def _chat(self, request: HttpRequest) -> Response:
        arrival = self.now()
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._fail(400, "the body is not valid JSON")
        if not isinstance(body, dict):
            return self._fail(400, "the body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._fail(400, "Expected 'messages' to be a non-empty array")
        model = self.scenario.engine.model
        if body.get("model") not in (None, "", model):
            return self._fail(
                404, f"The model `{body.get('model')}` does not exist.", "NotFoundError"
            )
        cls = request.headers.get("x-traffic-class", "chat").strip().lower()
        cls = cls if cls in ("chat", "batch") else "chat"
        traffic = self.scenario.chat if cls == "chat" else self.scenario.batch
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) else None
        toks, cut = self.answers.tokens(
            messages, traffic.output_tokens_min, traffic.output_tokens_max, max_tokens
        )
        e = self.scenario.engine
        chars = sum(len(json.dumps(m.get("content", ""))) for m in messages if isinstance(m, dict))
        prompt_tokens = max(1, round(chars / e.chars_per_token) + 4 * len(messages) + 3)
        with self._lock:
            req = self.world.new_request(cls, arrival, prompt_tokens, max(1, len(toks)))
        if isinstance(body.get("priority"), int):
            req.priority = body["priority"]
        if e.prefix_cache and body.get("cache_prompt", True) is not False:
            key = json.dumps(messages, sort_keys=True)
            if key in self._cache:
                req.cached_tokens = prompt_tokens - 1
                self._cache.move_to_end(key)
            self._cache[key] = None
            while len(self._cache) > PREFIX_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        await asyncio.sleep(e.request_overhead_ms / 1000.0)
        progress = asyncio.Event()
        with self._lock:
            self.world.submit(req, self.now())
            self._streams[req.id] = progress
        if self._wake is not None:
            self._wake.set()
        meta = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": model,
        }
        finish = "length" if cut else "stop"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(toks),
            "total_tokens": prompt_tokens + len(toks),
        }
        if not body.get("stream"):
            try:
                while not self._stopping:
                    await progress.wait()
                    progress.clear()
                    if req.state in (DONE, CANCELLED):
                        break
            finally:
                self._release(req)
            return JSONResponse(
                {
                    **meta,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": finish,
                            "logprobs": None,
                            "message": {"role": "assistant", "content": "".join(toks)},
                        }
                    ],
                    "usage": usage,
                }
            )
        opts = body.get("stream_options")
        include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
        return StreamingResponse(
            self._sse(req, progress, toks, meta, finish, usage if include_usage else None),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    async def _sse(
        self,
        req: Request,
        progress: asyncio.Event,
        toks: list[str],
        meta: dict[str, Any],
        finish: str,
        usage: dict[str, int] | None,
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
            payload = {
                **meta,
                "object": "chat.completion.chunk",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
                ],
            }
            return f"data: {json.dumps(payload)}\n\n".encode()

        sent = 0
        try:
            while not self._stopping:
                await progress.wait()
                progress.clear()
                with self._lock:
                    have = self.world.engine.generated(req)
                    state = req.state
                if have > sent and sent == 0:
                    yield chunk({"role": "assistant", "content": ""})
                for i in range(sent, min(have, len(toks))):
                    yield chunk({"content": toks[i]})
                sent = max(sent, have)
                if state in (DONE, CANCELLED):
                    break
            if req.state == DONE:
                yield chunk({}, finish)
                if usage is not None:
                    payload = {
                        **meta,
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": usage,
                    }
                    yield f"data: {json.dumps(payload)}\n\n".encode()
                yield b"data: [DONE]\n\n"
        finally:
            self._release(req)

    def _release(self, req: Request) -> None:
        with self._lock:
            self._streams.pop(req.id, None)
            if req.state not in (DONE, CANCELLED):
                self.world.cancel(req)
