"""The `server` rollout backend: rollouts sampled by inference servers that speak the project's rollout protocol
(`vapo_engine/serving/rollout_protocol.py`; `vapo-mcp serve-model` is the reference server), one or many
replicas at `[rollout] urls`.

Each prompt is one `POST /rollout/generate` request for its n samples (they share a replica, hence its prefix
cache; a prompt the rollout layer repeated for its group, in adjacent rows, counts as one prompt), sent concurrently and spread over the replicas by the pool (`replicas.ReplicaPool`: least outstanding
requests, failover, waiting with backoff, identity and weight-version checks). Every setting is sent explicitly
(temperature, top_p, top_k, stop ids, max tokens) with a per-prompt seed drawn from the caller's torch random
stream (or derived from `SamplingParams.seed`), so a run's samples do not depend on which replica served them.
The answer's per-token log-probs (log_softmax(logits / T) over the full vocabulary) always come back in
`Generation.log_probs`, and the weight version that drew them in `Generation.weight_version`.

`load_weights(models, version=, path=)` makes the replicas load the safetensors directory `path` that the trainer
wrote (`trainer/weight_sync.py`) as version `version`; with `send=False` (the other ranks of a data-parallel run,
after rank 0 sent it) it only records the version. Subclasses (the vLLM / SGLang adapters) change the wire
format by overriding `info_path`, `_generate_once` and `_load_on`. This backend does not tokenize prompts
(the rollout layer does) and never loads weights itself.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from .base import Generation, PolicyModels, RolloutBackend, SamplingParams, decode_responses, left_pad
from .registry import register_backend
from .replicas import ReplicaFailed, ReplicaPool, ReplicaRefused, health_problem

ARCH_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")


def _architecture(config) -> dict:
    return {k: getattr(config, k, None) for k in ARCH_KEYS}


def _runs(rows: list[list[int]]) -> list[tuple[int, int]]:
    """(start, length) of each run of equal adjacent rows (the rollout layer repeats a prompt for its group)."""
    out: list[tuple[int, int]] = []
    for i, row in enumerate(rows):
        if out and rows[out[-1][0]] == row:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def prompt_seed(base: int, index: int) -> int:
    """A per-prompt seed derived from a call's seed (stable across processes and Python versions)."""
    return int.from_bytes(hashlib.sha256(f"{base}:{index}".encode()).digest()[:7], "big")


