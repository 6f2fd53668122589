"""Shared fixtures: paths of the shipped files and a helper to run the CLI in-process."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CANARY_KEY = "sk-canary-7f3a9c1e5b2d4f6a8c0e2b4d6f8a0c1e"

# One CPU thread per test process and per process a test starts (trainer workers, torchrun ranks, servers, bench
# smokes inherit it): set before any test module imports torch. The tests' models are tiny and gain nothing from
# more, while two or more OpenMP threads per process spin against each other and against the other pytest-xdist
# worker (scripts/test.sh runs two) — on a busy 2-core machine a 2-thread tiny-model fit took 9× as long.
# A value already in the environment wins; tests of the thread budget itself pass their own environment.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "two_processes: the test keeps both cores busy (two ranks, or two runs at "
                                       "once); under pytest-xdist no two such tests run at the same time")


def _two_processes_lock(item):
    """Under pytest-xdist (scripts/test.sh), a `two_processes` test's setup (where a module fixture may launch the
    ranks) and call wait for the others of its kind: two of them at once put four busy processes on the two cores
    of a CI machine. In one process nothing is held."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if item.get_closest_marker("two_processes") is None or not run_id:
        return contextlib.nullcontext()
    from vapo_engine.builtin_model.build import (
        _build_lock as exclusive,  # the build cache's flock (imports torch)
    )
    return exclusive(Path(tempfile.gettempdir()) / f"vapo-tests-{run_id}.two_processes.lock")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _two_processes_lock(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _two_processes_lock(item):
        return (yield)


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch, tmp_path_factory):
    """No test reaches the real Hugging Face Hub: a registered benchmark name (the shipped config's
    eval.benchmark = "aime_2024") is fetched when its file is missing, so every test runs offline against an
    empty cache (tests/test_benchmarks_by_name.py turns the Hub back on, pointed at a loopback stand-in)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.getbasetemp() / "hf-hub-cache"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A temp folder holding copies of the shipped config.toml and settings.json."""
    for name in ("config.toml", "settings.json"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


@pytest.fixture
def clean_env(monkeypatch):
    """No API key / base-URL override from the developer's environment leaks into a test."""
    for name in ("TAOTOKEN_API_KEY", "TAOTOKEN_BASE_URL", "VAPO_MCP_CONFIG", "VAPO_MCP_SETTINGS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A tiny untrained Qwen2 model directory (hidden 32, 2 layers), saved with save_pretrained."""
    from vapo_engine.builtin_model import make_model_dir
    return make_model_dir(tmp_path_factory.mktemp("tiny") / "model", hidden=32, layers=2, heads=2, seed=0)


def write_workspace(folder: Path) -> tuple[Path, Path]:
    """Copies of config.toml and settings.json in `folder`, with runs going to `folder`/logs."""
    s = json.loads((ROOT / "settings.json").read_text())
    s["runtime"]["log_dir"] = str(folder / "logs")
    (folder / "settings.json").write_text(json.dumps(s))
    (folder / "config.toml").write_text((ROOT / "config.toml").read_text())
    return folder / "config.toml", folder / "settings.json"


@pytest.fixture
def runs_env(tmp_path, model_dir):
    """(Files of a temp workspace whose runs go to tmp_path/logs, the RunManager over those runs)."""
    from tools.paths import Files
    from vapo_engine.config import load_settings
    from vapo_engine.jobs import RunManager
    from vapo_engine.runs import runs_root
    files = Files(*write_workspace(tmp_path))
    return files, RunManager(runs_root(load_settings(files.settings), files.settings))


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A project folder the in-memory MCP server's file environment points at (tests.mcp_helpers.project)."""
    from tests.mcp_helpers import project
    return project(tmp_path, monkeypatch)
