"""docs/results.md's section of bench/results/critic_fit.json: why the hidden-state critic learnt nothing on
builtin:chain, and what the surprise head changes (bench/experiments/critic_fit.py). Every number comes from the
record; the sentences that state the cause are built from the same fields. Torch-free."""
from __future__ import annotations

from .render import f, section

DEFAULTS = {"lr": 1e-3, "batch": 32, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "warmup": 5,
            "clip": 1.0, "reduction": "token_mean", "init": "policy", "head": "linear", "train": "all",
            "target": "mc", "lam": 0.95, "scale": 1.0, "lr_decay": False}
WORDS = {"target": {"onpath": "clean label: still on the reference path", "gae": "GAE(0.95) targets, bootstrapped",
                    "oracle": "oracle value"},
         "init": {"fresh": "fresh weights", "teacher": "from the clean SFT model (v1)"},
         "head": {"surprise": "surprise head", "mlp": "MLP head"},
         "train": {"head": "head only (linear probe of the frozen trunk)", "top": "last layer + head only"}}


def describe(arm: dict) -> str:
    """What an arm changes from the engine's recipe (linear head, MC targets, lr 1e-3, batch 32, ...)."""
    parts = []
    for k, d in DEFAULTS.items():
        v = arm.get(k, d)
        if v == d or (isinstance(d, list) and list(v) == d) or (k == "lam" and arm.get("target") != "gae"):
            continue
        parts.append(WORDS.get(k, {}).get(v) or (f"{k} {'/'.join(map(str, v))}" if isinstance(v, list)
                                                 else f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"))
    return ", ".join(parts) or "the engine's recipe (linear head, Monte-Carlo targets)"


def _within(row: dict) -> float:
    return row["states"]["within_prompt"]


def _best(arm: dict) -> dict:
    """The arm's best held-out point after training (the untrained zero head at pass 0 is no result)."""
    return max((p for p in arm["curve"] if p["epoch"] > 0), key=_within, default=arm["best"])


def hidden_state_arms(rec: dict) -> list[dict]:
    """The arms whose critic reads the hidden state only and is scored on returns (every head but `surprise`,
    every target but the on-path label)."""
    return [a for a in rec["arms"] if a["arm"]["head"] != "surprise" and a["arm"]["target"] != "onpath"]


def critic_fit(rec: dict) -> str:
    c, d, o, p = rec["config"], rec["data"], rec["oracle"], rec.get("probe") or {}
    ceiling = o["states"]["within_prompt"]
    head = ("| arm | training responses | passes | held-out EV within prompt (states): best · last | share of the "
            "ceiling (best) | overall EV (states, last) | EV vs its own label | train EV (last) |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for a in rec["arms"]:
        arm, best, last = a["arm"], _best(a), a["last"]
        own = f(last["vs_target"]["overall"]) if "vs_target" in last else ""
        lines.append(f"| {describe(arm)} | {a['train_responses']} | {arm['epochs']} | {f(_within(best))} · "
                     f"{f(_within(last))} | {max(0.0, _within(best)) / ceiling:.0%} | {f(last['states']['overall'])} | "
                     f"{own} | {f(a['train_ev_last']['overall'])} |")
    layers = p.get("layer_auc") or []
    probe = (f"Right after each line's sign ({p['sites_train']} training and {p['sites_heldout']} held-out sites, "
             f"{p['wrong_rate_train']:.1%} of signs wrong), the policy's own log-prob of the sign tells a wrong one "
             f"from a right one at held-out AUC {f(p['logprob_auc'], 2)}; logistic probes of the hidden state at the "
             f"same place (embeddings, then each of the {len(layers) - 1} layers) reach AUC "
             f"{', '.join(f(x, 2) for x in layers)} (0.50 = chance).") if p else ""
    lin = hidden_state_arms(rec)
    sur = [a for a in rec["arms"] if a["arm"]["head"] == "surprise"]
    onpath = next((a for a in rec["arms"] if a["arm"]["target"] == "onpath"), None)
    best_lin = max((_within(_best(a)) for a in lin), default=None)
    full = max(sur, key=lambda a: a["train_responses"], default=None)
    cause = ("**The cause.** " + probe + (
        f" Every critic of the sweep that reads the hidden state only ({len(lin)} fits: "
        + "; ".join(f"{describe(a['arm'])} on {a['train_responses']} responses × {a['arm']['epochs']}" for a in lin)
        + f") stays at or below a within-prompt EV of {f(best_lin)} against a ceiling of {f(ceiling)}") + (
        f"; given the noise-free label \"still on the reference path\" instead of returns, it explains "
        f"{f(onpath['last']['vs_target']['overall'])} of that label's variance, against "
        f"{f(o.get('onpath_position_only'))} for a table of the label's rate by prompt length and line (the position "
        "alone), so the noise of the returns is not what stops it") + (
        ". No defect was found: the values are read at the state before each token and the reward on the last "
        "valid one (tests/test_engine.py), the critic runs in fp32 without dropout. A critic "
        "initialised from the policy reads V(s) from the hidden state of the last written token, which is shaped to "
        "predict the next token; this policy's mistakes are its own unlikely draws, visible only in its output "
        "distribution one position earlier, which that critic never sees and did not learn to rebuild.")
    )
    fix = (f"**The fix** (`critic.head = \"surprise\"`): the value head also reads the policy's log-probs of the "
           f"tokens written so far. On the same data it reaches a within-prompt EV of {f(_within(_best(full)))} "
           f"({_within(_best(full)) / ceiling:.0%} of the ceiling) from {full['train_responses']} responses; the data "
           "curve: " + "; ".join(f"{a['train_responses']} responses × {a['arm']['epochs']} passes → "
                                 f"{f(_within(_best(a)))}"
                                 for a in sorted(sur, key=lambda a: a["train_responses"])) + ".") if full else ""
    notes = [
        (f"Preset {c['preset']}: {c['train_responses']} responses of the warm start on training prompts (groups of "
         f"{c['group']}; accuracy {f(d['accuracy']['train'])}) and {c['heldout_prompts']} held-out prompts × "
         f"{c['group']} ({f(d['accuracy']['heldout'])}), sampled once; each arm fits a fresh critic with the engine's "
         f"value loss and is measured on the held-out responses after every pass, at the {d['heldout_states']} states "
         "`bench.experiments.critic` measures (line starts and right after each sign), within prompt groups (each "
         "prompt's mean removed: what a value-based advantage adds over GRPO's group mean). The ceiling "
         f"{f(ceiling)} (overall {f(o['states']['overall'])}) is the EV of the value function of a policy whose "
         "mistakes depend only on where they are (on the reference path × the training responses' success rate "
         "from that line of a prompt of that length); `bench/results/critic.json` estimates it from Monte-Carlo "
         "continuations on other held-out responses."),
        cause, fix]
    return section(lines, rec, *[n for n in notes if n])


def critic_fit_summary(rec: dict) -> str:
    """One sentence for the README: the cause and the fixed critic against the ceiling."""
    o, p = rec["oracle"], rec.get("probe") or {}
    ceiling = o["states"]["within_prompt"]
    sur = [a for a in rec["arms"] if a["arm"]["head"] == "surprise"]
    lin = hidden_state_arms(rec)
    if not sur or not lin:
        return ""
    full = max(sur, key=lambda a: a["train_responses"])
    return (f"**The critic** (`bench/results/critic_fit.json`): a critic that reads values off the hidden state "
            f"cannot see this policy's mistakes (probes of its hidden states at AUC ≤ "
            f"{f(max(p.get('layer_auc') or [float('nan')]), 2)}; the policy's own log-prob of a wrong sign: AUC "
            f"{f(p.get('logprob_auc'), 2)}), and no recipe of {len(lin)} gets it above a within-prompt EV of "
            f"{f(max(_within(_best(a)) for a in lin))} (ceiling {f(ceiling)}); with `critic.head = \"surprise\"` "
            f"(the policy's log-probs of the written tokens as inputs) it reaches {f(_within(_best(full)))}.")


def plot(rec: dict, path) -> None:
    """Left: held-out within-prompt EV against the responses trained on (passes × responses), per arm of the
    record's part (a), next to the ceiling. Right: every arm's best within-prompt EV."""
    from .plots import pyplot
    plt = pyplot()
    ceiling = rec["oracle"]["states"]["within_prompt"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.2]})
    for arm in rec["arms"]:
        spec = arm["arm"]
        if spec["head"] != "surprise" and arm["train_responses"] < rec["config"]["train_responses"]:
            continue
        xs = [p["epoch"] * arm["train_responses"] for p in arm["curve"]]
        a.plot(xs, [p["states"]["within_prompt"] for p in arm["curve"]], marker=".", label=describe(spec)[:48]
               + ("" if spec["head"] != "surprise" else f" ({arm['train_responses']} responses)"))
    a.axhline(ceiling, color="k", ls="--", lw=1, label="ceiling (oracle value)")
    a.axhline(0, color="grey", lw=0.5)
    a.set(xlabel="responses trained on (passes × responses)", ylabel="held-out EV within prompt (states)")
    a.legend(fontsize=6)
    names = [describe(x["arm"])[:60] + f" [{x['train_responses']}×{x['arm']['epochs']}]" for x in rec["arms"]]
    b.barh(range(len(names)), [_within(_best(x)) for x in rec["arms"]],
           color=["tab:green" if x["arm"]["head"] == "surprise" else "tab:blue" for x in rec["arms"]])
    b.axvline(ceiling, color="k", ls="--", lw=1)
    b.set_yticks(range(len(names)), names, fontsize=6)
    b.invert_yaxis()
    b.set(xlabel="best held-out EV within prompt (states)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
