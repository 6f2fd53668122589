"""The `engine` check of scripts/gpu_check.py: the vLLM or SGLang rollout backend against a real engine server.

Where CUDA and vLLM (or SGLang) are installed: start the engine's own OpenAI/HTTP server on the built-in tiny
model (a Qwen2 architecture; when the engine cannot load it, the row says why, and `--model-dir DIR` names a local
Hugging Face model folder to use instead), train 5 policy steps (one update per rollout step, so 5 weight
pushes) with `rollout.backend = "vllm"` (or "sglang") and 5 with `backend = "hf"`, same seed and shapes, and
report in the table: the log-prob agreement of the engine with the trainer (rollout/logprob_diff_max over the
steps, and the mean), the weight versions the rollouts were sampled with (they must be 0, 1, 2, 3, 4), and the
step time and generation tokens/s next to hf. Without the engine, or on the CPU, it is one `skip` row saying
so. The engine runs in a process group of its own and is stopped (with everything it started) at the end.

UNTESTED ON A GPU: written where no GPU, vLLM or SGLang was available; only its skip rows are tested
(tests/test_gpu_check.py). The launch commands are the ones docs/rollout-servers.md gives.
"""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

STEPS = 5
ENGINES = ("vllm", "sglang")
RUN = (f"training.total_steps={STEPS}", "training.batch_size=64", "training.mini_batch_size=64",
       "vapo.group_size=8", "vapo.value_pretrain_steps=1", "eval.num_problems=16", "eval.samples_per_problem=1",
       "eval.eval_interval=1000", "eval.save_interval=1000", "model.top_p=1.0")
START_TIMEOUT_S = 900


def installed_engine(wanted: str | None = None) -> str | None:
    """The engine to check: `wanted` if importable, else the first of vLLM, SGLang that is (None: neither)."""
    names = (wanted,) if wanted else ENGINES
    return next((n for n in names if importlib.util.find_spec(n) is not None), None)


def skip_reason(cuda: bool, engine: str | None, wanted: str | None = None) -> str | None:
    """Why the engine check cannot run here (one line), or None when it can."""
    if not cuda:
        return "n/a on CPU: vLLM and SGLang serve on CUDA (run scripts/gpu_check.py on a GPU machine)"
    if engine is None:
        what = wanted or "vLLM or SGLang"
        return (f"skipped: {what} is not installed in this environment (pip install vllm, or sglang[all]), so "
                "the engine rollout backend cannot be checked")
    return None


def launch_command(engine: str, model: Path, port: int) -> tuple[list[str], dict]:
    """The engine server's command line and extra environment (as docs/rollout-servers.md gives them)."""
    if engine == "vllm":
        return ([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port",
                 str(port), "--served-model-name", "policy", "--logprobs-mode", "processed_logprobs",
                 "--gpu-memory-utilization", "0.3", "--enforce-eager"], {"VLLM_SERVER_DEV_MODE": "1"})
    return ([sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port),
             "--mem-fraction-static", "0.3"], {})


