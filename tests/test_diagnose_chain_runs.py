"""The training rules on real runs of builtin:chain (scripts/record_chain_runs.py recorded them into tests/data): each
rule fires on the run that has its symptom, and none of them fires on the healthy run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.diagnose import diagnose_error

DATA = Path(__file__).resolve().parent / "data" / "chain_runs"
CASES = json.loads((DATA / "cases.json").read_text())["cases"] if (DATA / "cases.json").is_file() else []
SYMPTOM_RULES = {"train-value-collapse", "train-lambda-collapsed", "train-length-not-growing", "train-oscillating"}


def _fired(run_dir: Path) -> set[str]:
    return {f.rule_id for f in diagnose_error(run_dir=run_dir).findings if f.category == "training"}


def test_the_recorded_cases_exist():
    assert {c["case"] for c in CASES} >= {"healthy", "value_collapse", "lambda_collapsed", "collapse"}


@pytest.mark.parametrize("case", [c for c in CASES if c["expected"]], ids=lambda c: c["case"])
def test_the_symptoms_rule_fires_on_its_run(case):
    fired = _fired(DATA / case["case"])
    assert set(case["expected"]) <= fired, fired


def test_the_healthy_run_stays_quiet():
    assert not _fired(DATA / "healthy") & SYMPTOM_RULES


@pytest.mark.parametrize("case", [c for c in CASES if c["expected"]], ids=lambda c: c["case"])
def test_each_symptom_run_fires_no_unrelated_symptom_rule(case):
    """A broken run may show consequences (a dead critic also stalls learning), but the λ and oscillation
    rules must not fire where their cause is absent."""
    fired = _fired(DATA / case["case"]) & SYMPTOM_RULES
    unrelated = {"train-lambda-collapsed", "train-oscillating"} - set(case["expected"])
    assert not fired & unrelated, fired
