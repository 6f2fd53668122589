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
          "ablation": ["--variants", "vapo,no_positive_lm", "--jobs", "2"],
          "concurrency": [],
          "provider_samples": [],
          "memory": []}


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


def test_memory_counts_shards_and_frozen_weights(out: Path):
    """bench/memory.py: fp32 AdamW full fine-tuning holds 16 B per parameter on each ddp rank and half of that
    on each of 2 fsdp ranks (same total); LoRA's frozen weights cost 4 B per parameter, its adapters 16."""
    rec = json.loads((out / "memory.json").read_text())
    assert all(run["ok"] for run in rec["runs"].values()), rec["runs"]
    bpp = rec["bytes_per_param"]
    for model in ("policy", "value"):
        assert bpp["ddp"][model]["per_rank"] == pytest.approx(16, rel=1e-2)
        assert bpp["fsdp"][model]["per_rank"] == pytest.approx(8, rel=1e-2)
        assert bpp["fsdp"][model]["all_ranks"] == pytest.approx(16, rel=1e-2)
        assert bpp["lora"][model]["frozen_per_frozen_param"] == pytest.approx(4)
        assert bpp["lora"][model]["state_per_trained_param"] == pytest.approx(16, rel=1e-2)
    assert {r["model"] for r in rec["extrapolation"]} == {"Qwen2.5-7B", "Qwen2.5-32B"}
