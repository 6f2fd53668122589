"""Benchmarks by name (vapo_engine/tasks/benchmarks.py, tasks/hub.py, `vapo-mcp data`): every registered name
is fetched from a loopback stand-in for the Hugging Face Hub (tests/fake_hub.py), converted, written once and
reused; offline, 404, connection-refused, malformed and pyarrow-less fetches fail with the file to place and
the commands that make it. Nothing here touches the network."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_hub import EXPECTED, HAS_PYARROW, SOURCES, FakeHub
from vapo_engine.tasks import BENCHMARKS, TaskError, benchmarks, fetch_benchmark, get_task
from vapo_engine.tasks.benchmarks import gsm8k_final_answer

ROOT = Path(__file__).resolve().parents[1]
needs_pyarrow = pytest.mark.skipif(not HAS_PYARROW, reason="parquet sources need pyarrow")
ALL_NAMES = [pytest.param(n, marks=needs_pyarrow) if b.needs_pyarrow else n for n, b in BENCHMARKS.items()]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The loopback Hub, with HF_ENDPOINT pointing at it, downloads on, and a cache of this test's own."""
    from huggingface_hub import constants
    fake = FakeHub()
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # in case the developer's shell had it at import
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    yield fake
    fake.close()


def test_the_registry_is_pinned_documented_and_covered_here():
    assert {"aime_2024", "aime_2025", "math500", "gsm8k"} <= set(BENCHMARKS)
    assert set(SOURCES) == set(BENCHMARKS)  # every name has a synthetic copy on the loopback Hub
    doc = benchmarks.__doc__
    for name, b in BENCHMARKS.items():
        assert b.name == name and re.fullmatch(r"[0-9a-f]{40}", b.revision) and b.files and b.split
        assert b.repo_id in doc and b.revision in doc and f"`{name}`" in doc
    assert "How to add a name" in doc


@pytest.mark.parametrize("text,final", [("so 48+24=72\n#### 72", "72"), ("#### 1,234", "1234"),
                                        ("####  -5 ", "-5"), ("x #### 1 #### 3.5", "3.5"),
                                        ("no marker 72", None), ("#### ", None)])
def test_gsm8k_answers_become_the_final_number(text, final):
    assert gsm8k_final_answer(text) == final


