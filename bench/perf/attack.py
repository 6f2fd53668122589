"""The attack shapes of docs/security.md "Bounds", against real servers on loopback, with the server's memory and
`/health` latency recorded throughout (nothing here asserts; the tests check each bound in seconds):

1. evaluate floods: 30 task-augmented `evaluate` calls to a `vapo-mcp serve --http` process whose channel is a
   stub provider on loopback (answers after 50 ms) — at the tool's caps (1000 problems × 16 samples: the request
   budget refuses all but one), then small ones (40 × 5: the bound on evaluations at once refuses 20); how fast
   they are answered, how they end, the requests the provider sees and how many at once, then all cancelled.
2. subscription flood: 300 `resources/subscribe` of 3.5 MB URIs, then 300 of a real run's URIs beyond the
   per-connection bound, then the session deleted.
3. half-open connections: 256 connections that never send a byte; /health and a client with the token meanwhile.
4. a FIFO named `model.safetensors` under serve-model's --weight-root (the built-in model), loaded via
   `/rollout/load_weights`, with /health probed meanwhile.

Memory is the server process's resident set (VmRSS, sampled every 0.2 s; VmHWM is its peak since start).
/health is probed every 0.25 s from another thread in every phase. Run inside `cpu-slot`:

    .venv/bin/python -m bench.perf.attack [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from bench.lib.records import REPO, load_avg, write_record

TOKEN = "attack-bench-token-" + "z" * 24
EVAL = {"benchmark": "builtin:addition", "num_problems": 1000, "samples_per_problem": 16, "timeout_seconds": 3600}
SMALL_EVAL = {**EVAL, "num_problems": 40, "samples_per_problem": 4}
"""200 requests each: 30 of them fit the request budget, so the bound on evaluations at once is what refuses."""


# --- a stub provider: an OpenAI-style chat endpoint that answers after a delay -------------------------------------
SEEN = [0, 0, 0]
"""Requests the stub provider got, in flight now, most in flight at once."""
LOCK = threading.Lock()


class _Provider(BaseHTTPRequestHandler):

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        with LOCK:
            SEEN[0] += 1
            SEEN[1] += 1
            SEEN[2] = max(SEEN[2], SEEN[1])
        self.rfile.read(int(self.headers.get("content-length") or 0))
        time.sleep(0.05)
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "qwen-32b", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "The answer is 42."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}).encode()
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the evaluation was cancelled: its client hung up
            pass
        finally:
            with LOCK:
                SEEN[1] -= 1


# --- probes ----------------------------------------------------------------------------------------------------
def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


@contextmanager
def watched(pid: int, health_url: str):
    """Sample the server's RSS every 0.2 s and /health every 0.25 s while the block runs; yields the dict that
    gets the phase's numbers when it ends."""
    out: dict = {"rss_before_mb": rss_mb(pid)}
    rss, lat, bad, stop = [], [], [0], threading.Event()

    def sample_rss():
        while not stop.wait(0.2):
            rss.append(rss_mb(pid))

    def probe():
        while not stop.wait(0.25):
            t0 = time.monotonic()
            try:
                ok = httpx.get(health_url, timeout=30).status_code == 200
            except httpx.HTTPError:
                ok = False
            lat.append(time.monotonic() - t0)
            bad[0] += not ok
    threads = [threading.Thread(target=sample_rss, daemon=True), threading.Thread(target=probe, daemon=True)]
    for t in threads:
        t.start()
    try:
        yield out
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        out.update(rss_max_mb=max(rss, default=out["rss_before_mb"]), rss_after_mb=rss_mb(pid),
                   health_probes=len(lat), health_failed=bad[0],
                   health_p50_ms=round(statistics.median(lat) * 1000, 1) if lat else None,
                   health_max_ms=round(max(lat) * 1000, 1) if lat else None)


# --- the MCP server ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workspace(root: Path) -> Path:
    settings = json.loads((REPO / "settings.json").read_text())
    settings["runtime"]["log_dir"] = str(root / "logs")
    (root / "settings.json").write_text(json.dumps(settings))
    shutil.copy(REPO / "config.toml", root / "config.toml")
    return root


