"""The rollout protocol (version 1): how a trainer samples from an inference server and keeps its weights current.

One small protocol, the same whatever serves it; `serve-model` implements it as the CPU reference
(`serving/rollout_service.py`, `serving/rollout_routes.py`), `rollout/backends/server.py` is its client, and the
vLLM / SGLang adapters map it onto those engines' own routes. JSON over HTTP; every route but `GET /health`
needs `Authorization: Bearer <token>` when the server has a token (the same Guard as the chat routes).

    POST /rollout/generate      sample n responses to one prompt given as token ids
      {"model": "<served name>", "prompt_ids": [int, ...], "n": 4, "max_tokens": 64,
       "temperature": 1.0, "top_p": 1.0, "top_k": 0, "stop_token_ids": [2], "seed": 1234 | null,
       "request_id": "<optional, for abort>"}
      temperature, top_p and top_k are REQUIRED (no server default ever applies; top_k 0 = off, temperature 0
      = greedy); stop_token_ids non-empty; seed null = the server's own random stream.
      -> {"model", "weight_version": int, "choices": [{"index", "token_ids": [...], "log_probs": [...],
          "finish_reason": "stop" | "length" | "abort"}], "usage": {"prompt_tokens", "completion_tokens"}}
      token_ids end with the stop token when finish_reason is "stop". log_probs[i] is the log-prob of
      token_ids[i] under log_softmax(logits / temperature) over the FULL vocabulary (top-p / top-k truncation
      is not applied to the log-probs; at temperature 0 the temperature is taken as 1) — exactly what the
      trainer recomputes (`rollout.experience.response_log_probs`). weight_version is the version of the weights
      that sampled every token of the response (weights never change during a request).
    POST /rollout/abort         {"request_id": "..."} or {} (every request): running requests end at once
      with finish_reason "abort" -> {"aborted": int}
    POST /rollout/pause         new and queued generate requests wait (running ones finish) -> {"paused": true}
    POST /rollout/resume        -> {"paused": false}
    POST /rollout/load_weights  {"path": "<directory of *.safetensors>", "version": int}
      The trainer writes the directory to a temporary name and renames it into place (atomic); the server
      loads every tensor of the model from it (same names and shapes as the served model, else 400), after the
      running generate call and before the next one, and from then on answers with that weight_version.
      `path` must lie inside the server's --weight-root (403 otherwise, or when the server has none).
      -> {"weight_version": int}
    GET  /rollout/info          -> {"protocol": 1, "model", "max_model_len", "weight_version", "paused",
          "log_probs": LOG_PROB_SEMANTICS, "architecture": {"model_type", "vocab_size", "hidden_size",
          "num_hidden_layers"}}
    GET  /health                (open) also carries "weight_version"

Errors are OpenAI-shaped error objects (400 with the field in `param`, 401, 403, 404, 413, 500), like the chat
routes. Weight versions are the trainer's: the version tag of the last load (0 before any load; the trainer
pushes its weights with version = its rollout step before it samples, so a fresh server's own weights are never
used for training). This file is torch-free: request validation and response shapes only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .protocol import (
    ApiError,
    bad_request,
    integer_field,
    json_object,
    number_field,
    served_model,
    temperature_field,
)

PROTOCOL_VERSION = 1
LOG_PROB_SEMANTICS = "log_softmax(logits / temperature) over the full vocabulary"
MAX_N = 256
MAX_STOP_IDS = 64
ROUTES_TEXT = ("POST /rollout/generate, POST /rollout/abort, POST /rollout/pause, POST /rollout/resume, "
               "POST /rollout/load_weights, GET /rollout/info")


@dataclass(frozen=True)
class GenerateRequest:
    """A validated `POST /rollout/generate` body."""

    prompt_ids: tuple[int, ...]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop_token_ids: tuple[int, ...]
    seed: int | None = None
    request_id: str | None = None


def _int(data: dict, name: str, lo: int, hi: int, *, required: bool = True) -> int | None:
    if required and data.get(name) is None:
        raise bad_request(f"{name} is required (an integer in {lo}..{hi}); the rollout protocol takes every "
                          "sampling setting explicitly", name)
    return integer_field(data, name, lo, hi)


def _float(data: dict, name: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if data.get(name) is None:
        raise bad_request(f"{name} is required: the rollout protocol takes temperature, top_p and top_k "
                          "explicitly in every request (no server default applies)", name)
    return number_field(data, name, lo, lo, hi, lo_open)


def _temperature(data: dict) -> float:
    """The required temperature: 0 (greedy) or at least MIN_TEMPERATURE (protocol.temperature_field)."""
    _float(data, "temperature", 0.0, 100.0)
    return temperature_field(data, 1.0, 100.0)


def _ids(data: dict, name: str, vocab: int, most: int, *, non_empty: bool = True) -> tuple[int, ...]:
    value = data.get(name)
    ok = isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    if not ok or (non_empty and not value) or len(value) > most:
        raise bad_request(f"{name} must be a {'non-empty ' if non_empty else ''}list of at most {most} token ids "
                          "(integers)", name)
    bad = next((i for i in value if not 0 <= i < vocab), None)
    if bad is not None:
        raise bad_request(f"{name} holds {bad}, outside the vocabulary (0..{vocab - 1}) of the served model", name)
    return tuple(value)


def _request_id(data: dict) -> str | None:
    rid = data.get("request_id")
    if rid is not None and (not isinstance(rid, str) or not 0 < len(rid) <= 128):
        raise bad_request("request_id must be a string of 1-128 characters", "request_id")
    return rid


def parse_generate(data: Any, *, served: str, vocab: int, context: int) -> GenerateRequest:
    """Validate a generate body against the served model (name, vocabulary, context length)."""
    data = json_object(data)
    served_model(data, served, "GET /rollout/info")
    prompt = _ids(data, "prompt_ids", vocab, context)
    room = context - len(prompt)
    if room < 1:
        raise ApiError(400, f"the prompt has {len(prompt)} tokens and this model's maximum context length is "
                            f"{context}; send a shorter prompt", param="prompt_ids", code="context_length_exceeded")
    max_tokens = _int(data, "max_tokens", 1, 10**7)
    if max_tokens > room:
        raise ApiError(400, f"max_tokens = {max_tokens} does not fit: the prompt has {len(prompt)} tokens and the "
                            f"context {context}; lower max_tokens to at most {room}", param="max_tokens",
                       code="context_length_exceeded")
    seed = _int(data, "seed", 0, 2**63 - 1, required=False)
    return GenerateRequest(prompt_ids=prompt, n=_int(data, "n", 1, MAX_N), max_tokens=max_tokens,
                           temperature=_temperature(data),
                           top_p=_float(data, "top_p", 0.0, 1.0, lo_open=True), top_k=_int(data, "top_k", 0, vocab),
                           stop_token_ids=_ids(data, "stop_token_ids", vocab, MAX_STOP_IDS), seed=seed,
                           request_id=_request_id(data))


def parse_abort(data: Any) -> str | None:
    """The request id to abort (None = every running request)."""
    return _request_id(json_object(data))


def parse_load_weights(data: Any) -> tuple[str, int]:
    """(path, version) of a load_weights body."""
    data = json_object(data)
    path = data.get("path")
    if not isinstance(path, str) or not path or len(path) > 4096 or "\x00" in path:
        raise bad_request("path is required: the directory of *.safetensors files the trainer wrote", "path")
    return path, _int(data, "version", 0, 2**62)


def generate_response(model: str, version: int, choices: list[tuple[list[int], list[float], str]],
                      prompt_tokens: int) -> dict:
    """The generate answer; `choices` = [(token ids, log-probs, finish reason)] in index order."""
    return {"model": model, "weight_version": version,
            "choices": [{"index": i, "token_ids": ids, "log_probs": lps, "finish_reason": reason}
                        for i, (ids, lps, reason) in enumerate(choices)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sum(len(c[0]) for c in choices)}}
