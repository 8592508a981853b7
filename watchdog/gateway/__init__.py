"""The gateway: a class-aware OpenAI-compatible reverse proxy in front of the engine.

Chat passes without waiting; batch is admitted up to an allowance that the daemon sets,
with a lease, through the control API (`GET /control`, `PUT /control/classes/batch`).
"""

from __future__ import annotations

from llm_watchdog.gateway.app import Gateway, create_app
from llm_watchdog.gateway.config import BATCH, CHAT, CLASSES, TOKEN_ENV, GatewayConfig, read_token
from llm_watchdog.gateway.server import GatewayServer, ListenError, serve

__all__ = [
    "BATCH",
    "CHAT",
    "CLASSES",
    "TOKEN_ENV",
    "Gateway",
    "GatewayConfig",
    "GatewayServer",
    "ListenError",
    "create_app",
    "read_token",
    "serve",
]
