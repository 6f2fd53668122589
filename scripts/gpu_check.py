"""GPU self-check (docs/scale-out.md "Not built yet, and not run yet"): does this machine train? One printed table, one row per check, for the first
machine with a GPU; `--device cpu` runs the same checks on the CPU (gloo), which is how the script is tested.

Each check runs its engine job in a child process (scripts/gpu_step.py), so an error, an out-of-memory or a
poisoned CUDA context becomes one failed row and the other checks still run; this process never touches CUDA.
  env     torch / transformers / CUDA versions, devices, bf16 support, nccl available, one bf16 matmul on the GPU
  run     a short `vapo-mcp train`-equivalent run on the tiny model (config.toml + cpu-demo + 8 policy steps =
          2 rollout steps of 128 responses, 1 value-pretraining round, 16 held-out problems): seconds per rollout
          step, generation tokens/s (`rollout/tokens_per_s`), peak memory. model.dtype stays "auto" (bf16
          autocast on a GPU that has it)
  bf16    one rollout step with model.dtype = "bfloat16": losses and gradient norms finite, and the old log-probs
          under bf16 autocast vs the same rows without autocast (fp32): mean |Δ log p| over response tokens
          ≤ 0.1 nats (loose on purpose; the max is reported, not judged). n/a on CPU unless `--checks` names it
  parity  one rollout step in one process vs 2 processes (torchrun; ddp, and fsdp = FSDP2 `fully_shard`), with
          tests/test_distributed.py's EXACT overrides (greedy decoding: every world samples the same batch) in
          fp32 and a value model with a random head (else a batch with equal rewards has all-zero gradients and
          the comparison proves nothing): the gathered policy and value gradients and the step metrics agree;
          peak memory per rank. nccl on CUDA (2 devices needed: one per rank), gloo on CPU. Tolerance rtol 1e-4
          on CPU (as the tests), 1e-3 on CUDA: nccl's reduction order and the cuBLAS kernels picked per batch
          shape differ from one process. With --quick both 2-process steps share one launch (ddp, then fsdp, each
          with its own output: a crash in fsdp still leaves the ddp row); on the CPU the fsdp row's peak RSS is
          then that of the process so far (it includes the ddp step's)
  model   with --model PATH: the short run on that local HF model (built-in addition task, 2 rollout steps of 32
          responses, ≤ 64 new tokens, micro-batches of 4): that it runs, step time, tokens/s, peak memory
  engine  where vLLM (or SGLang) is installed: its server on the tiny model (or --model-dir DIR when it cannot
          load that), 5 steps with rollout.backend = "vllm" vs 5 with "hf": log-prob agreement (max |Δ|), the
          weight versions, step time and tokens/s side by side (scripts/gpu_engine_check.py); a skip row without
          the engine or on the CPU

    python -m scripts.gpu_check                     # on a GPU box; exit 0 = no check failed
    python -m scripts.gpu_check --model /models/Qwen2.5-0.5B-Instruct --json gpu_check.json
    OMP_NUM_THREADS=1 .venv/bin/python -m scripts.gpu_check --device cpu   # every check on CPU / gloo
    .venv/bin/python -m scripts.gpu_check --device cpu --quick --tiny-model DIR   # env + parity only (the tests)

Without CUDA (and without --device cpu) it prints one line and exits 0; exit 1 when a check failed. Peak memory
is torch.cuda.max_memory_allocated on CUDA and the process's peak RSS on CPU. Run directories live in a
temporary folder that is deleted at the end (the short runs write one checkpoint each); the children's output
and every traceback go to the log file named under the table. Not a test and not a benchmark record: it judges
pass / fail, and its numbers are one run's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.lib import records
from bench.lib.runs import PRESET, load_bench_config, settings_with_seed
from scripts import gpu_engine_check

STEP = "scripts.gpu_step"  # the child's module, run from the repository root
SKIPPED = "no CUDA device: GPU self-check skipped (run with --device cpu to exercise the checks on CPU/gloo)"
CHECKS = ("env", "run", "bf16", "parity", "model", "engine")
QUICK = ("env", "parity")
RUN_STEPS, QUICK_STEPS, MODEL_STEPS = 8, 2, 4  # policy steps (cpu-demo: 4 per rollout step; quick: 1; model: 2)
RUN = (f"training.total_steps={RUN_STEPS}", "vapo.value_pretrain_steps=1", "eval.num_problems=16",
       "eval.samples_per_problem=1", "eval.eval_interval=1000", "eval.save_interval=1000")
QUICK_RUN = RUN + (f"training.total_steps={QUICK_STEPS}", "training.batch_size=16", "vapo.group_size=4",
                   "training.mini_batch_size=16", "model.max_tokens=16", "eval.num_problems=4")
# tests/test_distributed.py EXACT + tests/engine_helpers.py FAST but cpu-demo's 40 new tokens (at 10 the
# built-in model's answers are cut off: reward 0 everywhere), in fp32 (bf16 has its own row)
PARITY = ("model.temperature=0", "training.batch_size=8", "vapo.group_size=2", "training.mini_batch_size=8",
          "training.micro_batch_size=2", "vapo.positive_replay=false", "vapo.value_pretrain_steps=1",
          "eval.num_problems=4", "eval.samples_per_problem=1", "training.total_steps=3", 'model.dtype="float32"')
MODEL_RUN = (f"training.total_steps={MODEL_STEPS}", "training.batch_size=32", "vapo.group_size=4",
             "training.mini_batch_size=16", "training.micro_batch_size=4", "model.max_tokens=64",
             "vapo.value_pretrain_steps=1", "eval.num_problems=8", "eval.samples_per_problem=1",
             "eval.eval_interval=1000", "eval.save_interval=1000", 'data.train="builtin:addition"',
             'eval.benchmark="builtin:addition"')
STEP_METRICS = ("actor/pg_loss", "critic/value_loss", "rollout/reward_mean", "rollout/response_length",
                "vapo/advantage_std", "actor/grad_norm", "critic/grad_norm", "actor/pg_clipfrac",
                "actor/positive_nll", "vapo/lambda_policy_mean", "actor/entropy")
FINITE = ("actor/pg_loss", "critic/value_loss", "actor/grad_norm", "critic/grad_norm")


class CheckFailed(Exception):
    """A check's own verdict: the short reason is the whole story (no traceback in the table)."""