def start_mcp(ws: Path, provider_url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "VAPO_MCP_TOKEN": TOKEN, "TAOTOKEN_API_KEY": "attack-bench-key-0000",
           "TAOTOKEN_BASE_URL": provider_url, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--http", "--port", str(port), "--config",
                             str(ws / "config.toml"), "--settings", str(ws / "settings.json"), "--log-level",
                             "warning"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the MCP server did not answer /health within a minute")


class Session:
    """A 2025-11-25 MCP session over streamable HTTP, by hand (what a client sends, nothing more)."""

    def __init__(self, url: str):
        self.url, self.http, self.n = url + "/mcp", httpx.Client(timeout=120), 0
        self.head = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"}
        init = self.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                        "clientInfo": {"name": "attack-bench", "version": "1"}}, raw=True)
        self.head.update({"Mcp-Session-Id": init.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"})
        self.http.post(self.url, headers=self.head, json={"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, method: str, params: dict, raw: bool = False):
        self.n += 1
        r = self.http.post(self.url, headers=self.head, json={"jsonrpc": "2.0", "id": self.n, "method": method,
                                                              "params": params})
        if raw:
            return r
        data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        return json.loads(data[-1]) if data else {"http": r.status_code}

    def close(self) -> None:
        self.http.delete(self.url, headers=self.head)
        self.http.close()


# --- the phases ------------------------------------------------------------------------------------------------
def evaluate_flood(url: str, pid: int, arguments: dict) -> dict:
    """30 task-augmented evaluate calls with `arguments`; 10 s later every accepted one is cancelled."""
    s = Session(url)
    SEEN[:] = [0, 0, 0]
    with watched(pid, url + "/health") as out:
        t0 = time.monotonic()
        answers = [s.call("tools/call", {"name": "evaluate", "arguments": arguments, "task": {"ttl": 600000}})
                   for _ in range(30)]
        out["accept_s"] = round(time.monotonic() - t0, 2)
        tasks = [a["result"]["task"]["taskId"] for a in answers if "task" in a.get("result", {})]
        out.update(arguments=arguments, calls=30, tasks_created=len(tasks), refused_at_call=30 - len(tasks))
        time.sleep(10)
        out.update(provider_requests_10s=SEEN[0], provider_max_in_flight=SEEN[2])
        ended = [s.call("tasks/get", {"taskId": t}).get("result", {}) for t in tasks]
        out["refused_by_budget"] = sum(e.get("status") == "completed" and "budget" in json.dumps(
            s.call("tasks/result", {"taskId": t})) for e, t in zip(ended, tasks))
        for t, e in zip(tasks, ended):
            if e.get("status") == "working":
                s.call("tasks/cancel", {"taskId": t})
        time.sleep(1)
        sent = SEEN[0]
        time.sleep(3)
        out["provider_requests_after_cancel"] = SEEN[0] - sent
        states = [s.call("tasks/get", {"taskId": t}).get("result", {}).get("status") for t in tasks]
        out["final_states"] = {st: states.count(st) for st in sorted(set(map(str, states)))}
    s.close()
    return out


def subscription_flood(url: str, pid: int, run_ids: list[str], mb: float) -> dict:
    s = Session(url)
    huge = "vapo://runs/" + "x" * int(mb * 1_000_000)
    with watched(pid, url + "/health") as out:
        refused_huge = sum("error" in s.call("resources/subscribe", {"uri": huge}) for _ in range(300))
        valid = [f"vapo://runs/{r}{p}" for r in run_ids for p in ("", "/metrics", "/log", "/plot.png")][:300]
        accepted = sum("error" not in s.call("resources/subscribe", {"uri": u}) for u in valid)
        out.update(huge_uri_mb=mb, huge_refused=refused_huge, of_300=300, valid_uris=len(valid),
                   valid_accepted=accepted, rss_subscribed_mb=rss_mb(pid))
        s.close()
        time.sleep(1)
    return out


def half_open(url: str, pid: int, n: int = 256) -> dict:
    port = int(url.rsplit(":", 1)[1])
    with watched(pid, url + "/health") as out:
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
        for sock in socks:
            sock.setblocking(False)
        time.sleep(5)
        t0 = time.monotonic()
        init = httpx.post(url + "/mcp", headers={"Authorization": f"Bearer {TOKEN}",
                                                 "Accept": "application/json, text/event-stream"},
                          json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                              "protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "attack-bench", "version": "1"}}}, timeout=30)
        out.update(connections=n, token_client_status=init.status_code,
                   token_client_ms=round((time.monotonic() - t0) * 1000, 1), closed_by_server=closed_by_server(socks))
        for sock in socks:
            sock.close()
    return out


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of `socks` (non-blocking) the server has closed."""
    n = 0
    for sock in socks:
        try:
            n += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


def fifo_weights(tmp: Path) -> dict:
    from vapo_engine.builtin_model import builtin_model_dir
    root = tmp / "weights"
    (root / "fifo").mkdir(parents=True)
    os.mkfifo(root / "fifo" / "model.safetensors")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve-model", str(builtin_model_dir()), "--port",
                             str(port), "--weight-root", str(root), "--log-level", "warning"], cwd=REPO,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with watched(proc.pid, url + "/health") as out:
            time.sleep(1)
            t0 = time.monotonic()
            try:
                r = httpx.post(url + "/rollout/load_weights", json={"path": str(root / "fifo"), "version": 1},
                               timeout=20)
                out.update(load_weights_status=r.status_code, load_weights_error=r.json()["error"]["message"][:120])
            except httpx.HTTPError as e:
                out.update(load_weights_status=None, load_weights_error=type(e).__name__)
            out["load_weights_ms"] = round((time.monotonic() - t0) * 1000, 1)
            time.sleep(2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


def registered_runs(ws: Path, n: int = 80) -> list[str]:
    """`n` registered runs (directories and records; nothing starts) for the subscriptions to name."""
    from vapo_engine.jobs import Registry
    registry, ids = Registry(ws / "logs"), []
    for i in range(n):
        run_dir = ws / "logs" / "attack" / f"attack-{i}"
        run_dir.mkdir(parents=True)
        registry.add(f"attack-{i}", "attack", [], run_dir)
        ids.append(f"attack-{i}")
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sub-mb", type=float, default=3.5, help="size of each hostile subscription URI in MB")
    ap.add_argument("--out", default=None, help="folder for the record (default bench/results)")
    args = ap.parse_args()
    start = load_avg()
    provider = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    provider.daemon_threads = True
    threading.Thread(target=provider.serve_forever, daemon=True).start()
    provider_url = f"http://127.0.0.1:{provider.server_address[1]}/v1"
    with tempfile.TemporaryDirectory() as tmp:
        ws = workspace(Path(tmp))
        run_ids = registered_runs(ws)
        proc, url = start_mcp(ws, provider_url)
        try:
            phases = {"idle_rss_mb": rss_mb(proc.pid)}
            for name, fn in (("evaluate_flood_at_the_caps", lambda: evaluate_flood(url, proc.pid, EVAL)),
                             ("evaluate_flood_small", lambda: evaluate_flood(url, proc.pid, SMALL_EVAL)),
                             ("subscription_flood", lambda: subscription_flood(url, proc.pid, run_ids, args.sub_mb)),
                             ("half_open_connections", lambda: half_open(url, proc.pid))):
                phases[name] = fn()
                print(name, json.dumps(phases[name]), flush=True)
            phases["peak_rss_mb"] = rss_mb(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        phases["fifo_under_weight_root"] = fifo_weights(Path(tmp))
        print("fifo_under_weight_root", json.dumps(phases["fifo_under_weight_root"]), flush=True)
    provider.shutdown()
    path = write_record("attack", {"phases": phases, "load_avg_start": start, "load_avg_end": load_avg()},
                        Path(args.out) if args.out else None)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