def start_engine(ctx, engine: str, model: Path, end_tree) -> tuple[subprocess.Popen, str, str | None]:
    """Start the engine on `model`; (process, URL, None) once /health answers 200, or (process, URL, why not)."""
    from vapo_engine.rollout.backends.replicas import wait_until_healthy
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd, extra = launch_command(engine, model, port)
    out = ctx.work / f"engine-{engine}-{model.name}.out"
    with out.open("w", encoding="utf-8") as f:
        p = subprocess.Popen(cmd, env={**ctx.env, **extra}, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    why = wait_until_healthy(p, url, timeout_s=START_TIMEOUT_S, poll_s=2)
    if why is not None and p.poll() is None:
        end_tree(p)
    with ctx.log.open("a", encoding="utf-8") as f:
        f.write(f"\n===== engine {engine} on {model} ({why or 'up'}): {' '.join(cmd)}\n"
                f"{out.read_text(encoding='utf-8', errors='replace')}")
    return p, url, why


def check_engine(ctx, g) -> list:
    """The rows of the engine check; `g` is scripts.gpu_check (Row, make_run, child, end_tree, …)."""
    from vapo_engine.builtin_model import builtin_model_dir
    wanted = getattr(ctx.args, "engine", None)
    engine = installed_engine(wanted)
    why = skip_reason(ctx.cuda, engine, wanted)
    if why:
        return [g.Row("rollout engine", why, status="skip")]
    models = [Path(ctx.args.tiny_model or builtin_model_dir())]
    if getattr(ctx.args, "model_dir", None):
        models.append(Path(ctx.args.model_dir))
    failures = []
    for model in models:
        proc, url, why = start_engine(ctx, engine, model, g.end_tree)
        if why is None:
            try:
                return engine_rows(ctx, g, engine, model, url, failures)
            finally:
                g.end_tree(proc)
        failures.append(f"{engine} could not serve {model.name}: {why}: {g.last_error(_tail(ctx, engine, model))}")
    hint = "" if len(models) > 1 else "; pass --model-dir DIR (a local Hugging Face model folder) to use another"
    raise g.CheckFailed(g.short("; ".join(failures) + hint, 400))


def _tail(ctx, engine: str, model: Path) -> str:
    out = ctx.work / f"engine-{engine}-{model.name}.out"
    return out.read_text(encoding="utf-8", errors="replace")[-20000:] if out.is_file() else ""


def engine_rows(ctx, g, engine: str, model: Path, url: str, failures: list[str]) -> list:
    from vapo_engine.rundir import RunDir
    local = (f"model.local_path={json.dumps(str(model))}",)
    remote = (f'rollout.backend="{engine}"', f"rollout.urls={json.dumps([url])}",
              *(("rollout.model=\"policy\"",) if engine == "vllm" else ()))
    got = {}
    for name, extra in (("hf", ()), (engine, remote)):
        run = g.make_run(ctx, f"engine-{name}", (*ctx.base, *local, *RUN, *extra))
        res = g.read_json(g.child(ctx, f"engine-{name}", "train", str(run)))
        train = [r for r in RunDir(run).metrics() if r.get("kind") == "train"]
        got[name] = {"summary": res["summary"], "train": train}
    hf, eng = got["hf"]["train"], got[engine]["train"]
    versions = [int(r.get("rollout/weight_version", -1)) for r in eng]
    diff_max = max((r.get("rollout/logprob_diff_max", float("nan")) for r in eng), default=float("nan"))
    diff_mean = sum(r.get("rollout/logprob_diff_mean", float("nan")) for r in eng) / max(len(eng), 1)

    def per_step(rows, key):  # the first rollout step (compilation, warm-up) left out when there are others
        vals = [r[key] for r in rows if key in r][1:] or [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else float("nan")
    t_hf, t_eng = per_step(hf, "perf/step_time_s"), per_step(eng, "perf/step_time_s")
    tok_hf, tok_eng = per_step(hf, "rollout/tokens_per_s"), per_step(eng, "rollout/tokens_per_s")
    data = {"engine": engine, "model": str(model), "weight_versions": versions, "logprob_diff_max": diff_max,
            "logprob_diff_mean": diff_mean, "step_time_s": {"hf": t_hf, engine: t_eng},
            "tokens_per_s": {"hf": tok_hf, engine: tok_eng}, "not_loadable": failures}
    nums = (f"max |Δlogp| {diff_max:.2e} (mean {diff_mean:.2e}) vs the trainer; weight versions "
            f"{','.join(map(str, versions))}; {t_eng:.2f} s/step vs hf {t_hf:.2f} ({t_hf / t_eng:.2f}× hf's speed); "
            f"gen {tok_eng:.0f} vs hf {tok_hf:.0f} tok/s")
    label = f"rollout engine, {engine} ({model.name})"
    ok = all(got[n]["summary"].get("status") == "succeeded" and len(got[n]["train"]) == STEPS for n in got)
    problems = [] if ok else ["a run did not finish its 5 steps"]
    problems += [] if versions == list(range(STEPS)) else [f"weight versions {versions}, not 0..{STEPS - 1}"]
    problems += [] if diff_mean <= 0.1 else [f"mean |Δlogp| {diff_mean:.3g} over 0.1"]
    if failures:
        nums += f"; the built-in model was not loadable: {failures[0]}"
    if problems:
        return [g.Row(label, g.short("; ".join(problems)), nums, "FAIL", data)]
    return [g.Row(label, f"{STEPS} steps, versions advance every step, log-probs agree", nums, data=data)]

