"""The built-in tiny model: tokenizer round-trip, HF directory loading, a few SFT steps, the atomic cache."""
from __future__ import annotations

import json
import random
import string
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from vapo_engine.builtin_model import (
    DONE_MARKER,
    BuildRecipe,
    build_tokenizer,
    builtin_model_dir,
    cache_root,
    is_complete,
    make_config,
    make_model,
    make_model_dir,
)
from vapo_engine.builtin_model import build as tiny_model
from vapo_engine.builtin_model.recipes import BUILTIN_VERSION
from vapo_engine.builtin_model.sft import encode_sft_batch, evaluate, sft_warm_start
from vapo_engine.rollout.tokenizer import load_tokenizer
from vapo_engine.tasks import AdditionTask, get_task

ROOT = Path(__file__).resolve().parents[1]
TINY = {"hidden": 32, "layers": 1, "heads": 2}
TINY_BUILD = {**TINY, "max_steps": 3, "batch_size": 4, "eval_every": 3, "val_size": 4, "report_size": 4}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_round_trips_text_exactly(tokenizer):
    texts = [string.printable.replace("\t", "").replace("\r", "").replace("\x0b", "").replace("\x0c", ""),
             "  two  spaces , before . punctuation ?\n", "0047+0385=7+5+0=2,4+8+1=3;432", "a\n\nb", ""]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and len(ids) == len(text) + 1  # one token per character
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    unknown = tokenizer("é\tx")["input_ids"]  # characters outside the vocabulary -> <unk>, dropped on decode
    assert tokenizer.decode(unknown, skip_special_tokens=True) == "x"
    assert len(tokenizer) == 4 + 95 + 1
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.padding_side == "left" and tokenizer.chat_template is None


def test_default_model_is_about_one_million_parameters(tokenizer):
    cfg = make_config(tokenizer)
    sizes = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size)
    assert sizes == (128, 4, 4, 512)
    assert cfg.tie_word_embeddings
    model = make_model(tokenizer)
    n = sum(p.numel() for p in model.parameters())
    assert 0.8e6 < n < 1.3e6 and next(model.parameters()).dtype == torch.float32
    assert make_model(tokenizer, **TINY, seed=3).state_dict()["model.norm.weight"].shape == (32,)
    a, b = make_model(tokenizer, **TINY, seed=3), make_model(tokenizer, **TINY, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_model_dir_loads_and_its_tokenizer_round_trips_whitespace(tmp_path):
    """Saved and loaded, the tokenizer is still one token per character, spaces and newlines included
    (transformers 5's AutoTokenizer alone rebuilds it as a Qwen2 BPE tokenizer that drops them)."""
    from vapo_engine.rollout.tokenizer import load_tokenizer
    out = make_model_dir(tmp_path / "m", **TINY, seed=1)
    tok = load_tokenizer(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert tok.padding_side == "left"
    text = "52 a-3 b+9\na 52-3=49\n;49"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) + 1 and tok.decode(ids, skip_special_tokens=True) == text
    assert tok(text)["input_ids"] == build_tokenizer()(text)["input_ids"]
    enc = tok(["1+1=", "12+34="], return_tensors="pt", padding=True)
    assert enc["attention_mask"][0].tolist()[:2] == [0, 0]  # left padding
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (2, enc["input_ids"].shape[1], len(tok)) and torch.isfinite(logits).all()


def test_sft_batch_masks_prompt_and_keeps_eos(tokenizer):
    batch = encode_sft_batch(tokenizer, ["12+3=", "1+1="], ["15;15", "2;2"])
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape == (2, 1 + 5 + 5 + 1)
    assert labels[0].tolist() == [-100] * 6 + tokenizer("15;15", add_special_tokens=False)["input_ids"] + [2]
    assert labels[1, 5:9].tolist()[-1] == tokenizer.eos_token_id and (labels[1, 9:] == -100).all()
    assert mask[1].tolist() == [1] * 9 + [0] * 3 and (ids[1, 9:] == tokenizer.pad_token_id).all()


def test_few_sft_steps_reduce_loss(tokenizer):
    model = make_model(tokenizer, hidden=64, layers=2, heads=4, seed=0)
    logs = []
    metrics = sft_warm_start(model, tokenizer, AdditionTask(), max_steps=30, batch_size=16, lr=3e-3,
                             eval_every=30, val_size=8, warmup_steps=5, log=logs.append)
    losses = metrics["losses"]
    assert len(losses) == 30 and metrics["steps"] == 30 and metrics["stop_reason"] == "max_steps"
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:3]) / 3
    assert 0.0 <= metrics["val_greedy_acc"] <= 1.0 and 0.0 <= metrics["val_sampled_acc"] <= 1.0
    assert logs and "greedy acc" in logs[-1] and model.training is True


