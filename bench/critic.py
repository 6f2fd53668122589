"""How much of the return variance a critic can explain on a built-in task, and how much ours does.

1. Sweep (measured, not guessed): value pretraining alone (`vapo-mcp pretrain-value`'s code path) from the
   warm-started policy of the preset, for each critic learning rate × warm-up given, with the preset's
   mini-batches; the held-out explained variance of every round (measured on a fresh rollout *before* the
   critic trains on it) is the curve.
2. On one fresh batch of rollouts of the same initial policy, EV against Monte-Carlo returns of
   - the best critic of the sweep, and
   - a near-best value function: V*(prefix) = the policy's own probability of finishing on the reference
     solution from that prefix (teacher-forced, exact for temperature-1 sampling), and 0 once the prefix has
     left the reference (on builtin:chain a response off the reference path practically never ends right).
   Both by position quarter of the response and by response length, so the gap is a number, and where it is.

    .venv/bin/python bench/critic.py [--preset chain-demo] [--lrs 1e-4,3e-4,1e-3] [--warmups 0,10]
                                     [--rounds 30] [--eval-batch 256] [--smoke] [--out DIR]
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from common import REPO, load_avg, settings_with_seed, write_record


def sweep_run(preset: str, lr: float, warmup: int, epochs: int, rounds: int, extra: list[str], tmp: Path) -> dict:
    """One value-only run; returns its per-round held-out EV curve and the saved value model's path."""
    from vapo_engine.config import load_config
    from vapo_engine.runs import create_run
    from vapo_engine.trainer.loop import train
    over = [f"vapo.value_learning_rate={lr}", f"training.warmup_steps={warmup}",
            f"vapo.value_pretrain_steps={rounds}", "vapo.value_pretrain_patience=0",
            f"vapo.value_pretrain_epochs={epochs}", *extra]
    cfg = load_config(REPO / "config.toml", over, preset=preset)
    info = create_run(cfg, settings_with_seed(1), tmp, run_id=f"lr{lr}-w{warmup}-e{epochs}", overrides=over,
                      preset=preset,
                      extra={"mode": "value_pretrain"})
    t0 = time.perf_counter()
    summary = train(info.run_dir, log=lambda m: None)
    from vapo_engine.rundir import RunDir
    recs = [r for r in RunDir(info.run_dir).metrics() if r.get("kind") == "pretrain"]
    curve = [r.get("critic/pretrain_explained_var") for r in recs]
    finite = [x for x in curve if x is not None and math.isfinite(x)]
    return {"lr": lr, "warmup": warmup, "epochs": epochs, "curve": curve, "last3": sum(finite[-3:]) / max(1, len(finite[-3:])),
            "best": max(finite, default=None), "seconds": round(time.perf_counter() - t0, 1),
            "value_path": summary["value_path"], "breakdown_last": {k: v for k, v in (recs[-1] if recs else {}).items()
                                                                    if k.startswith("critic/pretrain_ev_")}}


