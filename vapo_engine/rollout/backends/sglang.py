"""The `sglang` rollout backend: the rollout protocol mapped onto SGLang's native HTTP server.

UNTESTED AGAINST A REAL SGLang: this machine has no GPU and no SGLang. The request / response translation below is
tested only against a small loopback server that answers the documented shapes (tests/test_rollout_engines.py);
`bench/gpu_check.py` is where it meets a real engine. Written for the SGLang server of the 0.5 line.

Launch (every replica must see rollout.weights_dir):

    python -m sglang.launch_server --model-path MODEL_DIR --port 8001 --served-model-name policy \\
        [--api-key $VAPO_MCP_TOKEN]

| protocol | SGLang |
|---|---|
| info | `GET /get_model_info` (model_path, served name where given) |
| generate | `POST /generate`: `input_ids`, `sampling_params` {`n`, `max_new_tokens`, `temperature`, `top_p`, `top_k` (-1 = off), `stop_token_ids`, `skip_special_tokens: false`, `no_stop_trim: true`, `sampling_seed`}, `return_logprob: true`; one answer object per sample: `output_ids`, `meta_info.output_token_logprobs` ([log-prob, token id, text] per token), `meta_info.finish_reason.type`, `meta_info.weight_version` |
| load_weights | `POST /update_weights_from_disk` {`model_path`, `weight_version`, `flush_cache: true`} → {`success`, `message`}, then `POST /flush_cache` |
| pause / resume | `POST /pause_generation`, `POST /continue_generation` (not needed by the trainer's synchronous push) |

Log-prob semantics: SGLang's default returns the log-probs of the temperature-scaled distribution over the full
vocabulary (log_softmax(logits / T)), as the protocol requires. Weight versions are passed as strings and
compared as such.
"""
from __future__ import annotations

from .registry import register_backend
from .replicas import ReplicaFailed, ReplicaRefused
from .server import ServerBackend


@register_backend("sglang")
class SglangBackend(ServerBackend):
    name = "sglang"
    info_path = "/get_model_info"

    def check(self, url: str, info: dict) -> str | None:
        want, got = self.options.model, info.get("served_model_name") or info.get("model_path")
        if want and got != want:
            return (f"SGLang at {url} serves model {str(got)[:100]!r}, but rollout.model is {want!r}: start it with "
                    f"--served-model-name {want}, or fix rollout.urls")
        return None

    def served_name(self, replica) -> str:
        return str(replica.info.get("served_model_name") or replica.info.get("model_path"))

    def _generate_once(self, replica, prompt, params, seed):
        sampling = {"n": params.n, "max_new_tokens": params.max_new_tokens, "temperature": float(params.temperature),
                    "top_p": float(params.top_p), "top_k": int(params.top_k) if params.top_k > 0 else -1,
                    "stop_token_ids": list(params.stop_token_ids), "skip_special_tokens": False,
                    "no_stop_trim": True, "sampling_seed": seed % 2**31}
        out = self.pool.http(replica, "POST", "/generate",
                             {"input_ids": list(prompt), "sampling_params": sampling, "return_logprob": True})
        answers = out if isinstance(out, list) else [out]
        parsed, versions = [], set()
        for a in answers:
            meta = a.get("meta_info") or {}
            pairs = meta.get("output_token_logprobs") or []
            ids = list(a.get("output_ids") or [p[1] for p in pairs])
            if [p[1] for p in pairs] != ids:
                raise ReplicaRefused(f"SGLang at {replica.url} answered output_ids that differ from the tokens of "
                                     "its log-probs; it does not speak the expected /generate format")
            reason = (meta.get("finish_reason") or {}).get("type", "length")
            parsed.append((ids, [float(p[0]) for p in pairs], {"stop": "stop", "abort": "abort"}.get(reason, "length")))
            versions.add(meta.get("weight_version"))
        answered = versions.pop() if len(versions) == 1 else None
        expected = None if self.pool.weights is None else str(self.pool.weights[0])
        if expected is not None and answered != expected:
            replica.version = None
            raise ReplicaFailed(f"answered with weight version {answered!r}, not the current {expected!r}")
        return {"weight_version": replica.version, "choices": self._checked(replica, parsed, params)}

    def _load_on(self, replica, path: str, version: int) -> None:
        out = self.pool.http(replica, "POST", "/update_weights_from_disk",
                             {"model_path": path, "weight_version": str(version), "flush_cache": True})
        if not out.get("success", False):
            raise ReplicaRefused(f"SGLang at {replica.url} did not load {path}: {str(out.get('message'))[:300]}")
        self.pool.http(replica, "POST", "/flush_cache", None, json_answer=False)
