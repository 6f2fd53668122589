"""DESIGN.md layering: the MCP server and tools start without torch; only trainer/rollout/algo import it."""
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
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_torch_free_packages_have_no_torch_imports():
    offenders = []
    for folder in TORCH_FREE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                              if n.split(".")[0] in ("torch", "transformers")
                              or n.startswith(("vapo_engine.trainer", "vapo_engine.rollout", "vapo_engine.algo"))]
    assert not offenders, offenders
