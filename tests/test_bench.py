"""Each benchmark module's --smoke mode runs end to end and writes a valid JSON record, a PNG, and bench.report
renders the records (a few tiny runs of the built-in model, which ships with the package; skipped only where
its recipe was changed and not rebuilt, since a build takes minutes — `vapo-mcp build-model builtin:addition`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cached() -> bool:
    from vapo_engine.builtin_model import ready_model_dir
    return ready_model_dir(task="builtin:addition") is not None  # shipped: only a changed recipe needs a build


pytestmark = pytest.mark.skipif(not _cached(), reason="built-in tiny model's recipe changed and not rebuilt "
                                                      "(a build takes minutes: vapo-mcp build-model)")

ABLATION = "bench.experiments.ablation"
SMOKES = {  # record name: (module, its arguments besides --smoke --out)
    "throughput": ("bench.perf.throughput", ["--dtypes", "float32"]),
    "sample_efficiency": (ABLATION, ["--sample-efficiency", "--variants", "vapo,grpo"]),
    "ablation": (ABLATION, ["--variants", "vapo,no_positive_lm"]),  # in-process; the paired smoke runs --jobs
    "ablation_paired": (ABLATION, ["--budget", "3", "--variants", "vapo,rft,vapo_offline_critic",
                                   "--offline-critic-rounds", "2", "--jobs", "2"]),
    "concurrency": ("bench.perf.concurrency", []),
    "critic": ("bench.experiments.critic", ["--preset", "cpu-demo"]),
    "provider_samples": ("bench.experiments.provider_samples", []),
    "memory": ("bench.perf.memory", []),
    "rollout_backends": ("bench.perf.rollout_backends", [])}


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench")


def smoke(out: Path, name: str) -> dict:
    """Run one benchmark's --smoke into `out` (once per module; each test that needs it pays for it inside
    its own timeout) and return its record."""
    record = out / f"{name}.json"
    if not record.is_file():
        module, args = SMOKES[name]
        r = subprocess.run([sys.executable, "-m", module, "--smoke", "--out", str(out), *args,
                            *(["--critic-dir", str(out / "critics")] if name == "ablation_paired" else [])],
                           check=False, cwd=ROOT, timeout=300, capture_output=True, text=True)
        assert r.returncode == 0, f"{module} {' '.join(args)} --smoke failed:\n{r.stderr[-3000:]}"
    return json.loads(record.read_text())


TWO_PROCESSES = {"concurrency", "memory", "ablation_paired", "rollout_backends"}  # two busy processes or more


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.two_processes) if n in TWO_PROCESSES else n
                                  for n in SMOKES])
def test_smoke_writes_record_and_plot(out: Path, name: str):
    rec = smoke(out, name)
    assert rec["benchmark"] == name
    assert rec["config"].get("smoke") is True or rec["config"].get("mode") == "smoke"
    assert rec["machine"]["cpu_model"] and rec["machine"]["torch"]
    assert rec["command"].startswith(f".venv/bin/python -m {SMOKES[name][0]} --smoke")
    assert (out / f"{name}.png").stat().st_size > 1000


def test_report_renders_tables_from_the_records(out: Path, tmp_path: Path):
    from bench import report
    for name in SMOKES:
        smoke(out, name)
    for f in out.glob("*.*"):  # the smoke's paired record stands in for the headline one
        name = f.name.replace("ablation_paired", "ablation_chain_paired")
        (tmp_path / name).write_bytes(f.read_bytes())
    text = report.render_results(tmp_path)
    assert text.count("|---|") >= 4 and "float32" in text and "grpo" in text
    assert "area under the sampled curve" in text and "rejection-sampling" in text
    assert "| server-2 | 2 |" in text and "not an engine's speed-up" in text


def test_paired_smoke_shares_one_critic_and_counts_its_rollouts(out: Path):
    """--budget: the rows that pretrain a critic use the seed's one shared critic and spend its rounds of the
    budget; the others spend the whole budget on policy steps."""
    rec = smoke(out, "ablation_paired")
    runs = {r["variant"]: r for r in rec["runs"]}
    rounds = rec["critics"]["1"]["rounds"]
    assert rounds >= 1 and runs["vapo"]["pretrain_rollouts"] == rounds and runs["vapo"]["shared_critic"]
    assert runs["rft"]["pretrain_rollouts"] == 0  # a row without value pretraining
    upr = runs["vapo"]["updates_per_rollout"]
    assert runs["vapo"]["steps"] == (3 - rounds) * upr and runs["rft"]["steps"] == 3 * upr
    assert {r["variant"] for r in rec["table"]} == {"vapo", "rft", "vapo_offline_critic"}
    off = runs["vapo_offline_critic"]  # its critic pretrained once, outside the budget: every rollout a policy step
    assert rec["critics"]["vapo_offline_critic"]["rounds"] == 2 and off["pretrain_rollouts"] == 0
    assert off["steps"] == 3 * upr and "model.value_path=" in " ".join(off["overrides"])


def test_memory_counts_shards_and_frozen_weights(out: Path):
    """bench.perf.memory: fp32 AdamW full fine-tuning holds 16 B per parameter on each ddp rank and half of that
    on each of 2 fsdp ranks (same total); LoRA's frozen weights cost 4 B per parameter, its adapters 16."""
    rec = smoke(out, "memory")
    assert all(run["ok"] for run in rec["runs"].values()), rec["runs"]
    bpp = rec["bytes_per_param"]
    for model in ("policy", "value"):
        assert bpp["ddp"][model]["per_rank"] == pytest.approx(16, rel=1e-2)
        assert bpp["fsdp"][model]["per_rank"] == pytest.approx(8, rel=1e-2)
        assert bpp["fsdp"][model]["all_ranks"] == pytest.approx(16, rel=1e-2)
        assert bpp["lora"][model]["frozen_per_frozen_param"] == pytest.approx(4)
        assert bpp["lora"][model]["state_per_trained_param"] == pytest.approx(16, rel=1e-2)
    assert {r["model"] for r in rec["extrapolation"]} == {"Qwen2.5-7B", "Qwen2.5-32B"}


def test_rollout_backends_times_hf_and_one_and_two_replicas(out: Path):
    """bench.perf.rollout_backends: each scenario trained for real (tokens generated, steps timed), the server ones
    through serve-model processes, with the load average around every run."""
    rec = smoke(out, "rollout_backends")
    rows = {r["scenario"]: r for r in rec["rows"]}
    assert [(n, r["replicas"]) for n, r in rows.items()] == [("hf", 0), ("server-1", 1), ("server-2", 2)]
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["s_per_step"] > 0 and r["response_length"] > 0
        assert len(r["load_avg_rounds"]) == 1 and all(len(x) == 3 for x in r["load_avg_rounds"][0])
    assert rows["hf"]["s_per_step_vs_hf"] == 1.0 and rec["config"]["replica_threads"]["server-2"] >= 1
