"""How much of the return variance a critic can explain on a built-in task, and how much ours does.

1. Value pretraining alone (`vapo-mcp pretrain-value`'s code path) from the warm-started policy of the preset,
   for each critic learning rate × warm-up × passes given; the held-out explained variance of every round
   (measured on a fresh rollout *before* the critic trains on it) is the curve.
2. The ceiling, on held-out prompts (`--prompts` × `--group` responses of the same initial policy): at every line
   start and right after every line's sign (the decision a noisy warm start gets wrong), the Monte-Carlo value
   of the state — the mean reward of `--continuations` continuations sampled from it — and the critic's value,
   both against the response's return. EV is pooled over all states of a kind (never averaged per response),
   overall and within prompt groups (what a per-prompt baseline leaves to explain). The true value function's
   EV, the ceiling any critic can reach, is the Monte-Carlo values' EV with their sampling noise taken out.

    .venv/bin/python -m bench.experiments.critic [--preset chain-noisy-sft] [--lrs 1e-3] [--epochs 4] [--rounds 4,20]
                                     [--prompts 32 --group 4 --continuations 8] [--smoke] [--out DIR]

Every sweep run's critic is measured against the same states and the same Monte-Carlo values; with the
defaults the 4-round critic is the one the paired ablation's rows share for seed 1 (same seed, prompts and
updates: value-pretraining draws come from their own stream).
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from bench.lib import plots
from bench.lib.records import REPO, load_avg, write_record
from bench.lib.runs import settings_with_seed


def sweep_run(preset: str, lr: float, warmup: int, epochs: int, rounds: int, extra: list[str], tmp: Path) -> dict:
    """One value-only run; returns its per-round held-out EV curve and the saved value model's path."""
    from vapo_engine.config import load_config
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    over = [f"vapo.value_learning_rate={lr}", f"training.warmup_steps={warmup}",
            f"vapo.value_pretrain_steps={rounds}", "vapo.value_pretrain_patience=0",
            f"vapo.value_pretrain_epochs={epochs}", *extra]
    cfg = load_config(REPO / "config.toml", over, preset=preset)
    info = create_run(cfg, settings_with_seed(1), tmp, run_id=f"lr{lr}-w{warmup}-e{epochs}-r{rounds}", overrides=over,
                      preset=preset,
                      extra={"mode": "value_pretrain"})
    t0 = time.perf_counter()
    summary = train(info.run_dir, log=lambda m: None)
    from vapo_engine.rundir import RunDir
    recs = [r for r in RunDir(info.run_dir).metrics() if r.get("kind") == "pretrain"]
    curve = [r.get("critic/pretrain_explained_var") for r in recs]
    finite = [x for x in curve if x is not None and math.isfinite(x)]
    return {"name": f"lr {lr:g}, {epochs} passes, {rounds} rounds", "lr": lr, "warmup": warmup, "epochs": epochs,
            "rounds": rounds, "curve": curve, "last3": sum(finite[-3:]) / max(1, len(finite[-3:])),
            "best": max(finite, default=None), "seconds": round(time.perf_counter() - t0, 1),
            "value_path": summary["value_path"], "breakdown_last": {k: v for k, v in (recs[-1] if recs else {}).items()
                                                                    if k.startswith("critic/pretrain_ev_")}}


def states_of(tok, resp: list[int]) -> list[tuple[int, str]]:
    """(b, kind) of the states measured in one response (b = tokens of it already written): "line" before each
    line (b = 0 and after every newline) and "decision" right after each line's sign (`a 47+8=55`: the 5th
    character), where a wrong copy of the sign has just been made. Built-in character tokenizer: one token per
    character."""
    chars = [tok.decode([t]) for t in resp]
    out, start = [(0, "line")], 0
    for k, c in enumerate(chars):
        if c == "\n":
            if start + 5 <= k:
                out.append((start + 5, "decision"))
            start = k + 1
            if start < len(resp):
                out.append((start, "line"))
    return sorted(out)


