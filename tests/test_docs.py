"""The documentation in the repository stays true to it: the configuration reference matches the config models,
nothing cites a document that is not in the repository, every relative link in README.md and docs/ resolves
(anchors included), and the README stays a page for users."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT
from vapo_engine.config import reference

OUTSIDE_DOCS = re.compile(r"\b" + "SP" + r"EC\b|\b" + "DES" + r"IGN\.md")
"""A citation of the team's specification or design notes, which live outside the repository."""
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".json", ".jsonl", ".txt", ".cfg", ".ini", ".yml", ".yaml",
                 ".jinja", ""}
SKIP_DIRS = {".venv", ".git", "__pycache__", ".pytest_cache", "node_modules", "logs", "build", "dist"}
DESIGN_CITATION = re.compile(r"design\.md((?:,? (?:and )?§\d+(?:\.\d+)?)+)")
"""`docs/design.md §3.4`, `design.md §2 and §3`, `docs/design.md §3, §5` (the section numbers after the name)."""
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 300


def _repo_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (git), or a walk of the tree without git."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=60).stdout.splitlines()
        files = [ROOT / line for line in out]
    except (OSError, subprocess.SubprocessError):
        files = [p for p in ROOT.rglob("*") if p.is_file()]
    return [p for p in files if p.is_file() and p.suffix in TEXT_SUFFIXES
            and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)]


def test_configuration_reference_is_current():
    committed = reference.DOC_PATH.read_text(encoding="utf-8") if reference.DOC_PATH.is_file() else ""
    assert committed == reference.render(), (
        f"docs/configuration.md is stale (a config field or its docstring changed); regenerate it with:\n"
        f"  {reference.REGENERATE}")


def test_configuration_reference_covers_every_key():
    text = reference.render()
    for key in ("`api.base_url`", "`runtime.max_queued_runs`", "`experiment.seed`", "`vapo.alpha`",
                "`training.micro_batch_tokens`", "`distributed.strategy`", "`provider_rollouts.max_pending`",
                "`lora.target_modules`"):
        assert key in text, key
    assert "`decisions" not in text  # derived from the keys, not a key


def test_reference_check_mode_says_how_to_regenerate(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    out.write_text("stale\n", encoding="utf-8")
    assert reference.main(["--check", "--out", str(out)]) == 1
    assert reference.REGENERATE in capsys.readouterr().err
    assert reference.main(["--out", str(out)]) == 0
    assert reference.main(["--check", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == reference.render()


def test_nothing_cites_a_document_outside_the_repository():
    hits = []
    for path in _repo_files():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for n, line in enumerate(lines, 1)
                 if OUTSIDE_DOCS.search(line)]
    assert not hits, ("these lines cite a document that is not in the repository; cite docs/design.md "
                      "(or another page of docs/) instead:\n" + "\n".join(hits))


def test_every_design_citation_names_a_section_that_exists():
    design = ROOT / "docs" / "design.md"
    heading = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)
    numbers = {m.group(1) for m in heading.finditer(design.read_text(encoding="utf-8"))}
    missing = []
    for path in _repo_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for cite in DESIGN_CITATION.finditer(text):
            missing += [f"{path.relative_to(ROOT)}: §{n}" for n in re.findall(r"§(\d+(?:\.\d+)?)", cite.group(0))
                        if n not in numbers]
    assert not missing, "citations of docs/design.md sections that do not exist:\n" + "\n".join(missing)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _outside_code(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _outside_code(path.read_text(encoding="utf-8"))
            if line.startswith("#")}


def test_every_relative_link_in_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for line in _outside_code(page.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (page.parent / file_part).resolve() if file_part else page
                if not dest.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_page_for_users():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES, (
        f"README.md has {len(readme.splitlines())} lines (at most {README_MAX_LINES}): move detail into docs/")
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in readme
    for page in ("design.md", "configuration.md", "scale-out.md", "security.md", "results.md"):
        assert f"(docs/{page}" in readme, page
