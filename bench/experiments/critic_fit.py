"""Can a critic of the policy's size learn the value of a noisy chain policy at all, and what does it take?

The offline fit behind docs/results.md "Why the critic learnt nothing": a large fixed set of rollouts of the
warm-started policy (chain-noisy-sft's starting point, `builtin:chain` v3), Monte-Carlo targets (the sequence
reward at every response token, λ = 1), and value models fitted to them for many passes with the engine's own
value loss (`vapo_engine.algo.value_loss`), measured on held-out prompts after every pass:

- explained variance over every response token, overall and within prompt groups (each prompt's mean removed:
  what a per-prompt baseline such as GRPO's leaves to explain), and at the states `bench.experiments.critic`
  measures its Monte-Carlo ceiling on (line starts and the position right after each line's sign);
- a data curve (the best held-out EV after training on the first n rollouts) and a sweep over the recipe:
  learning rate, batch, passes, Adam betas / epsilon, loss scale, initialisation, head, which layers train.

    .venv/bin/python -m bench.experiments.critic_fit [--train-responses 4096] [--heldout-prompts 64 --group 8]
                                                     [--arms NAME,...] [--smoke] [--out DIR]

The rollouts are sampled once per (preset, sizes, seed) and cached under bench/.cache/critic_fit/ (tensors
only, read back with weights_only=True).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.lib.records import REPO, load_avg, write_record

CACHE = REPO / "bench" / ".cache" / "critic_fit"
PRESET = "chain-noisy-sft"


@dataclass(frozen=True)
class Arm:
    """One way of fitting the critic (the defaults are chain-noisy-sft's value pretraining: lr 1e-3, mini-batch 32,
    AdamW betas (0.9, 0.999), eps 1e-8, weight decay 0.01, token-mean loss, grad-norm clip 1, warm-up 5 steps,
    initialised from the policy, a zero linear head on the last hidden state, every layer trained)."""

    name: str
    lr: float = 1e-3
    batch: int = 32
    epochs: int = 20
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    warmup: int = 5
    clip: float = 1.0
    reduction: str = "token_mean"
    init: str = "policy"        # policy | fresh | teacher (builtin:chain@v1, the clean warm start before the noise)
    head: str = "linear"        # linear | mlp
    train: str = "all"          # all | head | top (the last layer, the final norm and the head)
    responses: int | None = None  # train on the first n rollouts only (the data curve)
    lr_decay: bool = False      # cosine decay to 0 over the fit (else constant after warm-up)
    target: str = "mc"          # mc (the reward everywhere) | onpath (1 while the response is still on the
                                # reference path: dense, noise-free) | oracle (on path × P(success | steps, line))
                                # | gae (GAE(lam) returns bootstrapped from the critic's own current values)
    lam: float = 0.95           # λ of target = gae
    scale: float = 1.0          # rewards (targets) multiplied by this; predictions divided by it for the EVs


PLAN = (
    # (a) capacity and data: can the critic learn the value at all, with which head, from how many rollouts
    "epochs=3",
    "epochs=3,head=surprise",
    "epochs=1,target=onpath",
    "responses=512,epochs=6,head=surprise",
    # (b)-(e): one pass over 1024 responses each (the recipe's own arm first), sized to this 2-core machine's session
    "responses=1024,epochs=1",
    # (b) optimisation: learning rate, batch
    "responses=1024,epochs=1,lr=3e-3",
    "responses=1024,epochs=1,batch=8",
    # (c) initialisation, head, which layers train
    "responses=1024,epochs=1,init=teacher",
    "responses=1024,epochs=1,head=mlp",
    "responses=1024,epochs=1,train=top",
    # (e) targets: bootstrapped GAE(0.95) instead of λ = 1
    "responses=1024,epochs=1,target=gae",
)
"""The arms of the record (Arm fields as key=value; `default` alone = the engine's recipe for 20 passes)."""


def _key(*parts) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=6).hexdigest()