def mc_values(models, task, ro, problems, states, m: int, cfg, seed: int) -> list[float]:
    """Monte-Carlo value of each state (row, b): the mean reward of `m` continuations sampled from the policy at
    the run's temperature, each allowed the tokens the original response had left."""
    from vapo_engine.rollout.generate import generate
    from vapo_engine.trainer import streams
    tok, p, cap = models.tokenizer, ro.prompt_len, cfg.model.max_tokens
    resp = [ro.input_ids[i, p:p + int(ro.response_mask[i].sum())].tolist() for i in range(ro.size)]
    prompt = [ro.input_ids[i, :p][ro.attention_mask[i, :p].bool()].tolist() for i in range(ro.size)]
    order = sorted(range(len(states)), key=lambda k: states[k][1])
    rewards = [0.0] * len(states)
    chunk = max(1, 512 // m)
    for c0 in range(0, len(order), chunk):
        ks = order[c0:c0 + chunk]
        rows = [prompt[states[k][0]] + resp[states[k][0]][:states[k][1]] for k in ks for _ in range(m)]
        with streams.seeded(seed, "critic_ceiling", c0):
            gen = generate(models.policy, tok, None, prompt_ids=rows, max_new_tokens=cap - states[ks[0]][1],
                           temperature=cfg.model.temperature, top_p=cfg.model.top_p)
        lengths = gen.response_mask.sum(1).long().tolist()
        for j, k in enumerate(ks):
            i, b = states[k]
            total = 0.0
            for r in range(j * m, (j + 1) * m):
                cont = gen.response_ids[r, :min(lengths[r], cap - b)].tolist()
                total += task.reward(tok.decode(resp[i][:b] + cont, skip_special_tokens=True), problems[i].answer)
            rewards[k] = total / m
    return rewards


def ev_table(ret: list[float], preds: dict[str, list[float]], mc: list[float], groups: list[int], m: int) -> dict:
    """Explained variance of each critic (`preds`, by name) and of the Monte-Carlo values against the returns, pooled over the
    states given: overall and within prompt groups (each prompt's mean removed from returns and residuals: what
    a per-prompt baseline such as GRPO's leaves to explain). `ceiling` is the EV of the true value function,
    estimated from the m-sample Monte-Carlo values with their sampling noise taken out (E[(R − V̂)²] =
    E[(R − V)²] + E[V(1 − V)]/m, and V̂(1 − V̂)/(m − 1) estimates the last term without bias; within a group the
    group's mean of that noise is removed too, so (1 − 1/n) of it remains)."""
    size = {g: groups.count(g) for g in set(groups)}
    out = {"states": len(ret), "continuations": m}
    for name, within in (("overall", False), ("within_prompt", True)):
        ss = _sq(_centre(ret, groups, within))
        if ss <= 1e-12:
            out[name] = None
            continue
        noise = sum(v * (1 - v) / (m - 1) * ((1 - 1 / size[g]) if within else 1.0)
                    for v, g in zip(mc, groups)) if m > 1 else 0.0
        ev = {k: 1 - _sq(_centre([r - x for r, x in zip(ret, pred)], groups, within)) / ss
              for k, pred in (*preds.items(), ("monte_carlo", mc))}
        out[name] = {**ev, "ceiling": ev["monte_carlo"] + noise / ss}
    return out


def _centre(xs: list[float], groups: list[int], within: bool) -> list[float]:
    """`xs` minus their mean (within: minus the mean of their group)."""
    import statistics
    keys = groups if within else [0] * len(xs)
    means = {g: statistics.fmean([x for x, h in zip(xs, keys) if h == g]) for g in set(keys)}
    return [x - means[g] for x, g in zip(xs, keys)]


def _sq(xs: list[float]) -> float:
    return sum(x * x for x in xs)


def ceiling(preset: str, critics: dict[str, str], n_prompts: int, group: int, m: int, extra: list[str]) -> dict:
    """On held-out prompts (`group` responses each, the initial policy): each critic's values (`critics`: name →
    value model folder) and Monte-Carlo values (`m` continuations) at every line start and right after every sign,
    against the returns."""
    import torch

    from vapo_engine.config import load_config
    from vapo_engine.rollout.experience import response_log_probs, response_values, sample_rollout
    from vapo_engine.rollout.value_head import saved_head
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer import streams
    from vapo_engine.trainer.models import load_models, pick_device, resolve_model_path
    cfg = load_config(REPO / "config.toml", extra, preset=preset)
    task = get_task(cfg.data.train)
    base = resolve_model_path(cfg.model.local_path, task=cfg.model.builtin or cfg.data.train)
    load = (lambda path: load_models(base, value_path=path, need_value=True, reference_path=None,
                                     value_head=saved_head(path),
                                     device=pick_device("cpu"), autocast_dtype=None))
    models = load(next(iter(critics.values())))
    problems = [q for q in task.heldout(n_prompts) for _ in range(group)]
    with streams.seeded(1, "critic_rollout", 0):
        ro = sample_rollout(models, task, problems, max_new_tokens=cfg.model.max_tokens,
                            temperature=cfg.model.temperature, top_p=cfg.model.top_p)
    with torch.no_grad():  # a surprise head reads the policy's log-probs of the written tokens
        lp = response_log_probs(models.policy, ro)[0]
        values = {name: response_values(load(path).value, ro, lp) for name, path in critics.items()}
    p = ro.prompt_len
    states = [(i, b, kind) for i in range(ro.size)
              for b, kind in states_of(models.tokenizer, ro.input_ids[i, p:p + int(ro.response_mask[i].sum())].tolist())]
    t0 = time.perf_counter()
    mc = mc_values(models, task, ro, problems, [(i, b) for i, b, _ in states], m, cfg, seed=1)
    seconds = time.perf_counter() - t0
    ret = [float(ro.scores[i]) for i, _, _ in states]
    crit = {name: [float(v[i, b]) for i, b, _ in states] for name, v in values.items()}
    grp = [i // group for i, _, _ in states]
    by_kind = {}
    for kind in ("all", "line", "decision"):
        sel = [k for k, (_, _, c) in enumerate(states) if kind in ("all", c)]
        if len(sel) < 2:
            continue
        by_kind[kind] = ev_table([ret[k] for k in sel], {n: [c[k] for k in sel] for n, c in crit.items()},
                                 [mc[k] for k in sel], [grp[k] for k in sel], m)
    return {"prompts": n_prompts, "group": group, "responses": ro.size, "continuations": m, "critics": list(critics),
            "accuracy": float(ro.correct.float().mean()), "mean_response_length": float(ro.lengths.float().mean()),
            "monte_carlo_seconds": round(seconds, 1), "ev": by_kind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="chain-noisy-sft")
    ap.add_argument("--lrs", default="1e-3", help="critic learning rates to sweep")
    ap.add_argument("--warmups", default="5", help="warm-up optimizer steps to sweep (5: the chain presets')")
    ap.add_argument("--epochs", default="4", help="passes over each value-pretraining rollout to sweep")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    ap.add_argument("--rounds", default="4,20", help="value-pretraining rounds of the sweep runs (comma-separated)")
    ap.add_argument("--prompts", type=int, default=32, help="held-out prompts of the ceiling comparison")
    ap.add_argument("--group", type=int, default=4, help="responses per held-out prompt")
    ap.add_argument("--continuations", type=int, default=8, help="Monte-Carlo continuations per state")
    ap.add_argument("--smoke", action="store_true", help="seconds: 2 rounds, one setting, small batches (tests)")
    ap.add_argument("--out", help="folder for the JSON record and plot (default bench/results)")
    ap.add_argument("--name", default="critic", help="record name (bench/results/NAME.json)")
    a = ap.parse_args()
    lrs = [float(x) for x in a.lrs.split(",")] if not a.smoke else [1e-3]
    warmups = [int(x) for x in a.warmups.split(",")] if not a.smoke else [0]
    epochs = [int(x) for x in a.epochs.split(",")] if not a.smoke else [1]
    rounds = [2] if a.smoke else [int(x) for x in a.rounds.split(",")]
    extra = [*a.set, *(["training.batch_size=16", "training.mini_batch_size=16", "eval.num_problems=4",
                        "model.max_tokens=40"] if a.smoke else [])]
    sizes = (2, 2, 3) if a.smoke else (a.prompts, a.group, a.continuations)
    t0, load0 = time.perf_counter(), load_avg()
    with tempfile.TemporaryDirectory(prefix="vapo-critic-") as tmp:
        runs = []
        for n in rounds:
            for lr in lrs:
                for w in warmups:
                    for e in epochs:
                        r = sweep_run(a.preset, lr, w, e, n, extra, Path(tmp))
                        print(f"{r['name']}: held-out EV last3 {r['last3']:.3f} best {r['best']} "
                              f"({r['seconds']:.0f}s)", flush=True)
                        runs.append(r)
        best = max(runs, key=lambda r: r["last3"])
        top = ceiling(a.preset, {r["name"]: r["value_path"] for r in runs}, *sizes, extra)
    for kind, t in top["ev"].items():
        for scope in ("overall", "within_prompt"):
            row = t.get(scope)
            if row:
                print(f"  {kind:8} {scope:13} " + "  ".join(f"{k} {v:+.3f}" for k, v in row.items())
                      + f"  ({t['states']} states)")
    record = {"config": {"preset": a.preset, "rounds": rounds, "smoke": a.smoke, "lrs": lrs, "warmups": warmups,
                         "epochs": epochs, "overrides": extra, "prompts": sizes[0], "group": sizes[1],
                         "continuations": sizes[2]},
              "sweep": [{k: v for k, v in r.items() if k != "value_path"} for r in runs],
              "best": {"lr": best["lr"], "warmup": best["warmup"], "epochs": best["epochs"], "last3": best["last3"]},
              "ceiling": top, "wall_s_total": round(time.perf_counter() - t0, 1),
              "load_avg_start": load0, "load_avg_end": load_avg()}
    path = write_record(a.name, record, Path(a.out) if a.out else None)
    _plot(runs, top, path.with_suffix(".png"))
    print(f"record: {path}")


def _plot(runs: list[dict], top: dict, path: Path) -> None:
    plt = plots.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        a.plot(range(1, len(r["curve"]) + 1), [x if x is not None else float("nan") for x in r["curve"]],
               label=r["name"])
    a.set_xlabel("value-pretraining round")
    a.set_ylabel("held-out explained variance")
    a.legend(fontsize=7)
    a.grid(alpha=0.3)
    bars = [(f"{k}\n{s.replace('_', ' ')}", t[s]) for k, t in top["ev"].items() for s in ("overall", "within_prompt")
            if t.get(s)]
    xs = range(len(bars))
    keys = [*top["critics"], "monte_carlo", "ceiling"]
    width = 0.8 / len(keys)
    for j, key in enumerate(keys):
        label = {"monte_carlo": f"Monte-Carlo ({top['continuations']} continuations)",
                 "ceiling": "ceiling (noise removed)"}.get(key, f"critic: {key}")
        b.bar([x + (j - (len(keys) - 1) / 2) * width for x in xs], [row[key] for _, row in bars], width, label=label)
    b.set_xticks(list(xs), [n for n, _ in bars], fontsize=7)
    b.set_ylabel("explained variance vs returns")
    b.legend(fontsize=7)
    b.grid(alpha=0.3, axis="y")
    plots.save(fig, path)


if __name__ == "__main__":
    main()
