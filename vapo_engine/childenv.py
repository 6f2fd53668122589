"""The environment of every process vapo-mcp starts (run supervisors, trainer workers, the local evaluation
worker, the scrubbing helper): the server's own credentials stay behind. Torch-free.

`VAPO_MCP_TOKEN` is the bearer token of `vapo-mcp serve --http` / `serve-model`. A worker never serves HTTP, so
it does not get it — with one exception the user chose in config.toml: a run that samples rollouts from
inference-server replicas (`rollout.backend` other than hf) whose `rollout.token_env` names that variable sends
it to those replicas as their key, so that run's supervisor and worker keep it.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

TOKEN_ENV = "VAPO_MCP_TOKEN"
"""The bearer token of both HTTP servers (vapo_engine/serving/security.py takes the name from here)."""
SERVER_SECRETS = (TOKEN_ENV,)
"""Variables a child process never inherits unless `keep` names them."""


def child_env(base: Mapping[str, str] | None = None, *, keep: tuple[str, ...] = ()) -> dict[str, str]:
    """A copy of `base` (default: this process's environment) without `SERVER_SECRETS` not in `keep`."""
    env = dict(os.environ if base is None else base)
    for name in SERVER_SECRETS:
        if name not in keep:
            env.pop(name, None)
    return env


def run_needs(config: Mapping | None) -> tuple[str, ...]:
    """The server secrets a run with this frozen config (config.json) uses: the replicas' token when its rollout
    backend is a server pool whose `token_env` is one of them; else none."""
    rollout = (config or {}).get("rollout") or {}
    if not isinstance(rollout, Mapping) or rollout.get("backend", "hf") == "hf":
        return ()
    name = rollout.get("token_env", TOKEN_ENV)
    return (name,) if name in SERVER_SECRETS else ()
