"""The built-in models shipped with the package: each folder loads with transformers (no remote code), was built
from the current recipe (its recorded recipe hash), scores in its recorded held-out band, and is only ever read;
`builtin_model_dir` uses it while the recipe is unchanged and builds in the cache otherwise (builds faked here:
CI never runs a full build), and `vapo-mcp build-model` builds one on request."""
from __future__ import annotations

import dataclasses
import fnmatch
import json
from pathlib import Path

import pytest
import tomllib

from vapo_engine.builtin_model import build
from vapo_engine.builtin_model.build import DONE_MARKER, builtin_model_dir, is_current, ready_model_dir
from vapo_engine.builtin_model.recipes import RECIPES, Phase
from vapo_engine.builtin_model.shipped import (
    BAND_FILE,
    RECIPE_FILE,
    SHIPPED_ROOT,
    heldout_accuracy,
    shipped_folder,
    shipped_names,
)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["builtin:addition", "builtin:chain", "builtin:chain@planted-stop", "builtin:chain@v1", "builtin:crates"]


def _tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _no_build(line: str) -> None:
    raise AssertionError(f"a shipped model was built: {line}")


def test_every_built_in_model_ships_with_its_recipe_hash():
    assert sorted(shipped_names()) == sorted(SHIPPED) == sorted(RECIPES)
    for name in SHIPPED:
        recipe, folder = RECIPES[name], shipped_folder(RECIPES[name])
        assert folder == SHIPPED_ROOT / recipe.folder_name()
        recorded = json.loads((folder / RECIPE_FILE).read_text())
        assert recorded["name"] == name and recorded["recipe_hash"] == recipe.recipe_hash()
        metrics = json.loads((folder / "sft_metrics.json").read_text())  # the build's own record of its recipe
        built = {k: v for k, v in metrics["recipe"].items() if k != "num_threads"}
        assert built == {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(recipe))).items()
                         if k != "num_threads"}
        if recipe.start:
            assert metrics["start"] == RECIPES[recipe.start].folder_name()
        assert is_current(folder, recipe) and (folder / "model.safetensors").stat().st_size < 5_000_000


def test_recipe_hash_covers_the_recipe_and_its_start_but_not_threads(monkeypatch):
    chain = RECIPES["builtin:chain"]
    assert chain.recipe_hash() == RECIPES["builtin:chain"].recipe_hash()
    assert dataclasses.replace(chain, num_threads=1).recipe_hash() == chain.recipe_hash()
    assert dataclasses.replace(chain, lr=1e-3).recipe_hash() != chain.recipe_hash()
    before = chain.recipe_hash()
    monkeypatch.setitem(RECIPES, "builtin:chain@v1", dataclasses.replace(RECIPES["builtin:chain@v1"], max_steps=1))
    assert chain.recipe_hash() != before  # a changed start model changes what continues it
    assert shipped_folder(chain) is None and shipped_folder(RECIPES["builtin:chain@v1"]) is None


def test_runs_use_the_shipped_folders_without_building(tmp_path):
    for name in SHIPPED:
        out = builtin_model_dir(tmp_path, task=name, log=_no_build)
        assert out == shipped_folder(RECIPES[name]) == ready_model_dir(tmp_path, task=name)
        assert builtin_model_dir(tmp_path, task=name, log=_no_build, num_threads=1) == out
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing cached


@pytest.fixture
def one_thread():
    """One torch thread: a 1M-parameter model gains nothing from more, and a loaded machine costs them dearly."""
    import torch
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_loads_and_scores_in_its_recorded_band(name, one_thread):
    from transformers import AutoModelForCausalLM

    folder, recipe = shipped_folder(RECIPES[name]), RECIPES[name]
    before = _tree(SHIPPED_ROOT)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
    assert model.config.hidden_size == recipe.hidden and model.config.num_hidden_layers == recipe.layers
    band = json.loads((folder / BAND_FILE).read_text())
    assert band["name"] == name and band["command"].endswith(name) and band["full"]["heldout_size"] == recipe.report_size
    recorded = json.loads((folder / "sft_metrics.json").read_text())  # the build's own held-out scores
    for key, (lo, hi) in band["full"]["band"].items():
        assert lo <= recorded[key] <= hi, (key, recorded[key], (lo, hi))
    test = band["test"]  # the first problems of the same held-out set: seconds
    measured = heldout_accuracy(folder, recipe.task, test["heldout_size"])
    assert set(measured) == set(test["band"]) and test["heldout_size"] < recipe.report_size
    for key, (lo, hi) in test["band"].items():
        assert lo <= measured[key] <= hi, (key, measured[key], (lo, hi))
    assert _tree(SHIPPED_ROOT) == before  # loaded and evaluated: nothing written into the package


