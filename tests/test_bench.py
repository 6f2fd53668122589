"""Each bench script's --smoke mode runs end to end and writes a valid JSON record, a PNG, and report.py
renders the records (a few tiny runs of the built-in model; skipped when that model is not cached yet,
since building it takes minutes — `bash scripts/demo.sh` or any training run builds it)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cached() -> bool:
    from vapo_engine.builtin_model import BuildRecipe, cache_root, is_complete
    return is_complete(cache_root() / BuildRecipe().folder_name())


pytestmark = pytest.mark.skipif(not _cached(), reason="built-in tiny model not cached (first build takes minutes)")

SMOKES = {"throughput": ["--dtypes", "float32"],
          "sample_efficiency": ["--algos", "vapo,grpo"],
          "ablation": ["--variants", "vapo,no_positive_lm"],
          "concurrency": [],
          "provider_samples": []}


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bench")
    for name, extra in SMOKES.items():
        subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke", "--out", str(folder), *extra],
                       check=True, cwd=ROOT, timeout=300, capture_output=True)
    return folder


@pytest.mark.parametrize("name", list(SMOKES))
def test_smoke_writes_record_and_plot(out: Path, name: str):
    rec = json.loads((out / f"{name}.json").read_text())
    assert rec["benchmark"] == name
    assert rec["config"].get("smoke") is True or rec["config"].get("mode") == "smoke"
    assert rec["machine"]["cpu_model"] and rec["machine"]["torch"]
    assert "--smoke" in rec["command"]
    assert (out / f"{name}.png").stat().st_size > 1000


def test_report_renders_tables_from_the_records(out: Path):
    text = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--results", str(out)],
                          check=True, cwd=ROOT, capture_output=True, text=True).stdout
    assert text.count("|---|") >= 4 and "full VAPO" in text and "float32" in text and "grpo" in text
    assert "two-sized" in text
