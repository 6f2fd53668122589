"""A pool of inference-server replicas for the remote rollout backends (`server`, and the vLLM / SGLang adapters).

Routing: each request goes to the usable replica with the fewest outstanding requests (ties: list order); a
caller sends the n samples of one prompt as one request, so they land on one replica (prefix sharing).
Faults: a connection error, a timeout, 408 / 429 or a 5xx marks that replica down for a backoff (0.5 s doubling
to 10 s, with jitter), counts a failover and sends the request to another one. When every replica is down the
pool waits (backing off) and says so through `on_status({"waiting": ...})`; after `unavailable_timeout_s` without
any replica it reports `{"down": ...}` and raises `ReplicasUnavailable`, naming each URL, its last error and the
fix. 401 / 403 and other 4xx answers are mistakes retrying cannot fix: they raise at once with the server's
message.
Identity: on first contact (and after being down) a replica's info is read and `check(url, info)` may refuse it
(`ReplicaRefused`: wrong model or architecture). Weights: `push(version, send)` records the current version and
sends it to every replica; a replica that missed a push (down at the time, or restarted) is sent the current
weights before it gets another request (`sync`), and an answer from any other weight version refuses that replica
until it is synced again. The bearer token comes from the environment variable the config names and is never
logged, shown or put into an error. Torch-free (httpx).
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from vapo_engine.errors import UserError

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
BACKOFF_S, BACKOFF_CAP_S = 0.5, 10.0


class ReplicaFailed(Exception):
    """One replica failed in a way another replica may not (connection, timeout, 408/429/5xx, wrong version)."""


class ReplicaRefused(UserError):
    """A replica that must not be used (wrong model or architecture), or a request no replica will take."""


class ReplicasUnavailable(UserError):
    """No replica answered for `rollout.unavailable_timeout_s`; the message names each URL and the fix."""


@dataclass
class Replica:
    url: str
    outstanding: int = 0
    failures: int = 0
    """Consecutive failures (0 = healthy)."""
    down_until: float = 0.0
    last_error: str = ""
    info: dict | None = None
    """Its /info answer, read on first contact and again after it was down."""
    version: int | None = None
    """The weight version it holds as far as the pool knows (None: unknown, sync before use)."""
    setup: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while its identity is checked and its weights are synced (once, not by every waiting thread)."""


def _error_text(e: Exception) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        return f"HTTP {e.response.status_code}: {_server_message(e.response)}"
    return f"{type(e).__name__}: {str(e)[:200]}"


def _server_message(r: httpx.Response) -> str:
    try:
        err = r.json().get("error") or {}
        return str(err.get("message") or err)[:300]
    except (ValueError, AttributeError):
        return r.text[:300]