def build_models(preset: str, extra: list[str]):
    from vapo_engine.config import load_config
    from vapo_engine.tasks import get_task
    from vapo_engine.trainer.models import load_models, pick_device, resolve_model_path
    cfg = load_config(REPO / "config.toml", extra, preset=preset)
    task = get_task(cfg.data.train)
    base = resolve_model_path(cfg.model.local_path, task=cfg.model.builtin or cfg.data.train, log=lambda m: None)
    models = load_models(base, value_path=None, need_value=False, reference_path=None,
                         device=pick_device("cpu"), autocast_dtype=None)
    return cfg, task, base, models


def sample_set(preset: str, extra: list[str], train_responses: int, heldout_prompts: int, group: int,
               seed: int) -> dict:
    """{"train": rollout tensors, "heldout": rollout tensors}, cached: training prompts in groups of `group`
    (`train_responses` responses), held-out prompts (the first `heldout_prompts` of the split) × `group`."""
    import torch
    path = CACHE / f"set-{_key(preset, extra, train_responses, heldout_prompts, group, seed)}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    import random

    from vapo_engine.rollout.experience import sample_rollout
    from vapo_engine.trainer import streams
    cfg, task, _, models = build_models(preset, extra)
    out, t0 = {}, time.perf_counter()
    for split in ("train", "heldout"):
        parts, chunk = [], 64
        n_rows = train_responses if split == "train" else heldout_prompts * group
        heldout = task.heldout(heldout_prompts) if split == "heldout" else None
        for c, s in enumerate(range(0, n_rows, chunk)):
            k = min(chunk, n_rows - s) // group
            probs = (heldout[s // group:s // group + k] if heldout is not None
                     else task.train_batch(k, random.Random(streams.seed_of(seed, "fit_prompts", c))))
            with streams.seeded(seed, f"fit_{split}", c):
                ro = sample_rollout(models, task, [q for q in probs for _ in range(group)],
                                    max_new_tokens=cfg.model.max_tokens, temperature=cfg.model.temperature,
                                    top_p=cfg.model.top_p)
            parts.append(ro)
            print(f"  sampled {split} {s + len(probs) * group}/{n_rows} ({time.perf_counter() - t0:.0f}s)",
                  flush=True)
        out[split] = _stack(parts, models.tokenizer.pad_token_id, group)
    out["sample_seconds"] = torch.tensor(time.perf_counter() - t0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    return out


def _stack(parts, pad_id: int, group: int) -> dict:
    """One set of tensors from rollouts of different widths: prompts re-padded left, responses right."""
    import torch
    p = max(r.prompt_len for r in parts)
    w = max(r.response_mask.shape[1] for r in parts)
    ids, attn, rmask, scores = [], [], [], []
    for r in parts:
        lp, rp = p - r.prompt_len, w - r.response_mask.shape[1]
        ids.append(torch.nn.functional.pad(r.input_ids, (lp, rp), value=pad_id))
        attn.append(torch.nn.functional.pad(r.attention_mask, (lp, rp), value=0))
        rmask.append(torch.nn.functional.pad(r.response_mask, (0, rp), value=0.0))
        scores.append(r.scores)
    n = sum(r.size for r in parts)
    return {"input_ids": torch.cat(ids), "attention_mask": torch.cat(attn), "response_mask": torch.cat(rmask),
            "scores": torch.cat(scores), "prompt_len": torch.tensor(p),
            "group": torch.arange(n) // group}


def as_rollout(d: dict, rows, target: str = "mc"):
    """A `Rollout` of rows `rows` of a stacked set, trimmed to its longest response, with the critic targets of
    `target` as its returns (mc: the reward at every token; onpath / oracle: the set's precomputed labels)."""
    import torch

    from vapo_engine.rollout.experience import Rollout, place_rewards, position_ids_from
    ids, attn, mask = d["input_ids"][rows], d["attention_mask"][rows], d["response_mask"][rows]
    scores = d["scores"][rows]
    ro = Rollout(ids, attn, position_ids_from(attn), mask, scores, scores > 0.5, place_rewards(scores, mask),
                 int(d["prompt_len"]), [""] * len(scores))
    w = ro.trimmed().response_mask.shape[1]
    ro = ro.trimmed()
    ret = scores[:, None].expand_as(ro.response_mask) if target == "mc" else d[target][rows][:, :w]
    return replace(ro, returns=ret.contiguous() * ro.response_mask, values=torch.zeros_like(ro.response_mask))


def state_mask(d: dict, tok) -> torch.Tensor:  # noqa: F821
    """(N, R) 1 at the states bench.experiments.critic measures (line starts, right after each line's sign)."""
    import torch

    from bench.experiments.critic import states_of
    p, mask = int(d["prompt_len"]), d["response_mask"]
    out = torch.zeros_like(mask)
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        for b, _ in states_of(tok, d["input_ids"][i, p:p + n].tolist()):
            if b < n:
                out[i, b] = 1.0
    return out


def ev_parts(values, d: dict, sel, target: str = "mc") -> dict:
    """EV of `values` (N, R) against the returns (or the set's `target` labels) over the positions `sel`, overall
    and within prompt groups."""
    import torch
    ret = d["scores"][:, None].expand_as(sel) if target == "mc" else d[target]
    g = d["group"][:, None].expand_as(sel)
    m = sel.bool()
    v, r, gg = values[m].double(), ret[m].double(), g[m]
    out = {}
    for name, centre in (("overall", False), ("within_prompt", True)):
        if centre:
            k = int(gg.max()) + 1
            cnt = torch.zeros(k, dtype=torch.double).index_add_(0, gg, torch.ones_like(r))
            def sub(x, k=k, cnt=cnt):
                means = torch.zeros(k, dtype=torch.double).index_add_(0, gg, x) / cnt.clamp(min=1)
                return x - means[gg]
            rc, ec = sub(r), sub(r - v)
        else:
            rc, ec = r - r.mean(), (r - v) - (r - v).mean()
        ss = float((rc ** 2).sum())
        out[name] = 1 - float((ec ** 2).sum()) / ss if ss > 1e-12 else float("nan")
    return out


def values_of(model, ro, lp=None):
    """V(s_t) (N, R) of a fit's value model (`response_values`; a surprise head reads `lp`)."""
    from vapo_engine.rollout.experience import response_values
    return response_values(model, ro, lp)


def policy_logprobs(policy, d: dict, temperature: float, rows_per_pass: int = 128):
    """(N, R) log-probs of the written response tokens under `policy` at `temperature`, 0 on padding."""
    import torch

    from vapo_engine.rollout.experience import response_log_probs
    n, w = d["response_mask"].shape
    out = torch.zeros(n, w)
    order = torch.argsort(d["response_mask"].sum(1), stable=True)
    with torch.no_grad():
        for s in range(0, n, rows_per_pass):
            rows = order[s:s + rows_per_pass]
            ro = replace(as_rollout(d, rows), temperature=temperature)
            lp, _ = response_log_probs(policy, ro)
            out[rows, :lp.shape[1]] = lp
    return out * d["response_mask"]


def make_value(base: Path, arm: Arm, seed: int, teacher: Path | None):
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    from vapo_engine.trainer.models import _load_value
    if arm.init == "fresh":
        cfg = AutoConfig.from_pretrained(base, num_labels=1)
        cfg.classifier_dropout = 0.0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForTokenClassification.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():
            model.score.weight.zero_()
            model.score.bias.zero_()
    else:
        model = _load_value(teacher if arm.init == "teacher" else base)
    if arm.head == "surprise":
        from vapo_engine.rollout.value_head import attach_head
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            attach_head(model, "surprise")
    if arm.head == "mlp":
        h = model.config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            mlp = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.GELU(), torch.nn.Linear(h, 1))
        with torch.no_grad():
            mlp[2].weight.zero_()
            mlp[2].bias.zero_()
        model.score = mlp
    for name, p in model.named_parameters():
        last = f"layers.{model.config.num_hidden_layers - 1}."
        p.requires_grad_(arm.train == "all" or name.startswith("score") or
                         (arm.train == "top" and (last in name or name.startswith("model.norm"))))
    return model.eval()


def feats_of(d: dict, rows, ro):
    """The policy's log-probs of rows `rows` at the rollout's (trimmed) width (a surprise head's input), or None."""
    if "lp" not in d:
        return None
    return d["lp"][rows][:, :ro.response_mask.shape[1]]


def predict(model, d: dict, rows_per_pass: int = 128):
    import torch
    n, w = d["response_mask"].shape
    out = torch.zeros(n, w)
    order = torch.argsort(d["response_mask"].sum(1), stable=True)  # similar lengths together: less padding
    with torch.no_grad():
        for s in range(0, n, rows_per_pass):
            rows = order[s:s + rows_per_pass]
            ro = as_rollout(d, rows)
            v = values_of(model, ro, feats_of(d, rows, ro))
            out[rows, :v.shape[1]] = v
    return out * d["response_mask"]


def gae_returns(ro, values, lam: float):
    """Critic targets GAE(λ).adv + V (γ = 1) of a rollout with the engine's estimator, bootstrapped from `values`."""
    from vapo_engine.algo import get_advantage_estimator
    _, ret = get_advantage_estimator("gae")(
        token_rewards=ro.token_rewards, values=values, mask=ro.response_mask, scores=ro.scores, group_size=1,
        lam_policy=lam, lam_critic=lam, gamma=1.0)
    return ret.detach()


def length_batches(lengths, batch: int, gen, pool: int = 8) -> list:
    """Row batches for one pass: a random order, cut into pools of `pool` batches, each pool sorted by response
    length before it is cut into batches (less padding: a batch is trimmed to its longest row), the batches
    shuffled. Every row once per pass."""
    import torch
    perm = torch.randperm(len(lengths), generator=gen)
    out = []
    for s in range(0, len(perm), batch * pool):
        chunk = perm[s:s + batch * pool]
        chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
        out += [chunk[k:k + batch] for k in range(0, len(chunk), batch)]
    return [out[i] for i in torch.randperm(len(out), generator=gen).tolist()]


def fit(arm: Arm, data: dict, base: Path, teacher: Path | None, sel_all, sel_states, seed: int = 1,
        evals_per_epoch: int = 1, log=print) -> dict:
    """Fit one value model with `arm`'s recipe on data["train"] (MC targets), measuring held-out EV after each
    pass (and `evals_per_epoch` times within it). Returns the curve and the best / last numbers."""
    import torch

    from vapo_engine.algo import value_loss
    train, held = data["train"], data["heldout"]
    n = arm.responses or train["input_ids"].shape[0]
    model = make_value(base, arm, seed, teacher)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=arm.lr, betas=arm.betas, eps=arm.eps, weight_decay=arm.weight_decay)
    steps_per_epoch = math.ceil(n / arm.batch)
    total = steps_per_epoch * arm.epochs

    def lr_at(step: int) -> float:
        warm = min(1.0, (step + 1) / arm.warmup) if arm.warmup else 1.0
        return warm * (0.5 * (1 + math.cos(math.pi * step / total)) if arm.lr_decay else 1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(seed)
    curve, t0, step = [], time.perf_counter(), 0

    def measure(epoch: float) -> dict:
        v = predict(model, held) / arm.scale
        row = {"epoch": round(epoch, 3), "step": step, "all": ev_parts(v, held, sel_all),
               "states": ev_parts(v, held, sel_states), "seconds": round(time.perf_counter() - t0, 1)}
        if arm.target not in ("mc", "gae"):  # a fixed label of its own (GAE targets move with the critic)
            row["vs_target"] = ev_parts(v, held, sel_all, arm.target)
        curve.append(row)
        return row
    measure(0)
    lengths = train["response_mask"][:n].sum(1)
    for e in range(arm.epochs):
        batches = length_batches(lengths, arm.batch, gen)
        marks = {round(steps_per_epoch * (k + 1) / evals_per_epoch) for k in range(evals_per_epoch)}
        for i, rows in enumerate(batches):
            ro = as_rollout(train, rows, "mc" if arm.target == "gae" else arm.target)
            lp = feats_of(train, rows, ro)
            if arm.target == "gae":  # TD(λ) targets from the critic's values before this step
                with torch.no_grad():
                    old = values_of(model, ro, lp)
                ro = replace(ro, returns=gae_returns(ro, old, arm.lam))
            model.train()
            v = values_of(model, ro, lp)
            loss, _ = value_loss(v, ro.values, ro.returns * arm.scale, ro.response_mask, reduction=arm.reduction)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, arm.clip)
            opt.step()
            sched.step()
            model.eval()
            step += 1
            if i + 1 in marks:
                row = measure(e + (i + 1) / steps_per_epoch)
                log(f"  {arm.name}: epoch {row['epoch']:.2f}  held-out EV all {row['all']['overall']:+.3f} "
                    f"(within {row['all']['within_prompt']:+.3f})  states {row['states']['overall']:+.3f} "
                    f"(within {row['states']['within_prompt']:+.3f})  "
                    + (f"vs {arm.target} {row['vs_target']['overall']:+.3f}  " if "vs_target" in row else "")
                    + f"{row['seconds']:.0f}s")
    sub = {k: (v if k == "prompt_len" else v[:n]) for k, v in train.items()}
    train_ev = ev_parts(predict(model, sub) / arm.scale, sub, sub["response_mask"])
    best = max(curve, key=lambda r: r["states"]["within_prompt"])
    return {"arm": asdict(arm), "train_responses": n, "curve": curve, "best": best, "last": curve[-1],
            "train_ev_last": train_ev, "seconds": round(time.perf_counter() - t0, 1)}


def parse_arm(spec: str) -> Arm:
    """`default` or `key=value,key=value` over Arm's fields (betas as 0.9/0.99)."""
    kw = {}
    for part in filter(None, spec.split(",")):
        if part == "default":
            continue
        k, v = part.split("=", 1)
        typ = type(getattr(Arm("x"), k))
        kw[k] = (tuple(float(x) for x in v.split("/")) if k == "betas" else v if typ is str
                 else bool(int(v)) if typ is bool else int(v) if k in ("batch", "epochs", "warmup", "responses")
                 else float(v))
    return Arm(name=spec, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=PRESET)
    ap.add_argument("--train-responses", type=int, default=4096)
    ap.add_argument("--heldout-prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arms", default="plan", help="';'-separated arm specs (key=value,...), or `plan`: the "
                    "record's arms (PLAN)")
    ap.add_argument("--assemble", action="store_true", help="only take arms that are cached (run by earlier "
                    "invocations); write the record from them")
    ap.add_argument("--evals-per-epoch", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--probe", action="store_true", help="also probe how visible a wrong sign is (policy log-prob, "
                    "linear probes per layer)")
    ap.add_argument("--name", default="critic_fit")
    ap.add_argument("--out")
    a = ap.parse_args()
    import torch
    t0, load0 = time.perf_counter(), load_avg()
    data = sample_set(a.preset, a.set, a.train_responses, a.heldout_prompts, a.group, a.seed)
    cfg, task, base, models = build_models(a.preset, a.set)
    from vapo_engine.builtin_model import builtin_model_dir
    teacher = Path(builtin_model_dir(task="builtin:chain@v1", log=lambda m: None))
    held = data["heldout"]
    sel_states = state_mask(held, models.tokenizer)
    for split in ("train", "heldout"):
        data[split]["onpath"], data[split]["steps"], data[split]["line"] = path_labels(data[split], models.tokenizer,
                                                                                       task)
    oracle_values(data["train"], [data["train"], held])
    if a.arms == "plan" or "head=surprise" in a.arms:
        for split in ("train", "heldout"):
            data[split]["lp"] = policy_logprobs(models.policy, data[split], cfg.model.temperature)
    oracle = {"all": ev_parts(held["oracle"], held, held["response_mask"]),
              "states": ev_parts(held["oracle"], held, sel_states),
              "onpath_position_only": position_only(data["train"], held)}
    print(f"oracle value (on path x success rate by steps and line, from the training rollouts): held-out EV "
          f"{oracle}", flush=True)
    acc = {s: float(data[s]["scores"].float().mean()) for s in ("train", "heldout")}
    print(f"data: {data['train']['input_ids'].shape[0]} train / {held['input_ids'].shape[0]} held-out responses, "
          f"accuracy {acc}", flush=True)
    set_key = _key(a.preset, a.set, a.train_responses, a.heldout_prompts, a.group, a.seed, a.evals_per_epoch)
    probed = None
    if a.probe or a.arms == "plan":
        cached = CACHE / f"probe-{set_key}.json"
        probed = json.loads(cached.read_text(encoding="utf-8")) if cached.is_file() else probe(data, models, task)
        cached.write_text(json.dumps(probed), encoding="utf-8")
        print(f"probe: {json.dumps(probed)}", flush=True)
    results = []
    for spec in (PLAN if a.arms == "plan" else [x.strip() for x in a.arms.split(";") if x.strip()]):
        arm = parse_arm(spec)
        cached = CACHE / f"arm-{_key(set_key, asdict(arm))}.json"
        if cached.is_file():  # arms run in separate invocations (two at a time) and are assembled here
            results.append(json.loads(cached.read_text(encoding="utf-8")))
            continue
        if a.assemble:
            print(f"{spec}: not run yet (no cached result); skipped", flush=True)
            continue
        r = fit(arm, data, base, teacher, held["response_mask"], sel_states, a.seed, a.evals_per_epoch)
        print(f"{arm.name}: best states within {r['best']['states']['within_prompt']:+.3f} at epoch "
              f"{r['best']['epoch']}  last {r['last']['states']['within_prompt']:+.3f}  train EV "
              f"{r['train_ev_last']['overall']:+.3f}  ({r['seconds']:.0f}s)", flush=True)
        cached.write_text(json.dumps(r), encoding="utf-8")
        results.append(r)
    record = {"config": {"preset": a.preset, "train_responses": a.train_responses,
                         "heldout_prompts": a.heldout_prompts, "group": a.group, "seed": a.seed, "overrides": a.set,
                         "torch_threads": torch.get_num_threads()},
              "data": {"accuracy": acc, "sample_seconds": float(data["sample_seconds"]),
                       "heldout_states": int(sel_states.sum()), "heldout_tokens": int(held["response_mask"].sum())},
              "oracle": oracle, "probe": probed, "arms": results, "wall_s_total": round(time.perf_counter() - t0, 1), "load_avg_start": load0,
              "load_avg_end": load_avg()}
    path = write_record(a.name, record, Path(a.out) if a.out else None)
    from bench.lib.render_critic import plot
    plot(record, path.with_suffix(".png"))
    print(f"record: {path}")


def path_labels(d: dict, tok, task) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # noqa: F821
    """Per response token t: (on path before t (the prefix of t tokens is a prefix of the reference solution),
    the number of steps of the prompt, the line the state is on). The built-in character tokenizer writes
    one token per character, so token t is character t."""
    import torch
    p, mask = int(d["prompt_len"]), d["response_mask"]
    n_rows, w = mask.shape
    onpath, steps, line = torch.zeros(n_rows, w), torch.zeros(n_rows, dtype=torch.long), torch.zeros(n_rows, w,
                                                                                                  dtype=torch.long)
    for i in range(n_rows):
        prompt = tok.decode(d["input_ids"][i, :p][d["attention_mask"][i, :p].bool()].tolist(),
                            skip_special_tokens=True)
        n = int(mask[i].sum())
        resp = [tok.decode([t]) for t in d["input_ids"][i, p:p + n].tolist()]
        ref = task.solve(prompt)
        k = 0
        while k < len(resp) and k < len(ref) and resp[k] == ref[k]:
            k += 1
        if k == len(ref):  # the whole solution written: what follows (EOS) keeps it on the path
            k = n
        onpath[i, :min(k, n - 1) + 1] = 1.0  # the prefix of t tokens is on the path for t <= k
        steps[i] = task.steps_of(prompt)
        line[i, :n] = torch.tensor([0] + [c == "\n" for c in resp[:-1]]).cumsum(0)[:n]
    return onpath * mask, steps, line


def position_only(train: dict, held: dict) -> float:
    """EV (over every held-out response token) against the on-path label of the label's mean rate on the
    training rollouts by (prompt steps, line index): what the position alone predicts of it."""
    import torch
    table: dict[tuple[int, int], tuple[float, int]] = {}
    st = train["steps"][:, None].expand_as(train["line"])
    m = train["response_mask"].bool()
    for a, b, y in zip(st[m].tolist(), train["line"][m].tolist(), train["onpath"][m].tolist()):
        s0, n0 = table.get((a, b), (0.0, 0))
        table[(a, b)] = (s0 + y, n0 + 1)
    sh = held["steps"][:, None].expand_as(held["line"])
    pred = torch.tensor([[table.get((a, b), (0.0, 1))[0] / table.get((a, b), (0.0, 1))[1] for a, b in zip(ra, rb)]
                         for ra, rb in zip(sh.tolist(), held["line"].tolist())])
    return ev_parts(pred, held, held["response_mask"], "onpath")["overall"]


def oracle_values(train: dict, sets: list[dict]) -> None:
    """Adds "onpath" and "oracle" to each set: oracle = on path × the training set's success rate of responses
    on the path at the start of that line of a prompt with that many steps (the value function of a policy whose
    sign errors depend only on where they are, estimated from the training rollouts)."""
    import torch
    on, steps, line = train["onpath"], train["steps"], train["line"]
    starts = torch.zeros_like(on, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = line[:, 1:] != line[:, :-1]
    key_rows = steps[:, None].expand_as(line)
    table = {}
    hit = starts & on.bool()
    for s, ln, ok in zip(key_rows[hit].tolist(), line[hit].tolist(),
                         train["scores"][:, None].expand_as(line)[hit].tolist()):
        a, b = table.get((s, ln), (0.0, 0))
        table[(s, ln)] = (a + ok, b + 1)
    for d in sets:
        st = d["steps"][:, None].expand_as(d["line"])
        rate = torch.tensor([[table.get((a, b), (0.0, 0))[0] / max(1, table.get((a, b), (0.0, 1))[1])
                              for a, b in zip(ra, rb)] for ra, rb in zip(st.tolist(), d["line"].tolist())])
        d["oracle"] = d["onpath"] * rate


def sign_sites(d: dict, tok, task) -> tuple[list[tuple[int, int]], list[int]]:
    """(row, response index of a line's sign token) for every written line whose label names an operation of the
    prompt, and whether that sign differs from the operation's (the noisy policy's one kind of mistake)."""
    p, mask = int(d["prompt_len"]), d["response_mask"]
    sites, wrong = [], []
    for i in range(mask.shape[0]):
        prompt = tok.decode(d["input_ids"][i, :p][d["attention_mask"][i, :p].bool()].tolist(),
                            skip_special_tokens=True)
        ops = {op[0]: op[1] for op in prompt.split()[1:]}
        n = int(mask[i].sum())
        text = "".join(tok.decode([t]) for t in d["input_ids"][i, p:p + n].tolist())
        start = 0
        for line in text.split("\n"):
            if len(line) >= 5 and line[0] in ops and line[4] in "+-":
                sites.append((i, start + 4))
                wrong.append(int(line[4] != ops[line[0]]))
            start += len(line) + 1
    return sites, wrong


def site_features(policy, d: dict, sites, rows_per_pass: int = 64) -> dict:
    """At each sign site: the policy's log-prob of the written sign (T = 1) and the hidden state of every layer at
    the sign's position (what a critic initialised from the policy reads V(s) from, after the sign)."""
    import torch

    from vapo_engine.rollout.experience import response_log_probs
    by_row: dict[int, list[int]] = {}
    for k, (i, b) in enumerate(sites):
        by_row.setdefault(i, []).append(k)
    p = int(d["prompt_len"])
    layers = policy.config.num_hidden_layers + 1
    feats = {"logprob": torch.zeros(len(sites)), "hidden": torch.zeros(layers, len(sites), policy.config.hidden_size)}
    rows = sorted(by_row)
    with torch.no_grad():
        for s in range(0, len(rows), rows_per_pass):
            chunk = rows[s:s + rows_per_pass]
            ro = as_rollout(d, torch.tensor(chunk))
            lp, _ = response_log_probs(policy, ro)
            out = policy(input_ids=ro.input_ids, attention_mask=ro.attention_mask, position_ids=ro.position_ids,
                         output_hidden_states=True, use_cache=False)
            for j, i in enumerate(chunk):
                for k in by_row[i]:
                    b = sites[k][1]
                    feats["logprob"][k] = lp[j, b]
                    for layer in range(layers):
                        feats["hidden"][layer, k] = out.hidden_states[layer][j, p + b]
    return feats


def auc(score, label) -> float:
    """Area under the ROC curve (the chance a random positive outscores a random negative; ties count half)."""
    import torch
    score, label = torch.as_tensor(score, dtype=torch.float64), torch.as_tensor(label).bool()
    pos, neg = score[label], score[~label]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = torch.argsort(torch.cat([pos, neg]))
    ranks = torch.empty(len(order), dtype=torch.float64)
    ranks[order] = torch.arange(1, len(order) + 1, dtype=torch.float64)
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def linear_probe(x_train, y_train, x_test, y_test, steps: int = 300) -> float:
    """Held-out AUC of a logistic regression (standardised features, L2 1e-3, L-BFGS) of `y` on `x`."""
    import torch
    mu, sd = x_train.mean(0), x_train.std(0).clamp(min=1e-6)
    xt, xs = (x_train - mu) / sd, (x_test - mu) / sd
    w = torch.zeros(xt.shape[1] + 1, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe")
    y = torch.as_tensor(y_train, dtype=torch.float32)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ w[:-1] + w[-1], y) + 1e-3 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    with torch.no_grad():
        return auc(xs @ w[:-1] + w[-1], y_test)


def probe(data: dict, models, task) -> dict:
    """How visible a wrong sign is right after it is written: the AUC of the policy's own log-prob of the sign,
    and of linear probes on each layer's hidden state at the sign (trained on the training rollouts' sites,
    measured on the held-out ones)."""
    sites = {s: sign_sites(data[s], models.tokenizer, task) for s in ("train", "heldout")}
    feats = {s: site_features(models.policy, data[s], sites[s][0]) for s in ("train", "heldout")}
    y_tr, y_te = sites["train"][1], sites["heldout"][1]
    out = {"sites_train": len(y_tr), "sites_heldout": len(y_te), "wrong_rate_train": sum(y_tr) / max(1, len(y_tr)),
           "logprob_auc": auc(-feats["heldout"]["logprob"], y_te)}
    out["layer_auc"] = [linear_probe(feats["train"]["hidden"][k], y_tr, feats["heldout"]["hidden"][k], y_te)
                        for k in range(feats["train"]["hidden"].shape[0])]
    return out


if __name__ == "__main__":
    main()
