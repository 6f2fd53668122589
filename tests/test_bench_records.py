"""Bench record plumbing that needs no model: which earlier runs an ablation may reuse, Welch's interval, the
paired design's area / Holm correction / exact t, and `python -m bench.report --check` (committed results equal what
the records render; a planted number or an unreproducible record fails)."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.experiments import ablation
from bench.lib import paired, render, stats
from bench.lib.stats import welch_ci
from tests.conftest import ROOT


def _run(variant: str, seed: int, greedy: float, long: float) -> dict:
    curve = [{"step": 0, "greedy": 0.45, "greedy_long": 0.15, "greedy_mid": 0.5},
             {"step": 30, "greedy": greedy, "greedy_long": long, "greedy_mid": greedy}]
    return {"variant": variant, "seed": seed, "curve": curve, "final_greedy": greedy, "final_sampled": greedy - 0.1,
            "final_greedy_long": long, "final_greedy_mid": greedy, "wall_s": 1.0, "mean_explained_var": 0.4,
            "mean_lambda_policy": 0.9, "mean_response_length": 80.0}


def _record(path: Path, extra: list[str], steps: int = 30) -> str:
    cfg = {"preset": "chain-noisy-sft", "steps": steps, "eval_interval": 15, "extra_overrides": extra, "mode": "full"}
    path.write_text(json.dumps({"config": cfg, "runs": [_run("vapo", 1, 0.5, 0.2), _run("grpo", 1, 0.4, 0.1)]}))
    return str(path)


def test_reuse_needs_the_same_extra_overrides(tmp_path: Path):
    lr = ["training.learning_rate=2e-4"]
    a = _record(tmp_path / "a.json", lr)
    b = _record(tmp_path / "b.json", [])
    assert set(ablation.reusable(a, 30, 15, "chain-noisy-sft", tuple(lr))) == {("vapo", 1), ("grpo", 1)}
    assert ablation.reusable(a, 30, 15, "chain-noisy-sft", ()) == {}
    assert ablation.reusable(b, 30, 15, "chain-noisy-sft", tuple(lr)) == {}
    assert ablation.reusable(a, 60, 15, "chain-noisy-sft", tuple(lr)) == {}
    assert ablation.reusable(a, 30, 15, "cpu-demo", tuple(lr)) == {}
    assert ablation.parse_args(["--set", lr[0], "--set", "vapo.alpha=0.5"]).overrides == [lr[0], "vapo.alpha=0.5"]


def test_welch_interval_matches_a_hand_computation():
    d = welch_ci([0.5, 0.6, 0.7], [0.2, 0.3, 0.4])
    # equal variances 0.01, n 3 each: se = sqrt(2 * 0.01 / 3), df = 4, t = 2.776
    assert d["delta"] == pytest.approx(0.3) and d["df"] == pytest.approx(4.0)
    assert d["ci95"] == pytest.approx([0.3 - 2.776 * 0.08165, 0.3 + 2.776 * 0.08165], abs=1e-3)
    assert d["significant"] is True
    assert welch_ci([0.5, 0.7, 0.6], [0.55, 0.65, 0.6])["significant"] is False
    assert welch_ci([0.5], [0.4, 0.5])["ci95"] is None


def _budget_run(variant: str, seed: int, points: list[tuple[int, float]], pretrain: int = 0) -> dict:
    return {"variant": variant, "seed": seed, "pretrain_rollouts": pretrain, "updates_per_rollout": 2,
            "curve": [{"step": s, "sampled": y} for s, y in points], "wall_s": 1.0}


def test_area_counts_value_pretraining_as_a_flat_stretch():
    """A row that pretrains its critic for 2 rollouts starts its curve at rollout 2, flat before it."""
    run = _budget_run("vapo", 1, [(0, 0.2), (4, 0.4), (12, 0.6)], pretrain=2)  # 2 updates per rollout
    pts = paired.budget_curve(run, "sampled")
    assert pts == [(0.0, 0.2), (2.0, 0.2), (4.0, 0.4), (8.0, 0.6)]
    # trapezoids: 2 x 0.2, 2 x 0.3, 4 x 0.5 over a budget of 8 rollouts
    assert paired.area(pts, 8) == pytest.approx((0.4 + 0.6 + 2.0) / 8)
    assert paired.reach(pts, 0.4) == 4.0 and paired.reach(pts, 0.9) is None
    assert paired.area([(0.0, 0.2), (4.0, 0.4)], 8) == pytest.approx((4 * 0.3 + 4 * 0.4) / 8)  # held to the end


def test_paired_rows_are_holm_corrected_against_vapo():
    base = [0.30, 0.35, 0.28, 0.33, 0.31]
    runs = [_budget_run("vapo", s, [(0, 0.1), (16, y)]) for s, y in enumerate(base, 1)]
    runs += [_budget_run("grpo", s, [(0, 0.1), (16, y - 0.10 + 0.005 * s)]) for s, y in enumerate(base, 1)]
    runs += [_budget_run("rft", s, [(0, 0.1), (16, y + (0.02 if s % 2 else -0.02))]) for s, y in enumerate(base, 1)]
    rows = {r["variant"]: r for r in paired.compare(runs, ["vapo", "grpo", "rft"], "sampled", 8, 0.3)}
    assert rows["vapo"]["vs_base"] is None
    g, r = rows["grpo"]["vs_base"], rows["rft"]["vs_base"]
    assert g["resolved"] and g["level"] == pytest.approx(0.025) and g["ci"][1] < 0  # smallest p: α / 2
    assert not r["resolved"] and r["level"] == pytest.approx(0.05) and r["ci"][0] < 0 < r["ci"][1]
    assert g["p_holm"] == pytest.approx(2 * g["p"])
    text = render._resolution(list(rows.values()), 5)
    assert text.startswith("**Resolved** at 5 seeds: baseline: GRPO") and "**Not resolved**" in text


def test_t_quantiles_match_the_table():
    table = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
             2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048]
    for df, t in enumerate(table, 1):  # two-sided 95% quantiles, df 1-28, from a printed table
        assert stats.t_quantile(0.05, df) == pytest.approx(t, abs=2e-3)
    assert stats.t_two_sided_p(2.776, 4) == pytest.approx(0.05, abs=1e-3)


def test_committed_results_match_the_records():
    """What CI runs: docs/results.md and the README's results block are exactly what the records render, and
    every committed record is reproducible from the repository root."""
    assert report.check() == []


def _copy_project(tmp: Path) -> Path:
    root = tmp / "p"
    (root / "docs").mkdir(parents=True)
    (root / "bench").mkdir()
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copy(ROOT / "docs" / "results.md", root / "docs" / "results.md")
    shutil.copytree(ROOT / "bench" / "results", root / "bench" / "results")
    return root


def test_check_fails_on_a_number_without_a_record(tmp_path: Path):
    root = _copy_project(tmp_path)
    assert report.check(root) == []
    readme = (root / "README.md").read_text()
    (root / "README.md").write_text(readme.replace(report.END, "VAPO beats GRPO by 12.5 points.\n" + report.END))
    problems = report.check(root)
    assert len(problems) == 1 and "results block" in problems[0] and "12.5 points" in problems[0]
    (root / "README.md").write_text(readme)
    doc = root / "docs" / "results.md"
    doc.write_text(doc.read_text().replace("## ", "## (0.97 accuracy) ", 1))
    assert any("docs/results.md" in p and "0.97" in p for p in report.check(root))
    assert report.main(["--check", "--root", str(root)]) == 1


def test_check_names_records_that_cannot_be_reproduced(tmp_path: Path):
    root = _copy_project(tmp_path)
    path = root / "bench" / "results" / "sample_efficiency.json"
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "command": rec["command"] + " --out /tmp/x"}))
    problems = report.record_problems(root / "bench" / "results")
    assert problems == ["sample_efficiency.json: command names a path outside the repository ('/tmp/x')"]
    path.write_text(json.dumps({**rec, "command": "python /home/me/sweep.py"}))
    assert "does not run a module of bench" in report.record_problems(root / "bench" / "results")[0]
    path.write_text(json.dumps({**rec, "command": ".venv/bin/python -m bench.sample_efficiency --steps 200"}))
    assert "does not run a module of bench" in report.record_problems(root / "bench" / "results")[0]


def test_sample_efficiency_record_is_an_ablation_option():
    """The committed sample-efficiency record: its command plans the runs its config names, and the ablation's
    summary of its runs is the summary it holds."""
    rec = json.loads((ROOT / "bench" / "results" / "sample_efficiency.json").read_text())
    argv, c = shlex.split(rec["command"]), rec["config"]
    assert argv[1:3] == ["-m", "bench.experiments.ablation"]
    args = ablation.parse_args(argv[3:])
    steps, seeds, every, extra = ablation.plan(args)
    assert args.sample_efficiency and (steps, seeds, every, list(extra)) == (c["steps"], c["seeds"],
                                                                             c["eval_interval"], c["extra_overrides"])
    assert args.variants.split(",") == c["algos"] and args.target == c["target_greedy"] and args.preset == c["preset"]
    assert ablation.summarize_algorithms(rec["runs"], c["algos"], c["target_greedy"]) == rec["summary"]


def test_critic_ceiling_removes_the_monte_carlo_noise():
    """Returns R ~ Bernoulli(V) per state; Monte-Carlo values from m = 4 continuations are noisy, so their own EV
    is below the true value function's (Var V / Var R); the ceiling adds the noise back and lands on it."""
    import random

    from bench.experiments import critic
    rng = random.Random(0)
    v = [rng.choice([0.1, 0.3, 0.6, 0.9]) for _ in range(20000)]
    ret = [float(rng.random() < x) for x in v]
    mc = [sum(rng.random() < x for _ in range(4)) / 4 for x in v]
    groups = [i // 16 for i in range(len(v))]
    t = critic.ev_table(ret, {"true V": v}, mc, groups, 4)["overall"]
    mean_v = sum(v) / len(v)
    var_v = sum((x - mean_v) ** 2 for x in v) / len(v)
    mean_r = sum(ret) / len(ret)
    truth = var_v / (mean_r * (1 - mean_r))
    assert t["true V"] == pytest.approx(truth, abs=0.02)  # the true V as the critic
    assert t["monte_carlo"] < truth - 0.05 and t["ceiling"] == pytest.approx(truth, abs=0.02)


def test_trl_section_says_how_many_rounds_and_which_columns_are_one_run():
    """The TRL side-by-side section states the record's rounds (not 'one run per side' for a 3-round record), and
    labels the per-run columns as one run's (the first round's), the step cost as the median over the rounds."""
    from bench.lib import render_trl
    rec = json.loads((ROOT / "bench" / "results" / "trl_side_by_side.json").read_text())
    assert rec["config"]["repeats"] == 3
    assert "(3 interleaved rounds, every side once per round)" in render_trl.question(rec)
    table = render_trl.trl_side_by_side(rec)
    assert "| s / optimizer step (median of 3 rounds) |" in table and "| training s per run (round 1) |" in table
    assert "training s total" not in table
    single = {**rec, "config": {**rec["config"], "repeats": 1}}
    assert render_trl.question(single).endswith("(one run per side).")
    assert "| s / optimizer step | vs TRL GRPO | greedy start → final |" in render_trl.trl_side_by_side(single)
    assert render_trl.question(rec) in report.render_results(ROOT / "bench" / "results")


def test_smoke_answers_count_as_ending_on_the_number_only_when_their_last_number_is_it():
    from bench.lib.render_smollm import ends_on
    answers = [{"answer_tail": "240 km / 3 hours = 80 km/h."}, {"answer_tail": "The answer is 80.0"},
               {"answer_tail": "= 80 km per hour; 80 / 3 = 24 km per hour per hour."},
               {"answer_tail": "It is 180 km/h."}, {"answer_tail": "no number here"},
               {"answer_tail": "1,080 km in total"}]
    assert ends_on(answers, "80") == 2


def test_suite_time_reads_a_real_pytest_summary_and_renders_two_suites(tmp_path: Path):
    """bench.perf.suite_time: the counts and seconds come from pytest's own last line (a real pytest run here, one
    test of each outcome); the section names both commits, the host's speed and the ratio of the two suites."""
    from bench.lib import render_suite
    from bench.perf import suite_time
    (tmp_path / "test_three.py").write_text("import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n"
                                            "    assert 1 == 2\n\ndef test_c():\n    pytest.skip('no')\n")
    for quiet in ([], ["-q"]):
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *quiet,
                            "test_three.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        got = suite_time.pytest_summary(r.stdout)
        assert {k: got[k] for k in ("passed", "failed", "skipped", "errors")} == \
               {"passed": 1, "failed": 1, "skipped": 1, "errors": 0}, r.stdout[-800:]
        assert 0 < got["pytest_s"] < 120
    assert suite_time.pytest_summary("Killed\n") == {}
    host = {"matmul_fp32_gflops_2_threads": 65.0, "trainer_import_s": 8.1}
    suite = {"exit_code": 0, "passed": 10, "skipped": 1, "load_avg_start": [0.5, 0.6, 0.7]}
    rec = {"suites": [{**suite, "commit": "a" * 40, "pytest_s": 600.0, "wall_s_total": 690.0},
                      {**suite, "commit": "b" * 40, "pytest_s": 500.0, "wall_s_total": 580.0}],
           "host_before": host, "host_after": {**host, "matmul_fp32_gflops_2_threads": 64.0},
           "machine": {"cpu_model": "cpu", "logical_cores": 2, "torch": "2"}, "command": "c", "wall_s_total": 1300.0,
           "load_avg_start": [0.5], "load_avg_end": [1.5], "date_utc": "now"}
    text = render_suite.suite_time(rec)
    assert "| aaaaaaaaaa | 0 | 10 passed, 1 skipped | 600.0 | 690 s (11.5 min) |" in text
    assert "65.0 / 64.0 GFLOP/s" in text and "HEAD's pytest took 1.20× the time of bbbbbbbbbb's" in text
    with pytest.raises(SystemExit, match="--ref 'nope': not a commit"):
        suite_time.resolve("nope")
