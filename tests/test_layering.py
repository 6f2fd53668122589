"""docs/design.md §1.1 layering: the MCP server and tools start without torch; only trainer/rollout/algo import it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH_FREE = ["server", "tools", "vapo_engine/config", "vapo_engine/providers", "vapo_engine/diagnostics",
              "vapo_engine/jobs", "vapo_engine/tasks"]


def test_import_server_and_tools_does_not_import_torch():
    code = ("import sys, importlib, pkgutil, server, tools, server.cli\n"
            "for pkg in (server, tools):\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_torch_free_packages_have_no_torch_imports():
    offenders = []
    for folder in TORCH_FREE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                              if n.split(".")[0] in ("torch", "transformers", "peft")
                              or n.startswith(("vapo_engine.trainer", "vapo_engine.rollout", "vapo_engine.algo"))]
    assert not offenders, offenders


def _module_imports(path: Path, package: str) -> set[str]:
    """Project modules imported anywhere in `path` (relative imports resolved; an import inside a function
    still ties the two modules together)."""
    mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            head = ".".join(base[:len(base) - node.level + 1]) if node.level else ""
            target = ".".join(x for x in (head, node.module or "") if x)
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] == package}


def test_no_import_cycles_between_modules():
    """The project's modules import each other without a cycle (the run manager and its supervisor once did)."""
    graph = {}
    for package in ("vapo_engine", "tools", "server"):
        for path in (ROOT / package).rglob("*.py"):
            mod = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            graph[mod] = _module_imports(path, package)
    graph = {m: {d for d in deps if d in graph and d != m and not m.startswith(d + ".")} for m, deps in graph.items()}
    assert [sorted(c) for c in _cycles(graph)] == []


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative over a small graph)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


WORKER_SIDE = ("vapo_engine.trainer", "vapo_engine.rollout", "vapo_engine.algo", "vapo_engine.serving")
FACADE = ("vapo_engine/config", "vapo_engine/jobs", "vapo_engine/providers", "vapo_engine/diagnostics",
          "vapo_engine/tasks")
MODEL_FILES = ("vapo_engine.realmodels.source", "vapo_engine.cachedir")
"""Where packaged and GGUF models are (torch-free; only errors and the cache folder below them)."""
LEAVES = {"vapo_engine/config": ("vapo_engine.config", "vapo_engine.errors", "vapo_engine.tasks",
                                 "vapo_engine.builtin_model.recipes", *MODEL_FILES),
          "vapo_engine/prompts.py": ("vapo_engine.errors", *MODEL_FILES), "vapo_engine/childenv.py": (),
          "vapo_engine/errors.py": (), "vapo_engine/datafiles.py": (),
          "vapo_engine/realmodels/source.py": ("vapo_engine.errors", "vapo_engine.cachedir")}
"""Modules the rest of the house builds on, and the only project modules each may import (docs/design.md §1.1):
the config's data (task names, built-in recipes, where model files are) but nothing that reads a config (runs,
jobs, prompts)."""


def test_nothing_imports_upwards():
    """The torch-free part of vapo_engine (its top-level modules and the facade packages) never imports the worker
    side (childenv once took the token's name from serving/security), and the leaves import only what is below
    them (config once imported runs, prompts the config models)."""
    offenders = []
    for path in (ROOT / "vapo_engine").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        imports = _module_imports(path, "vapo_engine")
        if path.parent == ROOT / "vapo_engine" or rel.startswith(FACADE):
            offenders += [f"{rel} -> {m}" for m in imports if m.startswith(WORKER_SIDE)]
        for leaf, allowed in LEAVES.items():
            if rel == leaf or rel.startswith(leaf + "/"):
                offenders += [f"{rel} -> {m}" for m in imports if m != "vapo_engine" and not m.startswith(allowed)]
    assert not offenders, offenders
