"""The rollout protocol's reference implementation over one served model (`serving/rollout_protocol.py` says what
each route means): sampling from token ids with per-token log-probs, abort, pause / resume, loading the trainer's
weights with a version tag. Worker-side (torch).

Sampling is the in-process Hugging Face backend's (`rollout.backends.hf.run`: `model.generate`, KV cache, only
the request's temperature / top_p / top_k apply), so a response here is drawn exactly as `backend = "hf"` would
draw it; the log-probs come from the raw logits of each step (log_softmax(logits / T) over the full
vocabulary). A request's n samples are one batch of n rows; a seeded request runs in a forked random stream, so
it draws the same tokens whichever replica serves it. One lock (`ServedModel.compute`) serialises every use of
the model (these calls, the chat engine's batches and weight loads), so weights never change under a running
request and each answer carries the one version that produced it. Loading reads safetensors only (no pickle)
from a directory inside `--weight-root`, each file opened the one safe way run files are (vapo_engine/datafiles.py:
never through a symlink, only when regular, so a FIFO named `*.safetensors` cannot freeze the server); a file
that does not parse as safetensors is a 400 naming it.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import StoppingCriteria, StoppingCriteriaList

from vapo_engine.datafiles import NotRegularFile, open_read
from vapo_engine.rollout.backends import SamplingParams
from vapo_engine.rollout.backends.hf import _seeded, run

from .protocol import ApiError, bad_request
from .rollout_protocol import LOG_PROB_SEMANTICS, PROTOCOL_VERSION, GenerateRequest, generate_response


class _Abort(StoppingCriteria):
    """Ends every row at once when the request was aborted."""

    def __init__(self, flag: threading.Event):
        self.flag = flag

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


class RolloutService:
    """Protocol operations over a `ServedModel` (thread-safe; the HTTP layer calls them in worker threads)."""

    def __init__(self, served, *, weight_root: Path | None = None):
        self.m, self.weight_root = served, Path(weight_root).resolve() if weight_root else None
        self.version = 0
        self._resumed = threading.Event()
        self._resumed.set()
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str | None, threading.Event]] = {}
        self.stats = {"generate": 0, "aborted": 0, "loads": 0}

    # --- info -------------------------------------------------------------------------------------------------
    def info(self) -> dict:
        cfg = self.m.model.config
        arch = {k: getattr(cfg, k, None) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")}
        return {"protocol": PROTOCOL_VERSION, "model": self.m.name, "max_model_len": self.m.context,
                "weight_version": self.version, "paused": not self._resumed.is_set(),
                "log_probs": LOG_PROB_SEMANTICS, "architecture": arch}

    @property
    def vocab(self) -> int:
        return int(self.m.model.get_output_embeddings().weight.shape[0])

    # --- pause / abort ----------------------------------------------------------------------------------------
    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    def abort(self, request_id: str | None) -> int:
        with self._lock:
            hits = [flag for rid, flag in self._running.values() if request_id is None or rid == request_id]
        for flag in hits:
            flag.set()
        return len(hits)

    # --- generate ---------------------------------------------------------------------------------------------
    def generate(self, req: GenerateRequest, wait_s: float = 3600.0) -> dict:
        flag, key = threading.Event(), object()
        with self._lock:
            self._running[id(key)] = (req.request_id, flag)
        try:
            while not self._resumed.wait(0.05):  # paused: wait (an abort ends the wait too)
                wait_s -= 0.05
                if flag.is_set() or wait_s <= 0:
                    break
            if flag.is_set() or not self._resumed.is_set():
                return generate_response(self.m.name, self.version, [([], [], "abort")] * req.n,
                                         len(req.prompt_ids))
            with self.m.compute:
                version = self.version
                choices = self._sample(req, flag)
        finally:
            with self._lock:
                self._running.pop(id(key), None)
        with self._lock:
            self.stats["generate"] += 1
            self.stats["aborted"] += int(flag.is_set())
        return generate_response(self.m.name, version, choices, len(req.prompt_ids))

    @torch.inference_mode()
    def _sample(self, req: GenerateRequest, flag: threading.Event) -> list[tuple[list[int], list[float], str]]:
        params = SamplingParams(max_new_tokens=req.max_tokens, stop_token_ids=req.stop_token_ids,
                                pad_token_id=self.m.pad_id, temperature=req.temperature, top_p=req.top_p,
                                top_k=req.top_k, seed=req.seed)
        rows = [list(req.prompt_ids)] * req.n
        with _seeded(req.seed, self.m.device):
            prompt_ids, _, out = run(self.m.model, rows, params, stopping_criteria=StoppingCriteriaList(
                [_Abort(flag)]), raw_logits=True)
        tokens = out.sequences[:, prompt_ids.shape[1]:]
        if not out.logits:
            return [([], [], "abort")] * req.n
        t = req.temperature if req.temperature > 0 else 1.0
        logits = torch.stack(out.logits, dim=1).float()[:, :tokens.shape[1]] / t
        lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, :logits.shape[1], None]).squeeze(-1)
        stops, choices = set(req.stop_token_ids), []
        for row, row_lp in zip(tokens.tolist(), lp.tolist()):
            end = next((i for i, tok in enumerate(row) if tok in stops), None)
            if end is not None:
                choices.append((row[:end + 1], row_lp[:end + 1], "stop"))
            else:
                n = min(len(row), req.max_tokens, len(row_lp))
                choices.append((row[:n], row_lp[:n], "abort" if flag.is_set() else "length"))
        return choices

    # --- weights ----------------------------------------------------------------------------------------------
    def load_weights(self, path: str, version: int) -> int:
        folder = self._inside_root(path)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise bad_request(f"{path} holds no *.safetensors file; give the directory the trainer wrote (its "
                              "save_pretrained export)", "path")
        state = self.m.model.state_dict()
        loaded: dict[str, torch.Tensor] = {}
        for f in files:
            loaded.update(_tensors(f, state))
        have = {state[k].data_ptr() for k in loaded}
        missing = [k for k in state if k not in loaded and state[k].data_ptr() not in have]
        if missing:
            raise bad_request(f"{path} lacks {len(missing)} tensor(s) of the served model (first: {missing[0]!r}); "
                              "write the whole model", "path")
        with self.m.compute, torch.no_grad():
            for name, t in loaded.items():
                state[name].copy_(t.to(state[name].dtype))
            self.version = version
        with self._lock:
            self.stats["loads"] += 1
        return version

    def _inside_root(self, path: str) -> Path:
        if self.weight_root is None:
            raise ApiError(403, "this server loads no weights: restart serve-model with --weight-root DIR (the "
                                "directory the trainer writes rollout weights under, e.g. its runtime.log_dir)",
                           type_="permission_error", param="path", code="no_weight_root")
        folder = Path(path).expanduser().resolve()
        if not folder.is_relative_to(self.weight_root):
            raise ApiError(403, f"{path[:300]} is outside this server's --weight-root; write the weights under it "
                                "or restart serve-model with a --weight-root that holds them",
                           type_="permission_error", param="path", code="outside_weight_root")
        if not folder.is_dir():
            raise bad_request(f"{path[:300]} is not a directory on this server; the trainer and the server must "
                              "see the same file system (or a shared one) at that path", "path")
        return folder


def _tensors(f: Path, state: dict) -> dict[str, torch.Tensor]:
    """The tensors of the weights file `f`, each checked against the served model's `state`; a 400 naming `f` when
    it is not a regular file, not safetensors, or does not fit."""
    try:
        handle = open_read(f)  # O_NOFOLLOW | O_NONBLOCK, regular files only: a FIFO or a symlink never blocks
    except NotRegularFile:
        raise bad_request(f"{f.name} is a symbolic link or not a regular file; the weights must be regular files the "
                          "trainer wrote inside --weight-root", "path") from None
    except OSError as e:
        raise bad_request(f"{f.name} cannot be read ({e.strerror or type(e).__name__})", "path") from None
    with handle:
        by_fd = f"/proc/self/fd/{handle.fileno()}"  # the file opened above, not whatever the name points to now
        try:
            with safe_open(by_fd if os.path.exists(by_fd) else str(f), framework="pt", device="cpu") as sf:
                return {name: _fitting(f, name, sf, state) for name in sf.keys()}  # noqa: SIM118 - a handle
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - a malformed file (safetensors raises its own error types)
            raise bad_request(f"{f.name} is not a valid safetensors file ({type(e).__name__}); write it with "
                              "save_pretrained / safetensors", "path") from None


def _fitting(f: Path, name: str, sf, state: dict) -> torch.Tensor:
    """Tensor `name` of the open file `sf`, once the served model has it (checked before it is read) in that shape."""
    if name not in state:
        raise bad_request(f"{f.name} holds tensor {name[:200]!r}, which the served model does not have: the trainer "
                          "trains another architecture than this server serves", "path")
    t = sf.get_tensor(name)
    if tuple(t.shape) != tuple(state[name].shape):
        raise bad_request(f"tensor {name[:200]!r} has shape {tuple(t.shape)} in {f.name} but "
                          f"{tuple(state[name].shape)} in the served model", "path")
    return t
