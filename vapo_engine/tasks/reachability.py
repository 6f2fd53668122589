"""Is a Hub endpoint reachable at all? One TCP connection, at most `REACH_TIMEOUT_S` seconds, before a download.

    unreachable("https://huggingface.co")  # None, or why not: "connection refused", "no answer within 3 s", ...

With no network, huggingface_hub retries each file for ~20 s before it gives up; this check fails in
milliseconds (refused, no route, a name that does not resolve) or `REACH_TIMEOUT_S` (packets dropped). When the
environment routes the endpoint through a proxy (HTTPS_PROXY / HTTP_PROXY / ALL_PROXY, NO_PROXY honoured, as
the Hub client reads them) the proxy is what must answer. Nothing is sent over the connection. A failure is
remembered for `FAILURE_TTL_S`, so fetching several benchmarks without a network waits once, not per file.
"""
from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

REACH_TIMEOUT_S = 3.0
FAILURE_TTL_S = 15.0
_DEFAULT_PORTS = {"http": 80, "https": 443, "socks5": 1080, "socks5h": 1080, "socks4": 1080}
_failures: dict[str, tuple[float, str]] = {}


def unreachable(endpoint: str, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """None when a TCP connection to `endpoint`'s host (or its proxy) opens within `timeout_s`; else a short
    reason for the error message."""
    target = _target(endpoint)
    if isinstance(target, str):
        return target
    key = f"{target[0]}:{target[1]}"  # the proxy's address when one is used, so a change of proxy counts
    seen = _failures.get(key)
    if seen and time.monotonic() - seen[0] < FAILURE_TTL_S:
        return seen[1]
    why = _connect(*target, timeout_s)
    if why:
        _failures[key] = (time.monotonic(), why)
    else:
        _failures.pop(key, None)
    return why


def _address(url: str) -> tuple[str, int] | str:
    """(host, port) of an http(s) or proxy URL, or why it is not one."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host, port = parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError as e:
        return f"{url} is not a valid URL: {e}"
    if not host or port is None:
        return f"{url} is not an http(s) URL"
    return host, port


def _target(endpoint: str) -> tuple[str, int, str] | str:
    """(host, port, " through the proxy ...") to connect to for `endpoint`, or why there is none."""
    import urllib.request  # the environment's proxies, read as the Hub client reads them

    target = _address(endpoint)
    if isinstance(target, str):
        return target
    scheme = urlsplit(endpoint).scheme.lower() or "https"
    proxies = urllib.request.getproxies()
    proxy = None if urllib.request.proxy_bypass(target[0]) else proxies.get(scheme) or proxies.get("all")
    if not proxy:
        return (*target, "")
    address = _address(proxy)
    if isinstance(address, str):  # the proxy URL itself is not repeated: it may hold a password
        return f"the proxy set for {scheme} URLs ({scheme.upper()}_PROXY or ALL_PROXY) is not a valid URL"
    return (*address, f" through the proxy {address[0]}:{address[1]}")


def _connect(host: str, port: int, via: str, timeout_s: float) -> str | None:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.gaierror:
        return f"the name {host} does not resolve{via}"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout_s:g} s{via}"
    except ConnectionRefusedError:
        return f"connection refused by {host}:{port}{via}"
    except OSError as e:
        return f"{e.strerror or type(e).__name__} connecting to {host}:{port}{via}"
    return None
