"""The `vllm` rollout backend: the rollout protocol mapped onto vLLM's own OpenAI-compatible server.

UNTESTED AGAINST A REAL vLLM: this machine has no GPU and no vLLM. The request / response translation below is
tested only against a small loopback server that answers the documented shapes (tests/test_rollout_engines.py);
`bench/gpu_check.py` is where it meets a real engine. Written for the vLLM OpenAI server as of the 0.1x line;
routes that need `VLLM_SERVER_DEV_MODE=1` are marked.

Launch (one replica per GPU or tensor-parallel group; every replica must see rollout.weights_dir):

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --port 8001 --logprobs-mode processed_logprobs \\
        --served-model-name policy [--api-key $VAPO_MCP_TOKEN]

| protocol | vLLM |
|---|---|
| info | `GET /v1/models` (id, max_model_len) |
| generate | `POST /v1/completions`: `prompt` = token ids, `n`, `max_tokens`, `temperature`, `top_p`, `top_k` (-1 = off), `seed`, `stop_token_ids`, `logprobs: 0` (the sampled token's log-prob only), `return_tokens_as_token_ids`, `skip_special_tokens: false`; token ids from `choices[i].token_ids` when given, else from the `token_id:N` strings of `logprobs.tokens`; log-probs from `logprobs.token_logprobs` |
| load_weights | `POST /collective_rpc` (dev mode) `update_config` with `model_config.model` = the directory, then `reload_weights`, then `POST /reset_prefix_cache` (dev mode) so no cached prefix of the old weights is reused |

Log-prob semantics: `--logprobs-mode processed_logprobs` makes vLLM return the log-probs of the distribution it
sampled from (after temperature; after top-p / top-k masking when those are on), so with top_p = 1 and top_k off
they are log_softmax(logits / T) over the full vocabulary, as the protocol requires. vLLM has no weight version:
the version is the one the pool last loaded on that replica (`Replica.version`), and a replica that restarted is
detected by its failed requests and loaded again.
"""
from __future__ import annotations

from .registry import register_backend
from .replicas import ReplicaFailed, ReplicaRefused
from .server import ServerBackend


def _token_id(token: str) -> int:
    if not isinstance(token, str) or not token.startswith("token_id:"):
        raise ReplicaRefused(f"vLLM answered token {str(token)[:40]!r}, not 'token_id:N': start it with a version "
                             "that supports return_tokens_as_token_ids")
    return int(token.split(":", 1)[1])


@register_backend("vllm")
class VllmBackend(ServerBackend):
    name = "vllm"
    info_path = "/v1/models"

    def check(self, url: str, info: dict) -> str | None:
        cards = info.get("data") or []
        if not cards:
            return f"vLLM at {url} lists no model (GET /v1/models)"
        want = self.options.model
        if want and cards[0].get("id") != want:
            return (f"vLLM at {url} serves model {str(cards[0].get('id'))[:100]!r}, but rollout.model is {want!r}: "
                    f"start it with --served-model-name {want}, or fix rollout.urls")
        return None

    def served_name(self, replica) -> str:
        return str(replica.info["data"][0]["id"])

    def _generate_once(self, replica, prompt, params, seed):
        body = {"model": self.served_name(replica), "prompt": list(prompt), "n": params.n,
                "max_tokens": params.max_new_tokens, "temperature": float(params.temperature),
                "top_p": float(params.top_p), "top_k": int(params.top_k) if params.top_k > 0 else -1,
                "seed": seed % 2**63, "stop_token_ids": list(params.stop_token_ids), "logprobs": 0,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False, "ignore_eos": False}
        out = self.pool.http(replica, "POST", "/v1/completions", body)
        choices = sorted(out.get("choices") or [], key=lambda c: c.get("index", 0))
        parsed = []
        for c in choices:
            lp = c.get("logprobs") or {}
            ids = c.get("token_ids") or [_token_id(t) for t in lp.get("tokens") or []]
            lps = [float(x) for x in lp.get("token_logprobs") or []]
            reason = {"stop": "stop", "length": "length", "abort": "abort"}.get(c.get("finish_reason"), "length")
            if reason == "stop" and (not ids or ids[-1] not in params.stop_token_ids):
                raise ReplicaRefused(f"vLLM at {replica.url} ended a response on a stop string, not a stop token "
                                     "id; the rollout protocol stops on token ids only")
            parsed.append((ids, lps, reason))
        return {"weight_version": replica.version, "choices": self._checked(replica, parsed, params)}

    def _load_on(self, replica, path: str, version: int) -> None:
        self.pool.http(replica, "POST", "/collective_rpc",
                       {"method": "update_config", "args": [{"model_config": {"model": path}}]}, json_answer=False)
        self.pool.http(replica, "POST", "/collective_rpc", {"method": "reload_weights"}, json_answer=False)
        try:
            self.pool.http(replica, "POST", "/reset_prefix_cache", None, json_answer=False)
        except ReplicaRefused as e:  # an old server without the route: say so once loading worked
            raise ReplicaFailed(f"weights loaded but the prefix cache could not be reset ({e})") from None
