"""Bench record plumbing that needs no model: which earlier runs an ablation may reuse (same budget, preset and
extra overrides only), Welch's interval, and the chain ablation's README table."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ablation
import report
from stats import welch_ci


def _run(variant: str, seed: int, greedy: float, long: float) -> dict:
    curve = [{"step": 0, "greedy": 0.45, "greedy_long": 0.15, "greedy_mid": 0.5},
             {"step": 30, "greedy": greedy, "greedy_long": long, "greedy_mid": greedy}]
    return {"variant": variant, "seed": seed, "curve": curve, "final_greedy": greedy, "final_sampled": greedy - 0.1,
            "final_greedy_long": long, "final_greedy_mid": greedy, "wall_s": 1.0, "mean_explained_var": 0.4,
            "mean_lambda_policy": 0.9, "mean_response_length": 80.0}


def _record(path: Path, extra: list[str], steps: int = 30) -> str:
    cfg = {"preset": "chain-demo", "steps": steps, "eval_interval": 15, "extra_overrides": extra, "mode": "full"}
    path.write_text(json.dumps({"config": cfg, "runs": [_run("vapo", 1, 0.5, 0.2), _run("grpo", 1, 0.4, 0.1)]}))
    return str(path)


def test_reuse_needs_the_same_extra_overrides(tmp_path: Path):
    lr = ["training.learning_rate=2e-4"]
    a = _record(tmp_path / "a.json", lr)
    b = _record(tmp_path / "b.json", [])
    assert set(ablation.reusable(a, 30, 15, "chain-demo", tuple(lr))) == {("vapo", 1), ("grpo", 1)}
    assert ablation.reusable(a, 30, 15, "chain-demo", ()) == {}
    assert ablation.reusable(b, 30, 15, "chain-demo", tuple(lr)) == {}
    assert ablation.reusable(a, 60, 15, "chain-demo", tuple(lr)) == {}
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


def test_chain_ablation_table_shows_intervals_per_row():
    runs = [_run("vapo", s, g, lg) for s, g, lg in ((1, 0.60, 0.20), (2, 0.62, 0.25), (3, 0.58, 0.15))]
    runs += [_run("grpo", s, g, lg) for s, g, lg in ((1, 0.50, 0.10), (2, 0.49, 0.12), (3, 0.52, 0.11))]
    table = ablation.summarize(runs, ["vapo", "grpo"], 0.9)
    grpo = table[1]
    assert grpo["vs_vapo_final_greedy"]["significant"] is True
    assert grpo["vs_vapo_final_greedy_long"]["delta"] == pytest.approx(-0.09)
    rec = {"config": {"preset": "chain-demo", "steps": 30, "seeds": [1, 2, 3], "eval_interval": 15,
                      "extra_overrides": ["training.learning_rate=2e-4"]},
           "table": table, "runs": runs, "paper_note": "paper note", "wall_s_total": 1.0, "command": "x",
           "date_utc": "d", "machine": {"cpu_model": "cpu", "logical_cores": 2, "torch": "t"}}
    text = report.ablation_chain(rec)
    row = next(line for line in text.splitlines() if "GRPO (critic-free" in line)
    assert "-0.097 [" in row and "]*" in row
    assert "`training.learning_rate=2e-4`" in text and "long 0.150" in text