@dataclass
class Row:
    check: str
    result: str
    numbers: str = ""
    status: str = "pass"  # pass | FAIL | skip
    data: dict = field(default_factory=dict)


@dataclass
class Ctx:
    cuda: bool
    args: argparse.Namespace
    work: Path
    log: Path
    env: dict
    info: dict = field(default_factory=dict)  # the env check's findings
    cache: dict = field(default_factory=dict)

    @property
    def base(self) -> tuple[str, ...]:
        """Device and (unless the built-in one) the tiny model of every tiny-model check."""
        tiny = (f"model.local_path={json.dumps(self.args.tiny_model)}",) if self.args.tiny_model else ()
        return (f'training.device="{"cuda" if self.cuda else "cpu"}"', *tiny)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the checks train")
    p.add_argument("--model", default=None, help="a local Hugging Face model directory for the `model` check")
    p.add_argument("--engine", choices=("vllm", "sglang"), default=None,
                   help="the inference engine of the engine check (default: vLLM if installed, else SGLang)")
    p.add_argument("--model-dir", default=None, help="a local Hugging Face model folder for the engine check "
                   "when the engine cannot load the built-in tiny model")
    p.add_argument("--tiny-model", default=None, help="model directory of the tiny checks (default: built-in)")
    p.add_argument("--checks", default=None, help=f"comma list of {','.join(CHECKS)} (default: all that apply)")
    p.add_argument("--quick", action="store_true", help=f"only {','.join(QUICK)}, tiny shapes (seconds; tests)")
    p.add_argument("--json", default=None, help="write the table and machine info as JSON to this file")
    p.add_argument("--log", default=None, help="log file of the children's output (default: a temp file)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per child process")
    return p.parse_args(argv)


def selected(args) -> tuple[str, ...]:
    if args.checks:
        names = tuple(x.strip() for x in args.checks.split(",") if x.strip())
        bad = [n for n in names if n not in CHECKS]
        if bad:
            raise SystemExit(f"unknown check(s) {bad}; valid: {', '.join(CHECKS)}")
        return names
    return tuple(n for n in (QUICK if args.quick else CHECKS) if n != "model" or args.model)


# ---- children -------------------------------------------------------------------------------------------------

def make_run(ctx: Ctx, name: str, overrides: tuple[str, ...]) -> Path:
    """A run directory like `vapo-mcp train --preset cpu-demo --set …` makes (config.toml + preset + overrides)."""
    from vapo_engine.runs import create_run
    config, over = load_bench_config("vapo", overrides)
    return create_run(config, settings_with_seed(1), ctx.work / "runs", run_id=name, overrides=over,
                      preset=PRESET).run_dir