@register_backend("server")
class ServerBackend(RolloutBackend):
    name = "server"
    remote = True
    """Samples from its own copy of the weights: the trainer pushes them (`trainer/weight_sync.py`)."""
    info_path = "/rollout/info"

    def __init__(self, options):
        self.options = options
        self.expected: dict | None = None
        self.pool = ReplicaPool(list(options.urls), token_env=options.token_env,
                                timeout_s=options.request_timeout_s,
                                unavailable_timeout_s=options.unavailable_timeout_s, info_path=self.info_path,
                                check=self.check)
        self._failovers_seen = 0

    @staticmethod
    def health_check(options) -> str | None:
        """The preflight probe (vapo_engine/doctor/network.py): None when a replica answers /health."""
        return health_problem(list(options.urls))

    # --- identity ---------------------------------------------------------------------------------------------
    def check(self, url: str, info: dict) -> str | None:
        """Why the replica at `url` (its info answer) cannot serve this run, or None."""
        want = self.options.model
        if want and info.get("model") != want:
            return (f"rollout replica {url} serves model {str(info.get('model'))[:100]!r}, but rollout.model is "
                    f"{want!r}: start it with --model-name {want} (serving the run's model), or fix rollout.urls")
        got = info.get("architecture") or {}
        if self.expected and any(got.get(k) is not None and got.get(k) != v for k, v in self.expected.items()):
            return (f"rollout replica {url} serves a different model than the one this run trains: it has "
                    f"{ {k: got.get(k) for k in ARCH_KEYS} }, the run's policy has {self.expected}; start the "
                    "replica on the run's model (model.local_path, or the built-in model's folder)")
        return None

    def served_name(self, replica) -> str:
        """The model name to put in requests to `replica` (from its info answer)."""
        return str(replica.info.get("model"))

    def _expect(self, models: PolicyModels) -> None:
        if self.expected is None:
            self.expected = _architecture(models.policy.config)

    # --- sampling ---------------------------------------------------------------------------------------------
    def generate(self, models: PolicyModels, prompt_ids: list[list[int]], params: SamplingParams, *,
                 batch_size: int | None = None) -> Generation:
        del batch_size  # the servers batch by themselves
        if not prompt_ids:
            raise ValueError("generate() needs at least one prompt")
        self._expect(models)
        groups = _runs(prompt_ids)  # a group's rows are one prompt repeated: one request, n × its size samples
        seeds = ([prompt_seed(params.seed, i) for i in range(len(groups))] if params.seed is not None
                 else torch.randint(0, 2**62, (len(groups),)).tolist())
        calls = [(prompt_ids[start], replace(params, n=params.n * size)) for start, size in groups]
        workers = max(1, min(len(calls), 8 * len(self.pool.replicas)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout-http") as ex:
            answers = list(ex.map(lambda i: self.pool.call(
                lambda r: self._generate_once(r, calls[i][0], calls[i][1], seeds[i])), range(len(calls))))
        return self._assemble(models, prompt_ids, params, answers)

    def _generate_once(self, replica, prompt: list[int], params: SamplingParams, seed: int) -> dict:
        """One prompt's n samples on `replica` → {"weight_version", "choices": [(ids, log-probs, reason)]}."""
        body = {"model": self.served_name(replica), "prompt_ids": list(prompt), "n": params.n,
                "max_tokens": params.max_new_tokens, "temperature": float(params.temperature),
                "top_p": float(params.top_p), "top_k": int(params.top_k),
                "stop_token_ids": list(params.stop_token_ids), "seed": seed}
        out = self.pool.http(replica, "POST", "/rollout/generate", body)
        self.pool.served_version(replica, out.get("weight_version"))
        choices = [(c["token_ids"], c["log_probs"], c["finish_reason"]) for c in out.get("choices") or []]
        return {"weight_version": out.get("weight_version"), "choices": self._checked(replica, choices, params)}

    def _checked(self, replica, choices: list, params: SamplingParams) -> list:
        if len(choices) != params.n:
            raise ReplicaRefused(f"rollout replica {replica.url} answered {len(choices)} samples for n = {params.n}")
        for ids, lps, reason in choices:
            if reason == "abort":
                raise ReplicaFailed("the request was aborted on the server")
            if len(ids) != len(lps) or not 0 < len(ids) <= params.max_new_tokens:
                raise ReplicaRefused(f"rollout replica {replica.url} answered {len(ids)} tokens with {len(lps)} "
                                     f"log-probs (max_tokens {params.max_new_tokens}); it does not speak the "
                                     "rollout protocol")
        return choices

    def _assemble(self, models: PolicyModels, prompts: list[list[int]], params: SamplingParams,
                  answers: list[dict]) -> Generation:
        rows = [p for p in prompts for _ in range(params.n)]
        choices = [c for a in answers for c in a["choices"]]
        versions = {a["weight_version"] for a in answers}
        if len(versions) != 1:
            raise ReplicaRefused(f"the replicas answered one batch with weight versions {sorted(versions)}")
        width = max(1, max(len(ids) for ids, _, _ in choices))
        ids = torch.full((len(rows), width), params.pad_token_id, dtype=torch.long)
        mask, lp = torch.zeros((len(rows), width)), torch.zeros((len(rows), width))
        for i, (toks, lps, _) in enumerate(choices):
            ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
            mask[i, :len(toks)] = 1.0
            lp[i, :len(toks)] = torch.tensor(lps, dtype=torch.float32)
        finished = torch.tensor([reason == "stop" for _, _, reason in choices], dtype=torch.bool)
        prompt_ids, prompt_mask = left_pad(rows, params.pad_token_id, "cpu")
        dev = models.policy.device
        return Generation(prompt_ids.to(dev), prompt_mask.to(dev), ids.to(dev), mask.to(dev),
                          decode_responses(models.tokenizer, ids, mask), finished.to(dev), lp.to(dev),
                          weight_version=versions.pop())

    # --- weights ----------------------------------------------------------------------------------------------
    def load_weights(self, models: PolicyModels, *, version: int, path: str | None = None,
                     send: bool = True) -> None:
        self._expect(models)
        if path is None:
            raise ValueError("the server backend loads weights from a directory: pass path (trainer/weight_sync)")

        def sender(pool, replica):
            self._load_on(replica, str(path), version)
        if send:
            self.pool.push(version, sender)
        else:  # another rank sent it to every replica already
            self.pool.weights = (version, sender)
            for r in self.pool.replicas:
                r.version = version if r.down_until == 0 else None

    def _load_on(self, replica, path: str, version: int) -> None:
        out = self.pool.http(replica, "POST", "/rollout/load_weights", {"path": path, "version": version})
        if out.get("weight_version") != version:
            raise ReplicaFailed(f"loaded weights as version {out.get('weight_version')}, not {version}")

    # --- reporting --------------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        new, self._failovers_seen = self.pool.failovers - self._failovers_seen, self.pool.failovers
        return {"rollout/replica_failovers": float(new), "rollout/replicas_up": float(self.pool.up())}

    def close(self) -> None:
        self.pool.close()
