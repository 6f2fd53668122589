"""The vLLM and SGLang adapters' request / response translation, against loopback servers that answer in those
engines' documented shapes (no vLLM or SGLang here). Behind each stand-in is the project's reference sampler
(`serving.rollout_service`) on the tiny model, so the numbers are real: what the adapter turns the engine's
answer into must be token for token and log-prob for log-prob what the trainer recomputes, and a weight push
must reach the stand-in through the engine's own reload routes."""
from __future__ import annotations

import random

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.engine_helpers import make_run, pushed_remote_policy
from tests.mcp_helpers import uvicorn_in_thread
from vapo_engine.metrics import read_metrics
from vapo_engine.serving.rollout_protocol import GenerateRequest


def reference(model_dir, root):
    from vapo_engine.serving.model import load_served_model
    from vapo_engine.serving.rollout_service import RolloutService
    return RolloutService(load_served_model(model_dir, "policy", device="cpu", dtype="float32"), weight_root=root)


def request_of(prompt, b, sampling) -> GenerateRequest:
    return GenerateRequest(prompt_ids=tuple(prompt), n=sampling["n"], max_tokens=sampling["max"],
                           temperature=sampling["temperature"], top_p=sampling["top_p"],
                           top_k=max(0, sampling["top_k"]), stop_token_ids=tuple(sampling["stop_token_ids"]),
                           seed=sampling["seed"])


def vllm_app(service, seen: list):
    state = {}

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "max_model_len": 512}]})

    async def completions(request: Request):
        b = await request.json()
        seen.append(b)
        out = service.generate(request_of(b["prompt"], b, {**b, "max": b["max_tokens"]}))
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "model": b["model"], "choices": [
            {"index": i, "text": "", "finish_reason": c["finish_reason"], "stop_reason": None,
             "logprobs": {"tokens": [f"token_id:{t}" for t in c["token_ids"]], "token_logprobs": c["log_probs"],
                          "top_logprobs": None, "text_offset": [0] * len(c["token_ids"])}}
            for i, c in enumerate(out["choices"])]})

    async def rpc(request: Request):
        b = await request.json()
        seen.append(b)
        if b["method"] == "update_config":
            state["path"] = b["args"][0]["model_config"]["model"]
        elif b["method"] == "reload_weights":
            service.load_weights(state["path"], service.version + 1)
        return JSONResponse({"results": [None]})

    async def reset(request: Request):
        seen.append("reset_prefix_cache")
        return Response(status_code=200)
    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"]),
                             Route("/collective_rpc", rpc, methods=["POST"]),
                             Route("/reset_prefix_cache", reset, methods=["POST"])])


def sglang_app(service, seen: list):
    async def info(request: Request):
        return JSONResponse({"model_path": "/models/policy", "is_generation": True})

    async def generate(request: Request):
        b = await request.json()
        seen.append(b)
        sp = b["sampling_params"]
        out = service.generate(request_of(b["input_ids"], b, {**sp, "max": sp["max_new_tokens"],
                                                               "seed": sp["sampling_seed"]}))
        answers = [{"text": "", "output_ids": c["token_ids"], "meta_info": {
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(c["log_probs"], c["token_ids"])],
            "finish_reason": {"type": c["finish_reason"]}, "weight_version": str(out["weight_version"])}}
            for c in out["choices"]]
        return JSONResponse(answers if len(answers) > 1 else answers[0])

    async def update(request: Request):
        b = await request.json()
        seen.append(b)
        service.load_weights(b["model_path"], int(b["weight_version"]))
        return JSONResponse({"success": True, "message": "Succeeded to update model weights."})

    async def flush(request: Request):
        seen.append("flush_cache")
        return PlainTextResponse("Cache flushed.")
    return Starlette(routes=[Route("/get_model_info", info), Route("/generate", generate, methods=["POST"]),
                             Route("/update_weights_from_disk", update, methods=["POST"]),
                             Route("/flush_cache", flush, methods=["POST"])])


APPS = {"vllm": vllm_app, "sglang": sglang_app}


@pytest.mark.parametrize("engine", list(APPS))
def test_adapter_answers_are_the_trainers_numbers(engine, tmp_path, model_dir):
    from vapo_engine.rollout.experience import attach_old_outputs, sample_rollout
    from vapo_engine.tasks import get_task
    seen: list = []
    with uvicorn_in_thread(APPS[engine](reference(model_dir, tmp_path), seen), log_level="warning") as port:
        models = pushed_remote_policy(model_dir, engine, [f"http://127.0.0.1:{port}"], tmp_path, version=1, seed=1)
        task = get_task("builtin:addition", tmp_path)
        problems = [p for p in task.train_batch(3, random.Random(0)) for _ in range(2)]
        ro = attach_old_outputs(models, sample_rollout(models, task, problems, max_new_tokens=8, temperature=0.7,
                                                       top_p=1.0), 6)
    mask = ro.response_mask.bool()
    assert ro.weight_version == 1 and mask.sum() > len(problems)
    assert (ro.sampler_log_probs - ro.old_log_probs)[mask].abs().max() <= 1e-4
    gens = [b for b in seen if isinstance(b, dict) and ("prompt" in b or "input_ids" in b)]
    assert len(gens) == 3  # one request per prompt, its 2 samples together
    if engine == "vllm":
        b = gens[0]
        assert (b["n"], b["logprobs"], b["top_k"], b["top_p"], b["temperature"]) == (2, 0, -1, 1.0, 0.7)
        assert b["return_tokens_as_token_ids"] and b["skip_special_tokens"] is False and b["stop_token_ids"]
        assert [x["method"] for x in seen if isinstance(x, dict) and "method" in x] == ["update_config",
                                                                                        "reload_weights"]
        assert "reset_prefix_cache" in seen
    else:
        sp = gens[0]["sampling_params"]
        assert gens[0]["return_logprob"] and sp["n"] == 2 and sp["top_k"] == -1 and sp["no_stop_trim"]
        assert any(isinstance(x, dict) and x.get("weight_version") == "1" for x in seen) and "flush_cache" in seen


def test_a_run_on_the_vllm_adapter_pushes_every_step(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    seen: list = []
    with uvicorn_in_thread(vllm_app(reference(model_dir, tmp_path), seen), log_level="warning") as port:
        run = make_run(tmp_path, model_dir, ['rollout.backend="vllm"', f'rollout.urls=["http://127.0.0.1:{port}"]',
                                             f'rollout.weights_dir="{tmp_path / "w"}"', "training.total_steps=2"])
        assert train(run, log=lambda m: None)["status"] == "succeeded"
    recs = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["rollout/weight_version"] for r in recs] == [0, 1]
    assert sum(1 for x in seen if isinstance(x, dict) and x.get("method") == "reload_weights") == 3  # 0, 1, 2