def child(ctx: Ctx, name: str, mode: str, arg: str, procs: int = 1, out: Path | None = None,
          more: tuple[str, ...] = ()) -> Path:
    """Run one scripts/gpu_step.py job (under torchrun with 2 processes when asked; `more`: further arguments,
    e.g. RUN_DIR OUT pairs of `step`); its output goes to the log. Returns the output path; raises CheckFailed
    with the child's last error line when it fails."""
    out = out or ctx.work / f"{name}.{'pt' if mode == 'step' else 'json'}"
    cmd = [sys.executable, "-m", STEP, mode, arg, str(out), *more]
    if procs > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
    t0, out_file = time.perf_counter(), ctx.work / f"{name}.out"
    with out_file.open("w", encoding="utf-8") as f:  # a file, not a pipe: an orphaned rank cannot hang us
        p = subprocess.Popen(cmd, cwd=records.REPO, env=ctx.env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            p.wait(timeout=ctx.args.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            end_tree(p)
            timed_out = True
    text = out_file.read_text(encoding="utf-8", errors="replace")
    with ctx.log.open("a", encoding="utf-8") as f:
        f.write(f"\n===== {name} ({time.perf_counter() - t0:.1f} s, exit {p.returncode}): {' '.join(cmd)}\n{text}")
    if timed_out:
        raise CheckFailed(f"{name}: timed out after {ctx.args.timeout} s")
    if p.returncode != 0 or not out.exists():
        raise CheckFailed(f"{name}: exit {p.returncode}: {last_error(text)}")
    return out


def end_tree(p: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop a child and everything it started: SIGTERM first (torchrun forwards it to its ranks), then SIGKILL
    to every descendant found before, since torchrun starts each rank in a session of its own (the child's
    process group does not hold them)."""
    tree = descendants(p.pid)
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in [p.pid, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    p.wait()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc; empty where there is none)."""
    kids: dict[int, list[int]] = {}
    proc = Path("/proc")
    for d in proc.iterdir() if proc.is_dir() else ():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) if d.name.isdigit() else None
        except (OSError, IndexError, ValueError):
            continue
        if ppid is not None:
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        found = kids.get(todo.pop(), [])
        out += found
        todo += found
    return out


def last_error(text: str) -> str:
    """The line that names the error: the last `SomethingError: …` a rank printed (torchrun's own summary
    is skipped), else the last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ("Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0])
            and "ChildFailedError" not in ln and not ln.startswith(("[", "error_file", "traceback"))]
    return short((errs or lines or ["no output"])[-1])


def short(text: str, n: int = 140) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def num(x, spec: str) -> str:
    return "?" if x is None else format(x, spec)


def mem(m: dict | None) -> str:
    if not m:
        return "?"
    return f"{m['peak_mib']:.0f} MiB" + (" (cuda alloc)" if m.get("kind") == "cuda" else " (RSS)")


# ---- checks ---------------------------------------------------------------------------------------------------

def check_env(ctx: Ctx) -> list[Row]:
    info = ctx.info = read_json(child(ctx, "env", "env", "-"))
    devs = ", ".join(f"{d['name']} ({d['memory_gib']} GiB, sm {d['capability']})" for d in info["devices"]) or "none"
    nums = (f"torch {info['torch']}, transformers {info['transformers']}, CUDA build {info['cuda_build']}; "
            f"{info['device_count']} device(s): {devs}; bf16 {info['bf16_supported']}; nccl "
            f"{info['nccl_available']}{' ' + info['nccl_version'] if info['nccl_version'] else ''}")
    if not ctx.cuda:
        return [Row("environment", "CPU (CUDA hidden from the checks)", nums, data=info)]
    if info["device_count"] < 1 or not info["bf16_matmul_ok"]:
        raise CheckFailed(f"CUDA visible but unusable: {info['device_count']} devices, bf16 matmul "
                          f"{info['bf16_matmul_ok']}")
    return [Row("environment", f"{info['device_count']} CUDA device(s), bf16 matmul ok", nums, data=info)]


def run_row(check: str, run: Path, out: Path, total_steps: int) -> Row:
    """The row of a short training run: its summary, the last rollout step's timing, the child's peak memory."""
    from vapo_engine.rundir import RunDir
    res = read_json(out)
    train = [r for r in RunDir(run).metrics() if r.get("kind") == "train"]
    if not train:
        raise CheckFailed("the run wrote no training step")
    last, s = train[-1], res["summary"]
    data = {"steps": s.get("steps"), "rollout_steps": len(train), "wall_s": res["wall_s"], "memory": res["memory"],
            "last_step_time_s": last.get("perf/step_time_s"), "tokens_per_s": last.get("rollout/tokens_per_s"),
            "mean_step_time_s": sum(r.get("perf/step_time_s", math.nan) for r in train) / len(train),
            "response_length": last.get("rollout/response_length"),
            "final_greedy": s.get("final_eval", {}).get("eval/greedy_accuracy"), "model": s.get("model")}
    nums = (f"{len(train)} rollout steps: last {num(data['last_step_time_s'], '.2f')} s/step (mean "
            f"{num(data['mean_step_time_s'], '.2f')}), gen {num(data['tokens_per_s'], '.0f')} tok/s, resp len "
            f"{num(data['response_length'], '.1f')}; peak {mem(res['memory'])}; run {res['wall_s']:.0f} s")
    bad = [k for k in FINITE if not math.isfinite(float(last.get(k, math.nan)))]
    if s.get("status") != "succeeded" or s.get("steps") != total_steps or bad:
        return Row(check, f"status {s.get('status')}, {s.get('steps')}/{total_steps} steps, not finite: {bad}",
                   nums, "FAIL", data)
    acc = num(data["final_greedy"], ".2f")
    return Row(check, f"{total_steps} policy steps ok, final greedy acc {acc}", nums, data=data)


def check_run(ctx: Ctx) -> list[Row]:
    over, steps = (QUICK_RUN, QUICK_STEPS) if ctx.args.quick else (RUN, RUN_STEPS)
    run = make_run(ctx, "run", ctx.base + over)
    return [run_row("short run, tiny model", run, child(ctx, "run", "train", str(run)), steps)]


def check_model(ctx: Ctx) -> list[Row]:
    path = ctx.args.model
    if not path:
        return [Row("short run, --model", "skipped: no --model PATH given", status="skip")]
    device = f'training.device="{"cuda" if ctx.cuda else "cpu"}"'
    run = make_run(ctx, "model", (device, f"model.local_path={json.dumps(path)}", *MODEL_RUN))
    row = run_row(f"short run, {Path(path).name}", run, child(ctx, "model", "train", str(run)), MODEL_STEPS)
    row.result += f" ({path})"
    return [row]


def check_bf16(ctx: Ctx) -> list[Row]:
    if not ctx.cuda and "bf16" not in (ctx.args.checks or ""):
        return [Row("bf16 autocast", "n/a on CPU", "checked on CUDA (--checks bf16 forces it here)", "skip")]
    if ctx.cuda and ctx.info.get("bf16_supported") is False:
        return [Row("bf16 autocast", "skipped: this GPU does not support bf16", status="skip")]
    run = make_run(ctx, "bf16", ctx.base + (QUICK_RUN if ctx.args.quick else RUN) + ('model.dtype="bfloat16"',))
    res = read_json(child(ctx, "bf16", "bf16", str(run)))
    m, d = res["metrics"], res["logprob_abs_diff_mean"]
    nums = (f"mean abs Δlogp bf16 vs fp32 {d:.2e} (max {res['logprob_abs_diff_max']:.2e}, {res['tokens']} tokens); "
            f"pg_loss {m.get('actor/pg_loss', math.nan):.4g}, value_loss {m.get('critic/value_loss', math.nan):.4g}; "
            f"step {res['step_s']:.2f} s; peak {mem(res['memory'])}")
    bad = [k for k in FINITE if not math.isfinite(m.get(k, math.nan))]
    if res["autocast"] != "torch.bfloat16" or bad or not d <= 0.1:
        return [Row("bf16 autocast", f"autocast {res['autocast']}, not finite: {bad}, mean abs Δlogp {d:.3g} "
                    "(limit 0.1)", nums, "FAIL", res)]
    return [Row("bf16 autocast", "step ran, losses finite, log-probs close to fp32", nums, data=res)]


STRATEGY = {"one": (), "ddp": (), "fsdp": ('distributed.strategy="fsdp"',)}


def parity_run(ctx: Ctx, name: str) -> Path:
    if "value" not in ctx.cache:  # a random value head: gradients even if every reward is equal (_gpu_step.py)
        ctx.cache["value"] = child(ctx, "value-head", "value", ctx.args.tiny_model or "-", out=ctx.work / "value")
    value = f"model.value_path={json.dumps(str(ctx.cache['value']))}"
    return make_run(ctx, f"parity-{name}", ctx.base + PARITY + (value, *STRATEGY[name]))


def parity_step(ctx: Ctx, name: str, procs: int) -> dict:
    """The step `name` (one, ddp, fsdp): from the shared launch when --quick made one, else its own launch."""
    out, error = ctx.cache.get("shared", {}).get(name, (None, None))
    if out is None:
        out = child(ctx, f"parity-{name}", "step", str(parity_run(ctx, name)), procs)
    elif not out.exists():
        raise error or CheckFailed(f"parity-{name}: the shared launch wrote no step")
    ranks = [read_json(p) for p in sorted(out.parent.glob(f"{out.name}.rank*.json"))]
    return {**torch.load(out, weights_only=True), "ranks": ranks}


def shared_launch(ctx: Ctx) -> None:
    """--quick: the ddp and the fsdp step in one 2-process launch (one torchrun less), ddp first; each step
    writes its own output, so a failure leaves the steps done before it (their rows are judged as usual)."""
    runs = {s: parity_run(ctx, s) for s in ("ddp", "fsdp")}
    outs = {s: ctx.work / f"parity-{s}.pt" for s in runs}
    error = None
    try:
        child(ctx, "parity-ddp+fsdp", "step", str(runs["ddp"]), 2, out=outs["ddp"],
              more=(str(runs["fsdp"]), str(outs["fsdp"])))
    except CheckFailed as e:
        error = e
    ctx.cache["shared"] = {s: (outs[s], error) for s in runs}


def compare(a: dict, ref: dict, cuda: bool) -> tuple[list[str], dict]:
    """Problems of `a` against `ref` (empty = equal within the tolerance) and the differences."""
    rtol, atol, matol = (1e-3, 1e-6, 1e-5) if cuda else (1e-4, 1e-7, 1e-6)
    problems, diffs = [], {}
    if not float(ref["grads"].abs().max()) > 0 or not float(ref["vgrads"].abs().max()) > 0:
        return ["the reference step's gradients are all zero: nothing to compare"], diffs
    for k in ("response_length", "reward_mean"):
        x, y = a["metrics"].get(f"rollout/{k}"), ref["metrics"].get(f"rollout/{k}")
        if x is None or y is None or not math.isclose(x, y, rel_tol=rtol, abs_tol=matol):
            return [(f"rollouts differ (rollout/{k} {x} vs {y}): greedy decoding not identical, gradients not "
                    "comparable")], diffs
    for k in ("grads", "vgrads"):
        g, r = a[k], ref[k]
        if g.shape != r.shape:
            problems.append(f"{k}: {tuple(g.shape)} vs {tuple(r.shape)} elements")
            continue
        diffs[k] = {"max_abs_diff": float((g - r).abs().max()) if g.numel() else 0.0,
                    "max_abs": float(r.abs().max()) if r.numel() else 0.0}
        if not torch.allclose(g, r, rtol=rtol, atol=atol):
            problems.append(f"{k} max abs Δ {diffs[k]['max_abs_diff']:.2e} over rtol {rtol:g}")
    for k in STEP_METRICS:
        x, y = a["metrics"].get(k), ref["metrics"].get(k)
        if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=rtol, abs_tol=matol)):
            problems.append(f"{k} {x} vs {y}")
    return problems, diffs


def parity_row(ctx: Ctx, strategy: str, refs: dict[str, dict]) -> Row:
    check = f"2-proc parity, {strategy}"
    got = ctx.cache[strategy] = parity_step(ctx, strategy, 2)
    problems, data = [], {"tolerance_rtol": 1e-3 if ctx.cuda else 1e-4, "ranks": got["ranks"]}
    for ref_name, ref in refs.items():
        p, data[f"vs_{ref_name}"] = compare(got, ref, ctx.cuda)
        problems += [f"vs {ref_name}: {x}" for x in p]
    pol, val = data["vs_one"].get("grads", {}), data["vs_one"].get("vgrads", {})
    ranks = ", ".join(mem(r["memory"]) for r in got["ranks"])
    nums = (f"vs 1 proc: policy grads max abs Δ {pol.get('max_abs_diff', math.nan):.1e} (of max "
            f"{pol.get('max_abs', math.nan):.1e}), value grads max abs Δ {val.get('max_abs_diff', math.nan):.1e}; "
            f"peak per rank {ranks} (1 proc {mem(refs['one']['ranks'][0]['memory'])}); step "
            f"{max(r['step_s'] for r in got['ranks']):.2f} s; rtol {data['tolerance_rtol']:g}")
    backend = "nccl" if ctx.cuda else "gloo"
    if problems:
        return Row(check, short(f"{backend}: " + "; ".join(problems)), nums, "FAIL", data)
    return Row(check, f"{backend}: grads + metrics equal 1 proc{' and ddp' if 'ddp' in refs else ''}", nums, data=data)


def check_parity(ctx: Ctx) -> list[Row]:
    if ctx.cuda and ctx.info.get("device_count", 0) < 2:
        why = f"skipped: nccl needs one CUDA device per rank, found {ctx.info.get('device_count', 0)}"
        return [Row(f"2-proc parity, {s}", why, status="skip") for s in ("ddp", "fsdp")]
    if ctx.cuda and not ctx.info.get("nccl_available"):
        raise CheckFailed("torch.distributed.is_nccl_available() is False in this torch build")
    try:
        one = parity_step(ctx, "one", 1)
    except Exception as e:
        raise CheckFailed(f"one-process reference failed: {e}") from e
    if ctx.args.quick:
        shared_launch(ctx)
    rows = [guarded(ctx, "2-proc parity, ddp", lambda: [parity_row(ctx, "ddp", {"one": one})])[0]]
    refs = {"one": one, **({"ddp": ctx.cache["ddp"]} if "ddp" in ctx.cache else {})}
    return rows + guarded(ctx, "2-proc parity, fsdp", lambda: [parity_row(ctx, "fsdp", refs)])


def guarded(ctx: Ctx, check: str, fn) -> list[Row]:
    """fn()'s rows, or one failed row with the short reason (the traceback goes to the log)."""
    print(f"[gpu_check] {check} …", file=sys.stderr, flush=True)
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - every failure becomes a row; the others still run
        with ctx.log.open("a", encoding="utf-8") as f:
            f.write(f"\n===== {check} failed\n{traceback.format_exc()}")
        reason = str(e) if isinstance(e, CheckFailed) else f"{type(e).__name__}: {e}"
        return [Row(check, short(reason), status="FAIL")]


FUNCS = {"env": ("environment", check_env), "run": ("short run, tiny model", check_run),
         "bf16": ("bf16 autocast", check_bf16), "parity": ("2-proc parity", check_parity),
         "model": ("short run, --model", check_model),
         "engine": ("rollout engine", lambda ctx: gpu_engine_check.check_engine(ctx, sys.modules[__name__]))}


# ---- output ---------------------------------------------------------------------------------------------------

def table(rows: list[Row], title: str) -> str:
    lines = [title, "", "| check | result | numbers | status |", "|---|---|---|---|"]
    cell = (lambda text: str(text).replace("|", "\\|"))  # a reason may hold a pipe: keep the columns
    lines += [f"| {cell(r.check)} | {cell(r.result)} | {cell(r.numbers)} | {r.status} |" for r in rows]
    return "\n".join(lines)


def write_json(path: Path, rows: list[Row], ctx: Ctx, wall: float) -> None:
    record = {"benchmark": "gpu_check", "command": records.command_line(), "machine": records.machine_info(),
              "gpu": {k: ctx.info.get(k) for k in ("cuda_build", "device_count", "devices", "bf16_supported",
                                                    "nccl_available", "nccl_version")},
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": "cuda" if ctx.cuda else "cpu",
              "passed": not any(r.status == "FAIL" for r in rows), "wall_s": round(wall, 1), "log": str(ctx.log),
              "load_avg": records.load_avg(), "rows": [asdict(r) for r in rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print(SKIPPED)
        return 0
    names, t0 = selected(args), time.perf_counter()
    log = Path(args.log or tempfile.mkstemp(prefix="gpu_check-", suffix=".log")[1])
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU checks stay on the CPU even on a GPU box
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        ctx = Ctx(cuda, args, Path(tmp), log, env)
        for name in names:
            label, fn = FUNCS[name]
            rows += guarded(ctx, label, lambda fn=fn: fn(ctx))
    devs = ", ".join(d["name"] for d in ctx.info.get("devices", [])) or "CPU"
    print(table(rows, f"GPU self-check on {args.device} ({devs}; torch {torch.__version__}), "
                      f"{time.perf_counter() - t0:.0f} s"))
    print(f"\nlog (children's output, tracebacks): {log}")
    if args.json:
        write_json(Path(args.json), rows, ctx, time.perf_counter() - t0)
        print(f"wrote {args.json}")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
