"""Start a model server: resolve what to serve, check the bind, load the model, build the app, run uvicorn.

`prepare(options)` does everything but listening (tests run the returned app in their own uvicorn server on
a socket they bound); `run(options)` listens until Ctrl-C. The banner on stderr says how to point the channel
at the endpoint (`TAOTOKEN_BASE_URL` and `models.reasoning`), never the token.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from .admission import Admission
from .listen import bind_listen_socket
from .options import ServeOptions
from .security import TOKEN_ENV, allowed_host_names, check_bind
from .source import ModelSource, resolve_source

log = logging.getLogger("vapo_engine.serving")


@dataclass
class Prepared:
    app: object
    source: ModelSource
    served: object
    engine: object
    name: str
    allowed_hosts: frozenset[str] | None = None
    rollout: object = None
    """The rollout protocol's service (rollout_service.RolloutService)."""
    admission: object = None
    """Who gets a connection slot (admission.Admission), shared by the app and the connection protocol."""


def prepare(opts: ServeOptions, token: str | None = None) -> Prepared:
    """The ASGI app for `opts` (model loaded, engine not yet started: the app's lifespan starts it)."""
    check_bind(opts.host, token)
    source = resolve_source(opts.target, step=opts.step)
    name = opts.model_name or source.name
    from .app import build_app
    from .engine import Engine
    from .model import load_served_model
    served = load_served_model(source.model_dir, name, device=opts.device, dtype=opts.dtype)
    from .rollout_service import RolloutService
    engine = Engine(served, max_batch=opts.max_batch, window_s=opts.batch_window_ms / 1000)
    hosts = allowed_host_names(opts.host, opts.allowed_hosts)
    rollout = RolloutService(served, weight_root=opts.weight_root)
    admission = Admission()
    app = build_app(served, engine, token=token, allowed_hosts=hosts, default_max_tokens=opts.default_max_tokens,
                    rollout=rollout, max_concurrent=opts.max_concurrent, body_timeout_s=opts.body_timeout_s,
                    admission=admission)
    return Prepared(app, source, served, engine, name, hosts, rollout, admission)


def banner(p: Prepared, url: str, token: bool) -> str:
    step = f" (checkpoint step {p.source.step})" if p.source.step is not None else ""
    key = f"the value of ${TOKEN_ENV} as the API key" if token else "any API key (none is checked on loopback)"
    hosts = "" if p.allowed_hosts is None else (
        f"\nclients must connect as one of: {', '.join(sorted(p.allowed_hosts))} (others get 421; add the names "
        "they use with --allowed-host NAME)")
    return (f"serving {p.source.model_dir}{step} as model {p.name!r} at {url}/v1 — context {p.served.context} "
            f"tokens, device {p.served.device}\n"
            f"use it as the channel: export TAOTOKEN_BASE_URL={url}/v1, {key}, and models.reasoning = "
            f"{p.name!r} in settings.json (or restart with --model-name <your models.reasoning>){hosts}")


def run(opts: ServeOptions) -> None:
    """Serve until interrupted."""
    import uvicorn

    logging.basicConfig(stream=sys.stderr, level=opts.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = os.environ.get(TOKEN_ENV) or None
    p = prepare(opts, token)
    sock = bind_listen_socket(opts.host, opts.port)
    port = sock.getsockname()[1]
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    print(banner(p, f"http://{shown}:{port}", bool(token)), file=sys.stderr, flush=True)
    from .header_timeout import protocol
    config = uvicorn.Config(p.app, log_level=opts.log_level, server_header=False, http=protocol(admission=p.admission))
    uvicorn.Server(config).run(sockets=[sock])
