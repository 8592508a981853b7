"""URLs a user gives: checked where they are read, so a bad one is one line, not a traceback.

Pure; shared by the daemon's config, the CLI's URL options and the gateway's --upstream.
"""

from __future__ import annotations

import ipaddress
import re

import httpx

SERVER_URL_EXAMPLE = "http://HOST:PORT or http://HOST:PORT/v1"


def check_http_url(url: str, example: str = SERVER_URL_EXAMPLE) -> str:
    """`url` if an HTTP client can send to it: http:// or https://, a host, a port in range.

    A ValueError otherwise, saying what a good one looks like: the daemon reads server.url
    only once it starts, so a URL it would refuse is refused here, where the config loads
    (exit 78) and where a command line option is parsed (a usage error).
    """
    text = url.strip()
    reason = ""
    if any(ch.isspace() for ch in text):
        reason = "it holds a space"
    elif not re.match(r"^https?://[^/\s]+", text):
        reason = "it must start with http:// or https:// and a host"
    else:
        try:
            parsed = httpx.URL(text)
            port = parsed.port
        except (httpx.InvalidURL, ValueError) as exc:
            reason = str(exc)
        else:
            if not parsed.host:
                reason = "it names no host"
            elif port is not None and not 0 < port <= 65535:
                reason = f"port {port} is not between 1 and 65535"
    if reason:
        raise ValueError(f"expected a URL like {example}, got {url!r} ({reason})")
    return url


def is_loopback_host(host: str | None) -> bool:
    """Whether `host`, as a URL or a listen option holds it (a name, an IPv4 address, an IPv6
    one with or without brackets), is the loopback: localhost, 127.0.0.0/8 or ::1. Pure: a
    name other than localhost is not looked up, so it is not loopback here."""
    if not host:
        return False
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback
