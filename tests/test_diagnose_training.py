"""diagnose_error(run_dir=...): every training rule fires on a realistic run directory with the run's numbers
in its evidence; a healthy run and a 3-step run give no training findings; a bad run dir is a clear error."""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_openai import CANARY

from tools.diagnose import diagnose_error
from vapo_engine.config import TrainConfig
from vapo_engine.diagnostics import Evidence, evaluate, load_rules
from vapo_engine.diagnostics.evidence import crash_facts, pack_metrics

CPU_DEMO = {"model": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 40},
            "vapo": {"alpha": 0.8, "value_pretrain_steps": 10, "value_learning_rate": 5e-4},
            "training": {"total_steps": 60, "batch_size": 128, "learning_rate": 5e-5, "kl_coef": 0.0},
            "data": {"train": "builtin:addition"},
            "eval": {"benchmark": "builtin:addition", "eval_interval": 20, "save_interval": 20}}


def healthy(t: int, n: int, rng: random.Random) -> dict[str, float]:
    """Metrics of train step t of n of a run that learns (cpu-demo shapes: ~25 tokens, α = 0.8)."""
    f, noise = t / n, (lambda s: rng.uniform(-s, s))
    acc = 0.3 + 0.4 * f + noise(0.03)
    length = 22 + 6 * f + noise(0.5)
    return {"rollout/reward_mean": acc, "rollout/accuracy": acc, "rollout/response_length": length,
            "rollout/truncated_frac": 0.02, "rollout/no_signal_groups": 0.3 + noise(0.05),
            "actor/entropy": 1.2 - 0.4 * f, "actor/pg_loss": noise(0.02), "actor/approx_kl": 0.002,
            "actor/pg_clipfrac": 0.05, "actor/grad_norm": 0.5,
            "critic/value_loss": 0.08 - 0.03 * f + noise(0.004),
            "critic/explained_var": 0.3 + 0.3 * f + noise(0.02),
            "vapo/lambda_policy_mean": 1 - 1 / (0.8 * length), "vapo/lambda_policy_min": 0.9,
            "vapo/lambda_clamped_frac": 0.0}


def make_run(root: Path, *, config: dict | None = None, steps: int = 60,
             train: Callable[[int, dict], dict] = lambda t, m: m, evals: list[float] | None = None,
             pretrain: bool = True, status: str | None = "succeeded", log_end: str = "",
             checkpoints: tuple[int, ...] = (40, 60)) -> Path:
    """A run directory in the engine's layout: config, metrics.jsonl, summary, worker.log, run.json."""
    run = root / "exp" / "20250101-000000-abcdef"
    run.mkdir(parents=True)
    cfg = TrainConfig().model_dump(mode="json")
    for section, values in {**CPU_DEMO, **(config or {})}.items():
        cfg[section].update(CPU_DEMO.get(section, {}) | values)
    cfg["training"]["total_steps"] = max(cfg["training"]["total_steps"], steps)
    cfg = TrainConfig.model_validate(cfg).model_dump(mode="json")  # with the decisions these values imply
    (run / "config.json").write_text(json.dumps(cfg, indent=2))
    (run / "run.json").write_text(json.dumps({"run_id": run.name, "experiment": "exp", "seed": 42}))
    rng, records, log = random.Random(0), [], []
    evals = evals if evals is not None else [0.35, 0.45, 0.55, 0.6]
    eval_steps = [0, *range(20, steps + 1, 20)][:len(evals)]
    records.append({"step": 0, "kind": "eval", "eval/greedy_accuracy": evals[0],
                    "eval/sampled_accuracy": evals[0]})
    for i in range(cfg["vapo"]["value_pretrain_steps"] if pretrain else 0):
        records.append({"step": i, "kind": "pretrain", "critic/pretrain_value_loss": 0.2 - 0.01 * i,
                        "critic/pretrain_explained_var": 0.03 * i})
    for t in range(1, steps + 1):
        m = train(t, healthy(t, steps, rng))
        records.append({"step": t, "kind": "train", **m})
        log.append(f"train  step {t:>5}/{steps}: reward {m['rollout/reward_mean']}  "
                   f"len {m['rollout/response_length']}")
        if t in eval_steps:
            g = evals[eval_steps.index(t)]
            records.append({"step": t, "kind": "eval", "eval/greedy_accuracy": g, "eval/sampled_accuracy": g})
    with (run / "metrics.jsonl").open("w") as f:
        for i, rec in enumerate(records):
            head = {"step": rec.pop("step"), "kind": rec.pop("kind"), "time": 1.7e9 + i}
            f.write(json.dumps({**head, **rec}) + "\n")
    (run / "worker.log").write_text("\n".join(log) + "\n" + log_end)
    if status:
        (run / "summary.json").write_text(json.dumps({
            "status": status, "steps": steps, "start_eval": {"eval/greedy_accuracy": evals[0]},
            "final_eval": {"eval/greedy_accuracy": evals[-1]}, "greedy_accuracy_gain": evals[-1] - evals[0],
            "seconds": 120.0, "model": "builtin-tiny"}))
    for s in checkpoints:
        _checkpoint(run / "checkpoints" / f"step-{s:07d}", s)
    return run


def _checkpoint(folder: Path, step: int) -> None:
    """A complete checkpoint as the trainer writes it: weights (a valid safetensors file), trainer state and
    the DONE manifest last (vapo_engine.rundir verifies it before a checkpoint counts)."""
    from vapo_engine.rundir import write_manifest
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "config.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "policy" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
    write_manifest(folder, step)


def upd(**values: float | str) -> Callable[[int, dict], dict]:
    return lambda t, m: {**m, **values}


def collapsed_lambda(t: int, m: dict) -> dict:  # α = 0.02 at ~26 tokens: every λ clamps to 0, nothing learns
    return {**m, "rollout/response_length": 26.0 + (t % 3 - 1) * 0.4, "vapo/lambda_policy_mean": 0.0,
            "vapo/lambda_policy_min": 0.0, "vapo/lambda_clamped_frac": 1.0, "rollout/reward_mean": 0.3,
            "rollout/accuracy": 0.3}


def oscillating(t: int, m: dict) -> dict:
    r = 0.2 if t % 2 else 0.7
    return {**m, "rollout/reward_mean": r, "rollout/accuracy": r, "vapo/lambda_policy_mean": 0.995}


def flat_length(t: int, m: dict) -> dict:
    return {**m, "rollout/response_length": 30 - 3 * t / 60, "rollout/reward_mean": 0.3 + 0.01 * (t % 2),
            "rollout/accuracy": 0.3}


def nan_after_41(t: int, m: dict) -> dict:
    if t < 41:
        return m
    return {**m, "actor/pg_loss": "nan", "critic/value_loss": "nan", "actor/grad_norm": "inf",
            "actor/entropy": "nan"}


OOM_LOG = ("Traceback (most recent call last):\n"
           "  File \"vapo_engine/trainer/update.py\", line 88, in update_step\n    loss.backward()\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
           "a total capacity of 79.11 GiB of which 1.20 GiB is free.\n")

QUESTION = "Why doesn't my AIME score match the paper's 60.4?"

# rule id -> (run directory builder, diagnose_error extras, strings in its evidence, strings in its fix)
TRAINING_CASES: dict[str, tuple] = {
    "train-lambda-collapsed": (
        lambda tmp: make_run(tmp, config={"vapo": {"alpha": 0.02}}, train=collapsed_lambda), {},
        ["vapo/lambda_policy_mean = 0.00 over the last 20 steps", "mean response length 26 tokens",
         "alpha = 0.02 → 1/alpha = 50", "100% of sequences clamped"], ["vapo.alpha ≈ 0.77", "20 / mean"]),
    "train-oscillating": (
        lambda tmp: make_run(tmp, config={"vapo": {"alpha": 5.0}}, train=oscillating), {},
        ["rollout/reward_mean changes direction on 100% of steps", "mean step-to-step change of 0.5",
         "λ ≈ 1", "alpha 5"], ["use_length_adaptive = false", "learning_rate (e.g. 1.5e-05)"]),
    "train-length-not-growing": (
        lambda tmp: make_run(tmp, config={"vapo": {"token_level_loss": False,
                                                   "loss_reduction": "seq_mean_token_mean"}},
                             train=flat_length), {},
        ["rollout/response_length 29.6 → 27.4 tokens (-8%)", "rollout/reward_mean 0.31 → 0.30",
         "decisions.loss_reduction = seq_mean_token_mean"], ['loss_reduction = "token_mean"; now seq_mean_token_mean']),
    "train-no-signal": (
        lambda tmp: make_run(tmp, train=upd(**{"rollout/no_signal_groups": 0.9, "rollout/accuracy": 0.95})),
        {},
        ["rollout/no_signal_groups = 0.90 over the last 20 steps", "too easy"], ["vapo.group_size (now 8"]),
    "train-value-collapse": (
        lambda tmp: make_run(tmp, config={"vapo": {"value_pretrain_steps": 0}}, pretrain=False,
                             train=lambda t, m: {**m, "critic/explained_var": 0.2 - 0.5 * t / 60}), {},
        ["critic/explained_var = -0.2", "decisions.value_pretrain_steps = 0"], ["value_pretrain_steps = 50"]),
    "train-entropy-collapse": (
        lambda tmp: make_run(tmp, config={"vapo": {"clip_range_high": 0.2}},
                             train=lambda t, m: {**m, "actor/entropy": 1.5 * math.exp(-t / 15)}), {},
        ["actor/entropy 1.", "of its start", "decisions.policy_loss = ppo_clip"],
        ["vapo.clip_higher = true with vapo.clip_range_high = 0.28 (now ε_high 0.2"]),
    "train-nan": (
        lambda tmp: make_run(tmp, train=nan_after_41, status=None), {},
        ["metrics.jsonl holds 80 non-finite values; first: actor/entropy = nan at train step 41",
         "also in actor/pg_loss, actor/grad_norm, critic/value_loss",
         "First non-finite train value at step 41"],
        ["checkpoint at step 40", "learning_rate (e.g. 1.5e-05)"]),
    "train-paper-mismatch": (
        lambda tmp: make_run(tmp), {"text": QUESTION},
        ["model built-in tiny model vs Qwen2.5-32B", "training.batch_size 128 vs 8192",
         "vapo.alpha 0.8 vs 0.05",
         "vapo.group_size 8 (16 prompts × 8) vs 16", "model.max_tokens 40 vs up to ~20k", "you asked"],
        ["ablate"]),
    "train-worker-crash": (
        lambda tmp: make_run(tmp, status=None, log_end=OOM_LOG), {},
        ["worker.log ends with out of memory", "torch.OutOfMemoryError", "checkpoint at step 60"],
        ["micro_batch_size (now 128", "resume_run('20250101-000000-abcdef')"]),
    "train-provider-down": (
        lambda tmp: with_provider_down(make_run(tmp)), {},
        ["provider.json: auth: HTTP 401: Incorrect API key provided: sk-…"],
        ["set TAOTOKEN_API_KEY to a valid key", "resume_run('20250101-000000-abcdef')"]),
    "train-rollout-servers-down": (
        lambda tmp: with_rollout_down(make_run(tmp)), {},
        [("rollout.json: no replica answered for 30s: http://127.0.0.1:8001 (ConnectError: [Errno 111] Connection "
          "refused)")],
        ["start the inference server(s) at these URLs", "resume_run('20250101-000000-abcdef')"]),
    "train-accuracy-dropped": (
        lambda tmp: make_run(tmp, evals=[0.62, 0.66, 0.41, 0.30]), {},
        ["eval/greedy_accuracy 0.62 → 0.30 (-32 points) from step 0 to step 60", "best 0.66 at step 20"],
        ["training.learning_rate"]),
}


def with_provider_down(run: Path) -> Path:
    """provider.json as the trainer writes it when [provider_rollouts] stops (a rejected key)."""
    (run / "provider.json").write_text(json.dumps({"down": {
        "kind": "auth", "status": 401, "reason": "HTTP 401: Incorrect API key provided: sk-…",
        "fix": "set TAOTOKEN_API_KEY to a valid key (the one in the environment was rejected)"}}))
    return run


def with_rollout_down(run: Path) -> Path:
    """rollout.json as the trainer writes it when it gives up on its inference servers (replicas.ReplicaPool)."""
    (run / "rollout.json").write_text(json.dumps({"down": {
        "since_s": 30.0, "timeout_s": 30.0, "replicas": [{"url": "http://127.0.0.1:8001", "error": "ConnectError"}],
        "reason": "no replica answered for 30s: http://127.0.0.1:8001 (ConnectError: [Errno 111] Connection refused)",
        "fix": "start the inference server(s) at these URLs (vapo-mcp serve-model MODEL --port PORT --weight-root "
               "DIR, or the vLLM / SGLang server), or correct rollout.urls; then resume_run"}}))
    return run


def run_diagnosis(rule_id: str, tmp_path: Path):
    build, extra, _, _ = TRAINING_CASES[rule_id]
    return diagnose_error(run_dir=build(tmp_path), env={}, limit=50, **extra)


def test_every_training_rule_has_a_case():
    assert sorted(TRAINING_CASES) == sorted(r.id for r in load_rules() if r.id.startswith("train-"))


@pytest.mark.parametrize("rule_id", sorted(TRAINING_CASES))
def test_training_rule_fires_with_the_runs_numbers(rule_id, tmp_path):
    d = run_diagnosis(rule_id, tmp_path)
    found = {f.rule_id: f for f in d.findings}
    assert rule_id in found, (rule_id, list(found))
    f = found[rule_id]
    evidence = " | ".join(f.evidence)
    for want in TRAINING_CASES[rule_id][2]:
        assert want in evidence, (want, f.evidence)
    for want in TRAINING_CASES[rule_id][3]:
        assert want in f.fix, (want, f.fix)
    assert "<" not in f.fix.replace("<run id>", "") and "<" not in evidence  # every fact was known
    assert f.cause and f.references and any(i.startswith("run directory (") for i in d.inputs)


def test_healthy_run_gives_no_findings(tmp_path):
    d = diagnose_error(run_dir=make_run(tmp_path), env={})
    assert d.findings == [], [(f.rule_id, f.evidence) for f in d.findings]
    assert d.inputs == ["run directory (74 metric records, config.json, summary.json, worker.log)",
                        "log/traceback text"]
    assert "no known problem" in d.summary


def test_three_step_run_gives_no_noise(tmp_path):
    def noisy(t, m):
        return {**m, "rollout/reward_mean": [0.1, 0.8, 0.1][t - 1], "actor/entropy": [2.0, 0.1, 0.01][t - 1],
                "critic/explained_var": -0.5, "rollout/no_signal_groups": 0.95}
    d = diagnose_error(run_dir=make_run(tmp_path, steps=3, train=noisy, evals=[0.5, 0.2]), env={})
    assert [f.rule_id for f in d.findings if f.rule_id != "train-accuracy-dropped"] == []


def test_paper_mismatch_ranks_first_when_asked_and_low_otherwise(tmp_path):
    asked = run_diagnosis("train-paper-mismatch", tmp_path / "a")
    assert asked.findings[0].rule_id == "train-paper-mismatch"
    aime = make_run(tmp_path / "b", config={"eval": {"benchmark": "aime_2024"}})
    f = diagnose_error(run_dir=aime, env={}).findings
    assert [x.rule_id for x in f] == ["train-paper-mismatch"] and f[0].score < 20
    assert "sample budget 60 steps × 128 = 7,680 responses" in " ".join(f[0].evidence)


def test_paper_question_works_from_config_toml_alone(project):
    d = diagnose_error(config_path=project / "config.toml", text=QUESTION, env={})
    assert d.findings[0].rule_id == "train-paper-mismatch"
    assert "training.batch_size 64 vs 8192" in " ".join(d.findings[0].evidence)
    assert diagnose_error(config_path=project / "config.toml", env={}).findings == []


def test_lambda_collapse_outranks_its_consequences(tmp_path):
    d = run_diagnosis("train-lambda-collapsed", tmp_path)
    assert d.findings[0].rule_id == "train-lambda-collapsed"
    assert d.summary.startswith("λ_policy collapsed")


def test_lambda_rule_skips_fixed_lambda_runs(tmp_path):
    run = make_run(tmp_path, config={"vapo": {"use_length_adaptive": False, "lambda_base": 0.0}},
                   train=collapsed_lambda)
    assert "train-lambda-collapsed" not in [f.rule_id for f in diagnose_error(run_dir=run, env={}).findings]


@pytest.mark.parametrize("log_end, kind, fix", [
    (OOM_LOG, "oom", "micro_batch_size"),
    ("Killed\n", "killed", "SIGKILL"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad shape\n", "traceback",
     "Read the exception"),
])
def test_worker_crash_fix_matches_the_crash(log_end, kind, fix, tmp_path):
    assert crash_facts("train step 1\n" + log_end)["kind"] == kind
    d = diagnose_error(run_dir=make_run(tmp_path, status=None, log_end=log_end), env={})
    assert d.findings[0].rule_id == "train-worker-crash" and fix in d.findings[0].fix


def test_traceback_followed_by_progress_is_not_a_crash():
    assert crash_facts(OOM_LOG + "train  step    12/60: reward 0.5\n") is None


def test_worker_log_feeds_the_existing_rules_and_is_scrubbed(tmp_path):
    tail = ("Traceback (most recent call last):\n  File \"baseline.py\", line 3\n"
            "openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Incorrect API key "
            "provided: "
            f"{CANARY}', 'code': 'invalid_api_key'}}}}\n")
    d = diagnose_error(run_dir=make_run(tmp_path, status=None, log_end=tail), env={}, limit=50)
    ids = [f.rule_id for f in d.findings]
    assert "train-worker-crash" in ids and "http-401-key-rejected" in ids
    assert CANARY not in d.model_dump_json()


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "nope", "not found"),
    (lambda tmp: (tmp / "file.txt", (tmp / "file.txt").write_text("x"))[0], "not found"),
    (lambda tmp: tmp, "not a run directory"),
])
def test_bad_run_dir_is_a_clear_error(make, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        diagnose_error(run_dir=make(tmp_path), env={})


def test_metrics_packing_tolerates_torn_lines_and_non_finite_values(tmp_path):
    run = make_run(tmp_path, steps=3)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "kind": "train", "time": 1, "actor/pg_loss": NaN, '
                '"critic/value_loss": "-inf"}\n')
        f.write('{"step": 5, "kind": "tra')
    d = diagnose_error(run_dir=run, env={})
    assert [f.rule_id for f in d.findings] == ["train-nan"]
    assert "2 non-finite values" in " ".join(d.findings[0].evidence)
    packed = pack_metrics([{"step": 1, "kind": "train", "a": 1, "b": "nan", "c": True}])
    assert packed["train"] == {"a": [[1, 1.0]]} and packed["nonfinite_count"] == 1


def test_training_rules_are_pure_over_evidence():
    ev = Evidence(extra={"metrics": pack_metrics([{"step": t, "kind": "train", "vapo/lambda_policy_mean": 0.0,
                                                   "rollout/response_length": 30.0} for t in range(5)]),
                         "config": TrainConfig().model_dump(mode="json")})
    f = [x for x in evaluate(ev) if x.rule_id == "train-lambda-collapsed"]
    assert f and "vapo.alpha ≈ 0.67" in f[0].fix and "α·l ≈ 0.60" in f[0].evidence[0]