def near_best_values(models, task, ro):
    """V*(state before response token t) per row: exp(Σ_{s≥t} log π(ref_s | ref_<s)) while the sampled prefix
    equals the reference, else 0. (N, R) like `ro.values`."""
    import torch

    from vapo_engine.rollout.experience import from_token_ids, response_log_probs
    tok, p = models.tokenizer, ro.prompt_len
    pairs, refs = [], []
    for i in range(ro.size):
        prompt_ids = ro.input_ids[i, :p][ro.attention_mask[i, :p].bool()].tolist()
        prompt = tok.decode(prompt_ids, skip_special_tokens=True)
        ref = tok(task.solve(prompt), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        pairs.append((prompt_ids, ref))
        refs.append(ref)
    ref_ro = from_token_ids(pairs, tok.pad_token_id, models.device)
    with torch.no_grad():
        lp, _ = response_log_probs(models.policy, ref_ro)
    lp = lp * ref_ro.response_mask
    suffix = lp.flip(1).cumsum(1).flip(1)  # S_t = Σ_{s ≥ t}
    out = torch.zeros_like(ro.response_mask)
    resp = ro.input_ids[:, p:]
    for i, ref in enumerate(refs):
        n = int(ro.response_mask[i].sum())
        k = 0
        while k < min(n, len(ref)) and int(resp[i, k]) == ref[k]:
            k += 1
        on = min(k + 1, n, len(ref))  # states before tokens 0..k are on the reference path
        out[i, :on] = suffix[i, :on].exp()
    return out


def compare(preset: str, value_path: str, batch: int, extra: list[str]) -> dict:
    """EV of the critic at `value_path` and of the near-best V* on one fresh batch of the initial policy."""
    from dataclasses import replace

    import torch

    from vapo_engine.algo import ev_from_stats, ev_stats
    from vapo_engine.config import load_config
    from vapo_engine.rollout.experience import response_values, sample_rollout
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer.advantages import monte_carlo_returns
    from vapo_engine.trainer.models import load_models, pick_device, resolve_model_path
    cfg = load_config(REPO / "config.toml", extra, preset=preset)
    task = get_task(cfg.data.train)
    models = load_models(resolve_model_path(cfg.model.local_path, task=cfg.model.builtin or cfg.data.train), value_path=value_path,
                         need_value=True, reference_path=None, device=pick_device("cpu"), autocast_dtype=None)
    torch.manual_seed(12345)
    problems = task.train_batch(batch // cfg.vapo.group_size, __import__("random").Random(777))
    ro = sample_rollout(models, task, [q for q in problems for _ in range(cfg.vapo.group_size)],
                        max_new_tokens=cfg.model.max_tokens, temperature=cfg.model.temperature, top_p=cfg.model.top_p)
    with torch.no_grad():
        critic = response_values(models.value, ro)
    mc = monte_carlo_returns(replace(ro, values=critic)).returns  # λ = γ = 1: the values do not enter
    star = near_best_values(models, task, ro)
    from vapo_engine.trainer.critic import LENGTH_BUCKETS
    mask = ro.response_mask
    lengths = mask.sum(1, keepdim=True)
    pos = (mask.cumsum(1) - 1).clamp(min=0) / lengths.clamp(min=1)
    parts = {"all": mask}
    parts |= {f"pos_q{q + 1}": mask * ((pos >= q / 4) & (pos < (q + 1) / 4)) for q in range(4)}
    parts |= {f"len_{b}": mask * ((lengths >= lo) & (lengths <= hi)) for b, lo, hi in LENGTH_BUCKETS}
    def ev(v, m):  # None where undefined (an empty bucket, constant returns): omitted, never a number
        x = float(ev_from_stats(ev_stats(v, mc, m.float())))
        return x if math.isfinite(x) else None
    rows = {name: {"critic": ev(critic, m), "near_best": ev(star, m)} for name, m in parts.items()}
    return {"batch": ro.size, "accuracy": float(ro.correct.float().mean()), "ev": rows,
            "mean_response_length": float(lengths.float().mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="chain-demo")
    ap.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3", help="critic learning rates to sweep")
    ap.add_argument("--warmups", default="0", help="warm-up optimizer steps to sweep")
    ap.add_argument("--epochs", default="1,4", help="passes over each value-pretraining rollout to sweep")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config override")
    ap.add_argument("--rounds", type=int, default=30, help="value-pretraining rounds per sweep run")
    ap.add_argument("--eval-batch", type=int, default=256, help="rollouts for the critic vs near-best comparison")
    ap.add_argument("--smoke", action="store_true", help="seconds: 2 rounds, one setting, small batches (tests)")
    ap.add_argument("--out", help="folder for the JSON record and plot (default bench/results)")
    a = ap.parse_args()
    lrs = [float(x) for x in a.lrs.split(",")] if not a.smoke else [1e-3]
    warmups = [int(x) for x in a.warmups.split(",")] if not a.smoke else [0]
    epochs = [int(x) for x in a.epochs.split(",")] if not a.smoke else [1]
    rounds = 2 if a.smoke else a.rounds
    extra = [*a.set, *(["training.batch_size=16", "training.mini_batch_size=16", "eval.num_problems=4"]
                       if a.smoke else [])]
    t0, load0 = time.perf_counter(), load_avg()
    with tempfile.TemporaryDirectory(prefix="vapo-critic-") as tmp:
        runs = []
        for lr in lrs:
            for w in warmups:
                for e in epochs:
                    r = sweep_run(a.preset, lr, w, e, rounds, extra, Path(tmp))
                    print(f"lr {lr:g} warmup {w} epochs {e}: held-out EV last3 {r['last3']:.3f} best {r['best']} "
                          f"({r['seconds']:.0f}s)", flush=True)
                    runs.append(r)
        best = max(runs, key=lambda r: r["last3"])
        cmp_ = compare(a.preset, best["value_path"], 32 if a.smoke else a.eval_batch, extra)
    for name, row in cmp_["ev"].items():
        show = (lambda x: "undefined" if x is None else f"{x:+.3f}")
        print(f"  EV {name:9} critic {show(row['critic'])}   near-best {show(row['near_best'])}")
    record = {"config": {"preset": a.preset, "rounds": rounds, "smoke": a.smoke, "lrs": lrs, "warmups": warmups,
                         "epochs": epochs, "overrides": extra},
              "sweep": [{k: v for k, v in r.items() if k != "value_path"} for r in runs],
              "best": {"lr": best["lr"], "warmup": best["warmup"], "epochs": best["epochs"], "last3": best["last3"]},
              "comparison": cmp_, "wall_s_total": round(time.perf_counter() - t0, 1),
              "load_avg_start": load0, "load_avg_end": load_avg()}
    path = write_record("critic", record, Path(a.out) if a.out else None)
    _plot(runs, cmp_, path.with_suffix(".png"))
    print(f"record: {path}")


def _plot(runs: list[dict], cmp_: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        a.plot(range(1, len(r["curve"]) + 1), [x if x is not None else float("nan") for x in r["curve"]],
               label=f"lr {r['lr']:g}, warm-up {r['warmup']}, epochs {r['epochs']}")
    a.set_xlabel("value-pretraining round")
    a.set_ylabel("held-out explained variance")
    a.legend(fontsize=7)
    a.grid(alpha=0.3)
    names = list(cmp_["ev"])
    xs = range(len(names))
    b.bar([x - 0.2 for x in xs], [cmp_["ev"][n]["critic"] or 0.0 for n in names], 0.4, label="critic")
    b.bar([x + 0.2 for x in xs], [cmp_["ev"][n]["near_best"] or 0.0 for n in names], 0.4, label="near-best V*")
    b.set_xticks(list(xs), names, rotation=45, fontsize=7)
    b.set_ylabel("explained variance vs Monte-Carlo returns")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