class ReplicaPool:
    """Replicas at `urls`, used by many threads at once (see the module docstring)."""

    def __init__(self, urls: list[str], *, token_env: str | None = None, timeout_s: float = 600.0,
                 unavailable_timeout_s: float = 600.0, info_path: str = "/rollout/info",
                 check: Callable[[str, dict], str | None] = lambda url, info: None,
                 on_status: Callable[[dict | None], None] = lambda status: None, log: Callable[[str], None] = print):
        if not urls:
            raise ReplicaRefused("rollout.urls is empty; list the replicas' base URLs, e.g. "
                                 "urls = [\"http://127.0.0.1:8001\"]")
        self.replicas = [Replica(u.rstrip("/")) for u in urls]
        self.token_env, self.unavailable_timeout_s = token_env, float(unavailable_timeout_s)
        self.info_path, self.check, self.on_status, self.log = info_path, check, on_status, log
        token = os.environ.get(token_env) if token_env else None
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
                                    headers={"Authorization": f"Bearer {token}"} if token else {})
        self._lock = threading.Condition()
        self._waiting_since: float | None = None
        self.failovers = 0
        self.weights: tuple[int, Callable[[ReplicaPool, Replica], None]] | None = None

    # --- plain HTTP -------------------------------------------------------------------------------------------
    def http(self, replica: Replica, method: str, path: str, body: dict | None = None, *,
             json_answer: bool = True) -> dict:
        """One call; `ReplicaFailed` for what another replica may not suffer, `ReplicaRefused` otherwise.
        `json_answer=False`: any 2xx body will do (routes that answer an empty or plain-text body); gives {}."""
        try:
            r = self._client.request(method, replica.url + path, json=body)
        except httpx.HTTPError as e:  # connection refused / reset, timeouts, protocol errors
            raise ReplicaFailed(_error_text(e)) from None
        if r.status_code in TRANSIENT_STATUS:
            raise ReplicaFailed(f"HTTP {r.status_code}: {_server_message(r)}")
        if r.status_code in (401, 403):
            who = f"${self.token_env}" if self.token_env else "the token"
            raise ReplicaRefused(f"rollout replica {replica.url} refused {path} (HTTP {r.status_code}: "
                                 f"{_server_message(r)}); check {who} (the replica's VAPO_MCP_TOKEN) and, for "
                                 "load_weights, the replica's --weight-root")
        if r.status_code >= 400:
            raise ReplicaRefused(f"rollout replica {replica.url} answered {path} with HTTP {r.status_code}: "
                                 f"{_server_message(r)}")
        if not json_answer:
            return {}
        try:
            return r.json()
        except ValueError:
            raise ReplicaFailed(f"answered {path} with something that is not JSON") from None

    # --- routing ----------------------------------------------------------------------------------------------
    def call(self, fn: Callable[[Replica], dict]) -> dict:
        """`fn(replica)` on the least busy usable replica (synced first), failing over as the docstring says."""
        while True:
            replica = self._acquire()
            try:
                self._prepare(replica)
                out = fn(replica)
            except ReplicaFailed as e:
                self._failed(replica, str(e))
                continue
            finally:
                with self._lock:
                    replica.outstanding -= 1
                    self._lock.notify_all()
            self._ok(replica)
            return out

    def _acquire(self) -> Replica:
        with self._lock:
            while True:
                now = time.monotonic()
                usable = [r for r in self.replicas if r.down_until <= now]
                if usable:
                    best = min(usable, key=lambda r: r.outstanding)
                    best.outstanding += 1
                    return best
                self._wait(now)

    def _wait(self, now: float) -> None:
        """Every replica is down (lock held): report, give up after the timeout, else sleep until one may be up."""
        if self._waiting_since is None:
            self._waiting_since = now
            self.log(f"no rollout replica answers; waiting up to {self.unavailable_timeout_s:g}s: {self._why()}")
        waited = now - self._waiting_since
        status = {"since_s": round(waited, 1), "timeout_s": self.unavailable_timeout_s,
                  "replicas": [{"url": r.url, "error": r.last_error} for r in self.replicas]}
        if waited >= self.unavailable_timeout_s:
            fix = ("start the inference server(s) at these URLs (vapo-mcp serve-model MODEL --port PORT "
                   "--weight-root DIR, or the vLLM / SGLang server), or correct rollout.urls; then resume_run")
            self.on_status({"down": {**status, "reason": f"no replica answered for {waited:.0f}s: {self._why()}",
                                     "fix": fix}})
            raise ReplicasUnavailable(f"no rollout replica answered for {waited:.0f}s "
                                      f"(rollout.unavailable_timeout_s = {self.unavailable_timeout_s:g}): "
                                      f"{self._why()}; fix: {fix}")
        self.on_status({"waiting": status})
        wake = min(r.down_until for r in self.replicas)
        self._lock.wait(timeout=max(0.05, min(wake - now, self._waiting_since + self.unavailable_timeout_s - now)))

    def _why(self) -> str:
        return "; ".join(f"{r.url} ({r.last_error or 'not tried'})" for r in self.replicas)

    def _failed(self, replica: Replica, error: str) -> None:
        with self._lock:
            replica.failures += 1
            replica.last_error = error[:300]
            replica.info, replica.version = None, None  # re-check identity and weights when it is back
            delay = min(BACKOFF_CAP_S, BACKOFF_S * 2 ** (replica.failures - 1)) * (0.75 + 0.5 * random.random())
            replica.down_until = time.monotonic() + delay
            self.failovers += 1
            self._lock.notify_all()
        self.log(f"rollout replica {replica.url} failed ({error[:200]}); its requests go to the others, "
                 f"retrying it in {delay:.1f}s")

    def _ok(self, replica: Replica) -> None:
        with self._lock:
            replica.failures, replica.down_until = 0, 0.0
            if self._waiting_since is not None:
                self._waiting_since = None
                self.on_status(None)
                self.log(f"rollout replica {replica.url} answers again; sampling goes on")

    def _prepare(self, replica: Replica) -> None:
        """Identity check on first contact, then the current weights if it may not hold them."""
        with replica.setup:
            self._setup(replica)

    def _setup(self, replica: Replica) -> None:
        if replica.info is None:
            info = self.http(replica, "GET", self.info_path)
            problem = self.check(replica.url, info)
            if problem:
                raise ReplicaRefused(problem)
            replica.info = info
        if self.weights is not None and replica.version != self.weights[0]:
            self.weights[1](self, replica)
            replica.version = self.weights[0]

    # --- weights ----------------------------------------------------------------------------------------------
    def push(self, version: int, send: Callable[[ReplicaPool, Replica], None]) -> None:
        """Make `version` current (`send(pool, replica)` loads it on one replica) and send it to every replica
        now; one that fails now gets it before its next request."""
        self.weights = (version, send)
        for replica in self.replicas:
            with self._lock:
                if replica.down_until > time.monotonic():
                    continue
            try:
                self._prepare(replica)
            except ReplicaFailed as e:
                self._failed(replica, str(e))
        if not any(r.version == version for r in self.replicas):
            self.call(lambda r: {})  # none took it: wait (and fail after the timeout) like a request would

    def served_version(self, replica: Replica, answered: int | None) -> None:
        """Refuse an answer made with other weights than the current ones (`ReplicaFailed`: synced again)."""
        if self.weights is not None and answered != self.weights[0]:
            replica.version = None
            raise ReplicaFailed(f"answered with weight version {answered}, not the current {self.weights[0]}")

    def up(self) -> int:
        """Replicas whose last request succeeded (or that were not tried yet)."""
        return sum(r.failures == 0 for r in self.replicas)

    def close(self) -> None:
        self._client.close()