def test_evaluate_counts_correct_responses(tokenizer, monkeypatch):
    task = get_task("builtin:addition")
    problems = task.heldout(4)
    from vapo_engine.rollout import evaluate as rollout_evaluate

    texts = [task.reference_solution(problems[0]), "junk", task.reference_solution(problems[2]), ";1"]
    monkeypatch.setattr(rollout_evaluate, "generate", lambda *a, **k: SimpleNamespace(texts=texts))
    assert evaluate(None, tokenizer, task, problems, max_new_tokens=5) == 0.5
    assert evaluate(None, tokenizer, task, [], max_new_tokens=5) == 0.0


# ------------------------------------------------------------------------------------------------ cache


def test_cache_root_prefers_argument_then_env(tmp_path, monkeypatch):
    monkeypatch.setenv("VAPO_MCP_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("VAPO_MCP_CACHE")
    assert cache_root().parts[-2:] == (".cache", "vapo-mcp")


def test_recipe_folder_names_are_versioned_and_distinct():
    default = BuildRecipe().folder_name()
    assert default == f"tiny-addition-v{BUILTIN_VERSION}"
    assert BuildRecipe(max_steps=5).folder_name() != default
    assert BuildRecipe(max_steps=5).folder_name() == BuildRecipe(max_steps=5).folder_name()
    assert BuildRecipe(num_threads=1).folder_name() == default
    with pytest.raises(TypeError):
        BuildRecipe(bogus=1)


def test_builtin_model_dir_builds_once_and_ignores_killed_builds(tmp_path):
    final = tmp_path / BuildRecipe(**TINY_BUILD).folder_name()
    # leftovers of a killed build: a half-written final folder (no marker) and a temporary folder
    final.mkdir(parents=True)
    (final / "config.json").write_text("{half")
    stale_tmp = tmp_path / f".tmp-{final.name}.123-deadbeef"
    other_recipe_tmp = tmp_path / f".tmp-{final.name}-0123456789.456-cafe"  # another recipe's live build
    other_recipe_tmp.mkdir()
    stale_tmp.mkdir()
    (stale_tmp / "model.safetensors").write_bytes(b"\0" * 10)

    logs: list[str] = []
    out = builtin_model_dir(tmp_path, log=logs.append, **TINY_BUILD)
    assert out == final and is_complete(out) and not stale_tmp.exists()
    assert list(tmp_path.glob(".tmp-*")) == [other_recipe_tmp]
    metrics = json.loads((out / "sft_metrics.json").read_text())
    assert metrics["steps"] == 3 and "heldout_greedy_acc" in metrics and "build_seconds" in metrics
    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == 32
    assert load_tokenizer(out).eos_token == "<eos>"
    stamp = (out / DONE_MARKER).read_text()

    logs.clear()
    assert builtin_model_dir(tmp_path, log=logs.append, **TINY_BUILD) == out
    assert not logs and (out / DONE_MARKER).read_text() == stamp  # cached: not rebuilt


def test_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(tmp, recipe, log, start=None):
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt  # like a kill in the middle of training

    monkeypatch.setattr(tiny_model, "_build_into", boom)
    with pytest.raises(KeyboardInterrupt):
        builtin_model_dir(tmp_path, log=lambda s: None, **TINY_BUILD)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_concurrent_builder_that_loses_the_rename_uses_the_winner(tmp_path, monkeypatch):
    real_build = tiny_model._build_into
    final = tmp_path / BuildRecipe(**TINY_BUILD).folder_name()

    def build_then_someone_else_wins(tmp, recipe, log, start=None):
        metrics = real_build(tmp, recipe, log, start)
        winner = tmp_path / "winner"
        winner.mkdir()
        (winner / "config.json").write_text("{}")
        (winner / DONE_MARKER).write_text("{}")
        winner.rename(final)  # another process (without our lock) finished first
        return metrics

    monkeypatch.setattr(tiny_model, "_build_into", build_then_someone_else_wins)
    random.seed(0)
    out = builtin_model_dir(tmp_path, log=lambda s: None, **TINY_BUILD)
    assert out == final and (out / "config.json").read_text() == "{}"
    assert not list(tmp_path.glob(".tmp-*"))


def test_two_processes_building_at_once_share_one_build(tmp_path):
    code = ("import json, sys\n"
            "from vapo_engine.builtin_model import builtin_model_dir\n"
            f"kw = json.loads({json.dumps(json.dumps(TINY_BUILD))})\n"
            "print('DIR', builtin_model_dir(sys.argv[1], **kw))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    dirs = {line for out in outputs for line in out.splitlines() if line.startswith("DIR ")}
    assert len(dirs) == 1 and is_complete(dirs.pop()[4:])
    assert sum(out.count("building the built-in tiny model") for out in outputs) == 1
    assert not list(tmp_path.glob(".tmp-*"))
