"""Helpers for tests of `serve-model`: a real server on 127.0.0.1 (uvicorn in a thread, on a socket bound to a
free port), a raw SSE reader, a tiny model that has memorised one answer, the cached built-in addition model
when present, and a run with a checkpoint."""
from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class Served:
    url: str
    """The base URL clients use (ends in /v1)."""
    prepared: object
    """vapo_engine.serving.server.Prepared: app, source, served model, engine, name."""
    stop: object = None
    """Stops the server at once (as if its process died): later connections are refused."""

    @property
    def name(self) -> str:
        return self.prepared.name

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def health(self) -> dict:
        return httpx.get(self.root + "/health", timeout=30).json()


@contextmanager
def serving(target: Path, *, token: str | None = None, host: str = "127.0.0.1", wrap=None, **options):
    """Serve `target` (a model or run directory) until the block ends. `wrap(app)`: an ASGI app put in front of
    the server's own (a test's planted fault)."""
    import uvicorn

    from vapo_engine.serving.header_timeout import protocol
    from vapo_engine.serving.options import ServeOptions
    from vapo_engine.serving.server import prepare
    prepared = prepare(ServeOptions(target=Path(target), host=host, **options), token)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(wrap(prepared.app) if wrap else prepared.app, log_level="warning",
                                           http=protocol(admission=prepared.admission)))  # as serve-model runs it
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the server did not start"
        time.sleep(0.02)
    def stop():
        server.should_exit = True
        thread.join(30)
        sock.close()
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", prepared, stop)
    finally:
        stop()


def sse_events(response: httpx.Response) -> list:
    """Every `data:` payload of an SSE response, parsed (JSON objects, or the literal string "[DONE]"); each
    event must be one `data:` line followed by a blank line."""
    events, lines = [], response.text.split("\n")
    assert response.text.endswith("\n\n"), response.text[-200:]
    for i, line in enumerate(lines):
        if line.startswith("data: "):
            assert lines[i + 1] == "", f"event not followed by a blank line: {line[:120]}"
            payload = line[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        else:
            assert line == "", f"unexpected SSE line: {line[:120]}"
    return events


def cached_addition_model() -> Path | None:
    """The warm-started built-in addition model (~67% greedy): the one shipped with the package, else a cache
    build of its recipe; None only where its recipe was changed and not rebuilt yet (building takes minutes)."""
    from vapo_engine.builtin_model import ready_model_dir
    return ready_model_dir(task="builtin:addition")


def memorised_model_dir(out: Path, prompt: str, answer: str, steps: int = 80) -> Path:
    """A tiny model (hidden 32) trained for a few seconds to answer `prompt` with `answer` and EOS: a model that
    passes a smoke test for real, in CI, without the cached built-in model."""
    import torch

    from vapo_engine.builtin_model import build_tokenizer, make_model
    tok = build_tokenizer()
    model = make_model(tok, hidden=32, layers=2, heads=2, seed=0)
    p_ids = tok(prompt)["input_ids"]
    ids = torch.tensor([p_ids + tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]])
    labels = ids.clone()
    labels[:, :len(p_ids)] = -100
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(steps):
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def run_with_checkpoint(files, manager, model_dir: Path, step: int = 2, run_id: str = "served-run") -> Path:
    """A registered run (cpu-demo settings on builtin:addition) whose one checkpoint at `step` holds
    `model_dir` as its policy, with a verified DONE manifest: what a trainer leaves behind."""
    from vapo_engine.config import load_config, load_settings
    from vapo_engine.rundir import RunDir, write_manifest
    from vapo_engine.runs import create_run
    cfg = load_config(files.config, ["eval.num_problems=12", "eval.samples_per_problem=1", "model.max_tokens=12"],
                      preset="cpu-demo")
    info = create_run(cfg, load_settings(files.settings), manager.registry.root, run_id=run_id)
    manager.registry.add(run_id, info.experiment, info.tags, info.run_dir)
    ckpt = RunDir(info.run_dir).checkpoint(step)
    shutil.copytree(model_dir, ckpt / "policy")
    write_manifest(ckpt, step)
    return info.run_dir
