"""Scan a code path for key-handling bugs: the env-var NAME used as the key, hard-coded keys, unignored .env.

- `env_name_as_key` (Python AST): a value read from `...["api_key_env"]` / `.api_key_env` that flows into
  `api_key=`, an `Authorization` f-string, or a variable named like a key — without `os.environ[...]`,
  `os.getenv(...)` or `os.environ.get(...)` around it.
- `hardcoded_key` (any text file but .env): credential-shaped literals (`sk-…`, `gsk_…`, `hf_…`, `AIza…`) and
  `api_key = "<long literal>"`; placeholders (`sk-xxx`, `your-key`, `…canary/test/dummy…`) are skipped.
- `.env` files: `git check-ignore --no-index` says whether git would ignore them.
Bounded: at most `MAX_FILES` files of at most `MAX_BYTES` each; snippets are scrubbed.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

from vapo_engine.providers import safe_text

from .evidence import CodeHit, DotenvFacts

MAX_FILES, MAX_BYTES, MAX_HITS = 3000, 512_000, 50
SKIP_DIRS = {".git", ".venv", "venv", "env", "node_modules", "__pycache__", ".tox", "build", "dist",
             "site-packages", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".cache", "logs"}
TEXT_EXT = {".py", ".toml", ".json", ".yaml", ".yml", ".ini", ".cfg", ".sh", ".ipynb", ".js", ".ts", ".conf"}
_KEY_LITERAL = re.compile(r"(?<![A-Za-z0-9_-])(sk-(?:proj-|ant-|or-v1-)?[A-Za-z0-9_\-]{20,}|gsk_[A-Za-z0-9]{20,}|"
                          r"hf_[A-Za-z0-9]{30,}|AIza[0-9A-Za-z_\-]{35}|xai-[A-Za-z0-9]{20,})")
_KEY_ASSIGN = re.compile(r"(?i)\b(api_?key|secret_?key|access_?token|auth_?token)\b[\"']?\s*[:=]\s*[fbr]?[\"']"
                         r"([^\"'\s]{20,})[\"']")
_FAKE = re.compile(r"(?i)x{4,}|\.{3}|\*{3}|your|example|dummy|canary|placeholder|test|fake|redacted|changeme|<|\{")
_ENV_FIELD = re.compile(r"(?i)(api_?key_?env|key_?env|token_?env|env_?name)$")
_KEYISH_NAME = re.compile(r"(?i)(api[_-]?key|^key$|token|secret|authorization|bearer)")


def iter_files(root: Path) -> list[Path]:
    """Files under `root` (or `root` itself), skipping virtualenvs, caches and VCS folders."""
    if root.is_file():
        return [root]
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            out.append(Path(dirpath) / name)
            if len(out) >= MAX_FILES:
                return out
    return out


def _is_env_file(p: Path) -> bool:
    return p.name == ".env" or (p.name.startswith(".env.") and p.suffix not in (".example", ".sample",
                                                                                 ".template", ".dist"))


def scan_code(root: str | Path) -> tuple[list[CodeHit], list[Path]]:
    """(hits, .env files found) under `root`."""
    root = Path(root)
    hits: list[CodeHit] = []
    envs: list[Path] = []
    for path in iter_files(root):
        if _is_env_file(path):
            envs.append(path)
            continue
        if path.suffix not in TEXT_EXT or len(hits) >= MAX_HITS:
            continue
        try:
            if path.stat().st_size > MAX_BYTES:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        rel = str(path.relative_to(root)) if path != root and root.is_dir() else path.name
        if path.suffix == ".py":
            hits += env_name_as_key_hits(text, rel)
        hits += hardcoded_key_hits(text, rel)
    return hits[:MAX_HITS], envs


def hardcoded_key_hits(text: str, file: str) -> list[CodeHit]:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        found = [m.group(1) for m in _KEY_LITERAL.finditer(line)] + [m.group(2) for m in _KEY_ASSIGN.finditer(line)]
        real = [v for v in found if not _FAKE.search(v) and re.search(r"\d", v) and re.search(r"[A-Za-z]", v)
                and not re.fullmatch(r"[A-Z0-9_]+", v)]
        if real:
            out.append(CodeHit(file=file, line=lineno, kind="hardcoded_key",
                               snippet=safe_text(line.strip(), 160, real)))
    return out


def _last_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return None


def _reads_env(node: ast.AST) -> bool:
    """`os.environ[...]`, `os.environ.get(...)`, `os.getenv(...)`, `environ[...]`, `getenv(...)`."""
    src = ast.unparse(node.func if isinstance(node, ast.Call) else getattr(node, "value", node))
    return bool(re.search(r"(^|\.)(environ|getenv)\b", src))


def env_name_as_key_hits(text: str, file: str) -> list[CodeHit]:
    """AST search for the api_key_env NAME flowing into a key position."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines, out = text.splitlines(), []
    for node in ast.walk(tree):
        name, parent = _last_key(node), parents.get(node)
        if not name or not _ENV_FIELD.search(name):
            continue
        if isinstance(parent, (ast.Subscript, ast.Attribute)) and parent.value is node:
            continue  # indexed further: the outer node is examined on its own
        if isinstance(parent, ast.Call) and parent.func is node:
            continue
        if _inside_env_read(node, parents) or not _flows_into_key(node, parents):
            continue
        line = lines[node.lineno - 1].strip() if node.lineno - 1 < len(lines) else ""
        out.append(CodeHit(file=file, line=node.lineno, kind="env_name_as_key", snippet=safe_text(line, 160)))
    return out


def _inside_env_read(node: ast.AST, parents: dict) -> bool:
    cur = parents.get(node)
    while cur is not None and not isinstance(cur, (ast.stmt,)):
        if isinstance(cur, (ast.Call, ast.Subscript)) and _reads_env(cur):
            return True
        cur = parents.get(cur)
    return False


def _flows_into_key(node: ast.AST, parents: dict) -> bool:
    cur, prev = parents.get(node), node
    while cur is not None:
        if isinstance(cur, ast.keyword):
            return bool(cur.arg and _KEYISH_NAME.search(cur.arg))
        if isinstance(cur, ast.JoinedStr):
            return "bearer" in ast.unparse(cur).lower()
        if isinstance(cur, ast.Dict):
            keys = [k.value for k, v in zip(cur.keys, cur.values) if v is prev and isinstance(k, ast.Constant)]
            return any(isinstance(k, str) and _KEYISH_NAME.search(k) for k in keys)
        if isinstance(cur, (ast.Assign, ast.AnnAssign)):
            targets = cur.targets if isinstance(cur, ast.Assign) else [cur.target]
            names = [ast.unparse(t) for t in targets]
            return any(_KEYISH_NAME.search(n) and not _ENV_FIELD.search(n) for n in names)
        if isinstance(cur, ast.stmt):
            return False
        cur, prev = parents.get(cur), cur
    return False


def dotenv_status(path: Path, timeout: float = 5.0) -> DotenvFacts:
    """Whether git ignores `path` (`git check-ignore --no-index`, rc 0 = ignored, 1 = not)."""
    try:
        proc = subprocess.run(["git", "-C", str(path.parent), "check-ignore", "--no-index", "-q", path.name],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return DotenvFacts(path=str(path), status="git_missing")
    except (OSError, subprocess.TimeoutExpired):
        return DotenvFacts(path=str(path), status="error")
    if proc.returncode == 0:
        return DotenvFacts(path=str(path), status="ignored")
    if proc.returncode == 1:
        return DotenvFacts(path=str(path), status="not_ignored")
    return DotenvFacts(path=str(path), status="not_a_repo" if "not a git repository" in proc.stderr else "error")