def wait_until_healthy(proc, url: str, timeout_s: float, poll_s: float = 0.5) -> str | None:
    """Wait for a just-started server process `proc` (a subprocess.Popen) to answer `GET url/health` with 200:
    None once it does, else why not ("exited with N", or no answer within `timeout_s`); the process is left as
    it is (the caller stops it)."""
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        try:
            if httpx.get(url.rstrip("/") + "/health", timeout=5).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            return f"no /health answer within {timeout_s:g} s"
        time.sleep(poll_s)


def health_problem(urls: list[str], timeout_s: float = 2.5) -> str | None:
    """None when at least one of `urls` answers `GET /health` with 200 within `timeout_s` (all probed at once),
    else which failed and why: the preflight check of the remote backends (vapo_engine/doctor/network.py)."""
    from concurrent.futures import ThreadPoolExecutor

    def probe(url: str) -> str | None:
        try:
            r = httpx.get(url.rstrip("/") + "/health", timeout=timeout_s)
        except httpx.HTTPError as e:
            return f"{url} ({_error_text(e)})"
        return None if r.status_code == 200 else f"{url} (GET /health: HTTP {r.status_code})"
    if not urls:
        return "rollout.urls is empty"
    with ThreadPoolExecutor(max_workers=min(len(urls), 32)) as ex:
        problems = list(ex.map(probe, urls))
    if any(p is None for p in problems):
        return None
    return f"none of the {len(urls)} replica(s) answers: " + "; ".join(problems)[:600]
