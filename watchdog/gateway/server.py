"""Running the gateway: in the foreground (`serve`) or in a background thread (`GatewayServer`).

The listening socket is bound here, before uvicorn starts, so that port 0 works (the
kernel's choice is read back for `.url`) and a port already taken is one clear error
instead of uvicorn's exit. uvicorn owns the event loop, graceful shutdown (open streams
get `shutdown_timeout_s` to finish) and, in the foreground, SIGTERM and SIGINT.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import uvicorn

from llm_watchdog.daemon.notify import Heartbeat, Notifier
from llm_watchdog.gateway.app import Gateway, create_app
from llm_watchdog.gateway.config import GatewayConfig
from llm_watchdog.gateway.protocol import protocol_for

# The event loop ticks every 0.1 s (uvicorn's main loop); this long without a tick means it
# is stuck, and systemd's watchdog stops hearing from the gateway.
LOOP_STALE_S = 5.0


class ListenError(OSError):
    """The gateway cannot listen where it was told to. str() is one line saying what to do."""


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is
    # IPPROTO_TCP, and accepted sockets inherit it. With proto 0, Nagle holds every body
    # chunk written after the headers until the client's delayed ACK (~40 ms on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        hint = (
            "is another gateway running? pick another port with --listen"
            if exc.errno == errno.EADDRINUSE
            else "check the --listen address"
        )
        raise ListenError(f"cannot listen on {host}:{port} ({exc.strerror}): {hint}") from exc
    return sock


def _loop() -> str:
    # uvloop (libuv) where it installs; asyncio's own loop elsewhere (Windows).
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def _uvicorn_config(app: Any, config: GatewayConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop=_loop(),
        # httptools on the client side, with the gateway's header, body and connection
        # limits, and proxied requests answered without ASGI (protocol.py, direct.py).
        http=protocol_for(config, app.state.gateway),
        log_config=None,  # the caller's logging set-up stays as it is
        access_log=False,  # a line per request costs more than relaying it
        lifespan="on",
        server_header=False,  # the engine's Server header is relayed instead
        proxy_headers=False,
        timeout_graceful_shutdown=int(config.shutdown_timeout_s) or 1,
    )


def url_for(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server, telling the caller once it accepts connections.

    With a notifier (the foreground service): READY=1 once listening, WATCHDOG=1 while the
    event loop ticks, STOPPING=1 on shutdown; SIGHUP calls `on_reload` from the loop.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_started: Callable[[], None] | None,
        *,
        notifier: Notifier | None = None,
        on_reload: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._notifier = notifier
        self._on_reload = on_reload
        self._heartbeat = (
            Heartbeat(notifier, stale_s=LOOP_STALE_S) if notifier is not None else None
        )
        self.reload_requested = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_started is not None:
            self._on_started()
        if self.started and self._notifier is not None and self._heartbeat is not None:
            self._heartbeat.beat()
            self._heartbeat.start()
            self._notifier.ready(self._status())

    def _status(self) -> str:
        sock = self.servers[0].sockets[0] if self.servers and self.servers[0].sockets else None
        where = f" on port {sock.getsockname()[1]}" if sock is not None else ""
        return f"listening{where}"

    async def on_tick(self, counter: int) -> bool:
        if self._heartbeat is not None:
            self._heartbeat.beat()
        if self.reload_requested:
            self.reload_requested = False
            if self._on_reload is not None:
                if self._notifier is not None:
                    self._notifier.reloading()
                self._on_reload()
                if self._notifier is not None:
                    self._notifier.ready(self._status())
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._notifier is not None:
            self._notifier.stopping()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        await super().shutdown(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn raises the signal again after its graceful shutdown, so the process dies
        # "killed by SIGTERM"; a clean stop on request should exit 0 (gateway/cli.py's codes).
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        wanted = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in wanted}
        # SIGHUP's default kills the process (exit 129, which systemd counts as clean):
        # here it asks the loop to re-read what can change without a restart.
        original[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._handle_hup)
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def _handle_hup(self, signum: int, frame: object) -> None:
        self.reload_requested = True


def serve(
    config: GatewayConfig,
    on_listening: Callable[[str, GatewayConfig], None] | None = None,
    *,
    notifier: Notifier | None = None,
    reload: Callable[[GatewayConfig], GatewayConfig | None] | None = None,
    engine_unit: str = "",
) -> None:
    """Run in the foreground until SIGTERM or SIGINT; raises ListenError if it cannot bind.

    `on_listening(url, config)` is called once connections are accepted (port 0 resolved).
    On SIGHUP, `reload(current)` returns the config to serve from now on, or None to keep
    the current one (it logs why). `engine_unit` (e.g. "vllm.service") is where
    /control/identity reads the engine's command line when its process cannot be read.
    """
    sock = bind_socket(config.listen_host, config.listen_port)
    url = url_for(config.listen_host, sock.getsockname()[1])
    app = create_app(config)
    gateway: Gateway = app.state.gateway
    gateway.engine_unit = engine_unit

    def started() -> None:
        if on_listening is not None:
            on_listening(url, config)

    def reloaded() -> str | None:
        if reload is None:
            return None
        new = reload(gateway.config)
        if new is not None:
            gateway.config = new
        return None

    server = _Server(_uvicorn_config(app, config), started, notifier=notifier, on_reload=reloaded)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


class GatewayServer:
    """The gateway on a background thread, for tests, the demo and the daemon.

    with GatewayServer(GatewayConfig(upstream_url=..., listen_port=0)) as gw:
        httpx.get(gw.url + "/control")
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.app = create_app(config)
        self.gateway: Gateway = self.app.state.gateway
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the gateway is not started: call start() first")
        return url_for(self.config.listen_host, self.port)

    def start(self, timeout_s: float = 10.0) -> GatewayServer:
        if self._thread is not None:
            raise RuntimeError("the gateway is already started")
        self._sock = bind_socket(self.config.listen_host, self.config.listen_port)
        self.port = self._sock.getsockname()[1]
        self._server = _Server(_uvicorn_config(self.app, self.config), None)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            name=f"llm-watchdog-gateway:{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the gateway on port {self.port} did not start within {timeout_s:g} s: "
                    "see the log above"
                )
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop accepting, let open requests finish (up to shutdown_timeout_s), then return."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            wait = self.config.shutdown_timeout_s + 5 if timeout_s is None else timeout_s
            self._thread.join(wait)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._server = None

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