def test_package_data_declares_every_shipped_file():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [str(p.relative_to(ROOT / "vapo_engine")) for p in SHIPPED_ROOT.rglob("*") if p.is_file()]
    assert len(files) >= 9 * len(SHIPPED)
    missing = [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns["vapo_engine"])]
    assert missing == []


# -------------------------------------------------------------- the cache fallback (builds faked)


@pytest.fixture
def fake_builds(monkeypatch):
    """Replace the build itself: record (recipe folder, start folder) and write a finished, marked folder."""
    built: list[tuple[str, Path | None]] = []

    def fake(tmp, recipe, log, start=None):
        built.append((recipe.folder_name(), start))
        (tmp / "config.json").write_text("{}")
        (tmp / DONE_MARKER).write_text(json.dumps({"recipe_hash": recipe.recipe_hash()}))
        return {"heldout_greedy_acc": 0.0, "heldout_sampled_acc": 0.0, "build_seconds": 0.0}

    monkeypatch.setattr(build, "_build_into", fake)
    return built


def test_a_changed_recipe_is_built_in_the_cache_on_the_shipped_start(tmp_path, monkeypatch, fake_builds):
    changed = dataclasses.replace(RECIPES["builtin:chain"], phases=(Phase("noisy", 5, 2e-4, (0.85, 1.0)),))
    monkeypatch.setitem(RECIPES, "builtin:chain", changed)
    assert ready_model_dir(tmp_path, task="builtin:chain") is None
    out = builtin_model_dir(tmp_path, task="builtin:chain", log=lambda s: None)
    assert out == tmp_path / "tiny-chain-v3" and is_current(out, changed)
    assert fake_builds == [("tiny-chain-v3", shipped_folder(RECIPES["builtin:chain@v1"]))]  # v1 not rebuilt
    assert ready_model_dir(tmp_path, task="builtin:chain") == out
    assert builtin_model_dir(tmp_path, task="builtin:chain", log=_no_build) == out  # cached now


def test_a_cache_build_of_another_recipe_is_rebuilt(tmp_path, monkeypatch, fake_builds):
    stale = tmp_path / "tiny-addition-v1"
    stale.mkdir()
    (stale / DONE_MARKER).write_text(json.dumps({"recipe_hash": "0" * 64}))
    changed = dataclasses.replace(RECIPES["builtin:addition"], max_steps=7)
    monkeypatch.setitem(RECIPES, "builtin:addition", changed)
    assert not is_current(stale, changed)
    assert builtin_model_dir(tmp_path, log=lambda s: None) == stale and is_current(stale, changed)
    assert [f for f, _ in fake_builds] == ["tiny-addition-v1"]
    legacy = tmp_path / "legacy"  # a build from before the recipe hash: its marker has none
    legacy.mkdir()
    (legacy / DONE_MARKER).write_text(json.dumps({"version": 1, "time": 0}))
    assert is_current(legacy, changed)


def test_rebuild_builds_in_the_cache_even_when_shipped(tmp_path, fake_builds):
    out = builtin_model_dir(tmp_path, log=lambda s: None, rebuild=True)
    assert out == tmp_path / "tiny-addition-v1" and fake_builds == [("tiny-addition-v1", None)]
    assert builtin_model_dir(tmp_path, log=_no_build) == shipped_folder(RECIPES["builtin:addition"])


def test_build_model_command(tmp_path, clean_env, monkeypatch, capsys, fake_builds):
    from server.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VAPO_MCP_CACHE", str(tmp_path))
    assert main(["build-model", "builtin:nope"]) == 2
    err = capsys.readouterr().err
    assert "'builtin:nope' is not a built-in model" in err and all(name in err for name in SHIPPED)
    assert main(["build-model", "builtin:addition"]) == 0
    out = capsys.readouterr().out
    assert f"builtin:addition: {tmp_path / 'tiny-addition-v1'}" in out and "runs use the shipped model" in out
    assert main(["build-model", "builtin:addition", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["built"] is False and record["runs_use"] == str(shipped_folder(RECIPES["builtin:addition"]))
    assert main(["build-model", "builtin:addition", "--force"]) == 0 and "already built" not in capsys.readouterr().out
    assert [f for f, _ in fake_builds] == ["tiny-addition-v1", "tiny-addition-v1"]
