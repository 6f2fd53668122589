"""Preflight reachability: the API channel when provider samples are on, the rollout server when
`[rollout] backend` is not the in-process "hf". Every probe ends within `TIMEOUT` seconds.

A rollout backend that talks to a server may expose a health check: a `health_check(options)` attribute on
its registered factory (vapo_engine/rollout/backends/registry.py), returning None when the server answers and
a sentence saying what failed otherwise; `tcp_problem` is the probe such a check can use. A backend without
one is skipped (info).
"""
from __future__ import annotations

import concurrent.futures
import socket
from urllib.parse import urlsplit

from .findings import Finding, error, info, warning

TIMEOUT = 3.0


def tcp_problem(host: str, port: int, timeout: float = TIMEOUT) -> str | None:
    """None when a TCP connection to host:port opens within `timeout` s, else why not (in words)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"{host}:{port} did not answer within {timeout:g} s"
    except OSError as e:
        return f"{host}:{port} refused or unreachable ({e.strerror or type(e).__name__})"


def url_endpoint(url: str) -> tuple[str, int]:
    """host and port of an http(s) URL (default ports 80/443); ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {parts.scheme or '?'}://…")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def channel_findings(cfg, base_url: str | None) -> list[Finding]:
    """With provider samples on: can the channel's host be reached? A failure is a warning: the run goes on
    with its own samples (provider samples stop, run_status says why)."""
    if not cfg.provider_rollouts.enabled:
        return []
    if not base_url:
        return [warning("network", "provider samples are on but no API channel is configured",
                        "set api.base_url in settings.json (check_channel tests it), or provider_rollouts.enabled = "
                        "false")]
    try:
        host, port = url_endpoint(base_url)
    except ValueError as e:
        return [warning("network", f"the API channel's base URL is unusable ({e})", "set api.base_url in "
                        "settings.json to an http(s) URL")]
    problem = tcp_problem(host, port)
    ev = {"host": host, "port": port, "timeout_s": TIMEOUT}
    if problem:
        return [warning("network", f"API channel for provider samples unreachable: {problem}; the run would go on "
                        "without provider samples", "check the network and api.base_url (check_channel shows "
                        "the details), or set provider_rollouts.enabled = false", **ev)]
    return [info("network", f"API channel reachable ({host}:{port})", **ev)]


def rollout_findings(cfg) -> list[Finding]:
    """A non-"hf" rollout backend: registered? its server healthy (when the backend can tell)?"""
    name = cfg.rollout.backend
    if name == "hf":
        return []
    from vapo_engine.rollout.backends import UnknownBackendError, get_backend
    try:
        factory = get_backend(name)
    except UnknownBackendError as e:
        return [error("network", str(e), "set rollout.backend = \"hf\" or to a registered backend", backend=name)]
    check = getattr(factory, "health_check", None)
    if not callable(check):
        return [info("network", f"rollout backend {name!r} has no health check; not probed", backend=name)]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        problem = pool.submit(check, cfg.rollout).result(timeout=TIMEOUT + 0.5)
    except concurrent.futures.TimeoutError:
        problem = f"no answer within {TIMEOUT:g} s"
    except Exception as e:  # noqa: BLE001 - a backend's own check failing is a finding, not a crash
        problem = f"its health check failed ({type(e).__name__}: {str(e)[:200]})"
    finally:
        pool.shutdown(wait=False)
    if problem:
        return [error("network", f"rollout server of backend {name!r} unreachable: {problem}", "start the rollout "
                      "server (or fix its address), or set rollout.backend = \"hf\" to sample in the trainer",
                      backend=name, timeout_s=TIMEOUT)]
    return [info("network", f"rollout server of backend {name!r} answers", backend=name)]