@pytest.mark.parametrize("name", ALL_NAMES)
def test_each_name_is_fetched_converted_written_and_reused(hub, tmp_path, name):
    data = tmp_path / "data"
    task = get_task(name, data)
    assert [(p.id, p.prompt, p.answer) for p in task.problems] == EXPECTED[name]
    rows = [json.loads(line) for line in (data / f"{name}.jsonl").read_text().splitlines()]
    assert [(r["id"], r["problem"], r["answer"]) for r in rows] == EXPECTED[name]
    b = BENCHMARKS[name]
    assert hub.requests and all(p.startswith(f"/datasets/{b.repo_id}/resolve/{b.revision}/")
                                for _, p in hub.requests)
    assert not [p for p in data.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    hub.requests.clear()
    assert get_task(name, data).problems == task.problems and hub.requests == []  # the file, reused as is


def test_a_file_already_in_place_wins_and_nothing_is_asked(hub, tmp_path):
    (tmp_path / "aime_2025.jsonl").write_text('{"problem": "mine", "answer": "1"}\n')
    assert [p.prompt for p in get_task("aime_2025", tmp_path).problems] == ["mine"]
    assert fetch_benchmark("aime_2025", tmp_path) == (tmp_path / "aime_2025.jsonl").absolute()
    assert hub.requests == []


def test_offline_says_where_to_put_the_file_and_how_to_fetch_it_then_uses_the_cache(hub, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "data"
    with pytest.raises(TaskError) as e:
        get_task("math500", data)
    msg, target = str(e.value), (data / "math500.jsonl").absolute()
    assert msg.startswith(f"{target}:") and "HF_HUB_OFFLINE=1" in msg and '{"problem": "...",' in msg
    assert f"`vapo-mcp data fetch math500 --data-dir {data}`" in msg
    assert "`hf download HuggingFaceH4/MATH-500 test.jsonl --repo-type dataset --revision 6e4ed1a2a79a`" \
        in msg
    assert hub.requests == [] and not target.exists()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    fetch_benchmark("math500", data)  # online once: the source lands in the Hugging Face cache too
    target.unlink()
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert len(get_task("math500", data).problems) == 2 and hub.requests == []  # converted from the cache


@pytest.mark.parametrize("case,fragment", [("file", "the file does not exist"),
                                           ("repo", "the dataset repository does not exist"),
                                           ("plain", "was not found on")])
def test_a_404_says_what_is_missing_and_the_fix(hub, tmp_path, case, fragment):
    b = BENCHMARKS["aime_2025"]
    if case == "repo":
        hub.files = {k: v for k, v in hub.files.items() if k[0] != b.repo_id}
    else:
        del hub.files[(b.repo_id, b.revision, "aime2025-II.jsonl")]
        hub.plain_404 = case == "plain"  # a mirror without the Hub's X-Error-Code
    with pytest.raises(TaskError) as e:
        get_task("aime_2025", tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'aime_2025.jsonl'}:") and fragment in msg and "HTTP 404" in msg, msg
    assert hub.url in msg and "vapo-mcp data fetch aime_2025" in msg
    assert not (tmp_path / "aime_2025.jsonl").exists()


def _closed_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_connection_refused_says_the_hub_could_not_be_reached_at_once(hub, tmp_path, monkeypatch):
    closed = _closed_endpoint()  # no retries are muted here: the reachability check answers before them
    monkeypatch.setenv("HF_ENDPOINT", closed)
    start = time.monotonic()
    with pytest.raises(TaskError) as e:
        get_task("math500", tmp_path)
    msg = str(e.value)
    assert f"{closed} could not be reached (connection refused by 127.0.0.1:" in msg, msg
    assert str(tmp_path / "math500.jsonl") in msg and "vapo-mcp data fetch math500" in msg, msg
    assert time.monotonic() - start < 5


def test_an_unreachable_hub_falls_back_to_the_cache_but_not_with_force(hub, tmp_path, monkeypatch):
    data = tmp_path / "data"
    target = fetch_benchmark("math500", data)  # online once: the source lands in the Hugging Face cache
    target.unlink()
    closed = _closed_endpoint()
    monkeypatch.setenv("HF_ENDPOINT", closed)
    start = time.monotonic()
    assert len(get_task("math500", data).problems) == 2 and time.monotonic() - start < 5  # from the cache
    with pytest.raises(TaskError) as e:
        fetch_benchmark("math500", data, force=True)  # --force wants the Hub's copy: say it cannot be had
    assert f"{closed} could not be reached (connection refused" in str(e.value) and time.monotonic() - start < 5


def test_the_reachability_check_follows_the_proxy_settings(hub, monkeypatch):
    from vapo_engine.tasks.reachability import unreachable
    assert unreachable(hub.url) is None
    closed = _closed_endpoint()
    monkeypatch.setenv("HTTP_PROXY", "http://user:secret@" + closed.removeprefix("http://"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    why = unreachable(hub.url)  # the proxy is what must answer
    assert why and "through the proxy 127.0.0.1:" in why and "secret" not in why, why
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert unreachable(hub.url) is None
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("HTTP_PROXY", "http://user:secret@[::1")
    assert "HTTP_PROXY" in unreachable(hub.url) and "secret" not in unreachable(hub.url)
    assert "not a valid URL" in unreachable("http://[::1") and "does not resolve" in unreachable(
        "https://nonexistent.invalid")


@pytest.mark.parametrize("name,filename,rows,raw,fragment", [
    ("math500", "test.jsonl", None, b'{"problem": "a", "answer": "1"}\n{"problem": \n',
     "line 2 is not valid JSON"),
    ("aime_2025", "aime2025-II.jsonl", [{"question": "q"}], None,
     "row 1: field 'answer' is missing or empty"),
    ("aime_2025", "aime2025-I.jsonl", [], None, "it has no rows"),
    pytest.param("gsm8k", "main/test-00000-of-00001.parquet", [{"question": "q", "answer": "72"}], None,
                 "field 'answer' is not a usable answer", marks=needs_pyarrow),
    pytest.param("aime_2024", "data/train-00000-of-00001.parquet", None, b"not parquet at all",
                 "not a readable Parquet file", marks=needs_pyarrow),
])
def test_a_malformed_source_is_named_and_nothing_is_written(hub, tmp_path, name, filename, rows, raw,
                                                            fragment):
    data = tmp_path / "data"
    data.mkdir()
    hub.set_file(name, filename, rows, raw)
    with pytest.raises(TaskError) as e:
        get_task(name, data)
    msg = str(e.value)
    assert f"{BENCHMARKS[name].repo_id}/{filename}: the downloaded source" in msg and fragment in msg, msg
    assert f"vapo-mcp data fetch {name} --data-dir {data} --force" in msg and list(data.iterdir()) == []


def test_force_downloads_a_corrupted_cached_source_again(hub, tmp_path):
    data = tmp_path / "data"
    fetch_benchmark("aime_2025", data)
    (data / "aime_2025.jsonl").unlink()
    cached = next((tmp_path / "hf-home" / "hub").rglob("aime2025-I.jsonl"))
    cached.resolve().write_text("truncated {")  # the blob behind the snapshot link
    with pytest.raises(TaskError, match="line 1 is not valid JSON.*--force"):
        get_task("aime_2025", data)
    hub.requests.clear()
    assert fetch_benchmark("aime_2025", data, force=True).is_file() and hub.requests
    assert [p.answer for p in get_task("aime_2025", data).problems] == ["70", "588", "468"]


def test_a_parquet_source_without_pyarrow_says_pip_install_pyarrow(hub, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TaskError) as e:
        get_task("gsm8k", tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'gsm8k.jsonl'}:") and "`pip install pyarrow`" in msg
    assert "vapo-mcp data fetch gsm8k" in msg and not (tmp_path / "gsm8k.jsonl").exists()


def test_cli_fetches_lists_and_reports_errors_without_a_traceback(hub, tmp_path, project, capsys,
                                                                   monkeypatch):
    from server.cli import main
    data = tmp_path / "d"
    assert main(["data", "fetch", "math500", "aime_2025", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert f"math500: 2 problems -> {data / 'math500.jsonl'}" in out and "aime_2025: 3 problems" in out
    assert main(["data", "fetch", "math500", "--data-dir", str(data)]) == 0
    assert "already present" in capsys.readouterr().out
    hub.requests.clear()
    assert main(["data", "fetch", "math500", "--data-dir", str(data), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["benchmarks"][0]["fetched"] is True and hub.requests
    assert main(["data", "list", "--data-dir", str(data), "--json"]) == 0
    present = {r["name"]: r["present"] for r in json.loads(capsys.readouterr().out)["benchmarks"]}
    assert present["math500"] and present["aime_2025"] and not present["aime_2024"]
    monkeypatch.chdir(project)  # no --data-dir: config.toml's data.data_dir, relative to config.toml
    assert main(["data", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data_dir"] == str((project / "data").resolve())
    assert main(["data", "fetch", "nope", "--data-dir", str(data)]) == 2
    assert "unknown benchmark name(s): nope" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["data", "fetch", "aime_2024", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(data / "aime_2024.jsonl") in err and "HF_HUB_OFFLINE=1" in err
    assert f"--revision 2fe88a2f1091` and run `vapo-mcp data fetch aime_2024 --data-dir {data}` again" in err


def test_cli_fetch_offline_is_one_line_per_benchmark_and_goes_on_with_the_others(hub, tmp_path, capsys,
                                                                               monkeypatch):
    from server.cli import main
    data = tmp_path / "d"
    assert main(["data", "fetch", "math500", "--data-dir", str(data)]) == 0
    capsys.readouterr()
    closed = _closed_endpoint()
    monkeypatch.setenv("HF_ENDPOINT", closed)
    start = time.monotonic()
    assert main(["data", "fetch", "aime_2024", "math500", "aime_2025", "--data-dir", str(data)]) == 2
    assert time.monotonic() - start < 5  # the reachability check, not huggingface_hub's ~20 s of retries
    out, err = capsys.readouterr()
    assert "math500: 2 problems" in out and "already present" in out
    lines = err.strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines[:2]] == ["aime_2024", "aime_2025"], err
    assert all(f"{closed} could not be reached" in line and "Fix:" in line for line in lines[:2]), err
    assert len(lines) == 3 and "2 of 3 benchmarks could not be fetched" in lines[2], err
    assert "Retry" not in err and "thrown while requesting" not in err and "Traceback" not in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["data", "fetch", "aime_2024", "--data-dir", str(data), "--json"]) == 2
    failed = json.loads(capsys.readouterr().out)["failed"]
    assert [f["name"] for f in failed] == ["aime_2024"] and "HF_HUB_OFFLINE=1" in failed[0]["error"]


def test_a_run_config_naming_benchmarks_fetches_them_when_it_is_validated(hub, project, monkeypatch):
    from tools.paths import files
    from tools.training import prepare_config
    monkeypatch.chdir(project)
    cfg = prepare_config(files(), "cpu-demo", ['eval.benchmark="aime_2025"', 'data.train="math500"'])
    assert {p.name for p in Path(cfg.data.data_dir).iterdir()} == {"aime_2025.jsonl", "math500.jsonl"}


def test_importing_the_tasks_and_the_cli_neither_imports_huggingface_hub_nor_fetches():
    code = ("import sys, vapo_engine.tasks, server.cli.data_cmd, tools.training\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('huggingface_hub', 'pyarrow')))")
    r = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
