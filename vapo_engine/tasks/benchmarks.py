"""Benchmarks by name: the public sets that `eval.benchmark` / `data.train` may name without shipping a file.

A registered name (`aime_2024`, ...) still resolves to `<data_dir>/<name>.jsonl`, like any other name; the
difference is that when that file is missing, `tasks.hub.fetch_benchmark` downloads the source file(s) below
from the Hugging Face Hub (dataset repos, pinned to a commit so a score always means the same problems),
converts them to the project's JSONL format (`{"id", "problem", "answer"}` per line, see `jsonl.py`) and
writes that file. A file the user put there always wins; nothing is downloaded at import or by `vapo-mcp
config check`. Torch-free and free of `huggingface_hub` at import (the MCP tools import this).

Sources (repo ids, files and columns checked against the dataset cards and file listings on the Hub, and
against other projects that download the same files at the same commits):

- `aime_2024`: HuggingFaceH4/aime_2024 @ 2fe88a2f1091d5048c0f36abc874fb997b3dd99a, split train (30 rows),
  `data/train-00000-of-00001.parquet`; columns id (int), problem, solution, answer (str), url, year. Uses
  problem / answer / id. (Maxwell-Jia/AIME_2024 holds the same set with capitalised columns, also Parquet.)
- `aime_2025`: opencompass/AIME2025 @ a6ad95f611d72cf628a80b58bd0432ef6638f958, split test (15 + 15 rows),
  `aime2025-I.jsonl` then `aime2025-II.jsonl`; columns question, answer. Uses question / answer.
- `math500`: HuggingFaceH4/MATH-500 @ 6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be, split test (500 rows),
  `test.jsonl`; columns problem, solution, answer (LaTeX), subject, level, unique_id. Uses problem / answer /
  unique_id.
- `gsm8k`: openai/gsm8k @ e53f048856ff4f594e959d75785d2c2d37b678ee, config main, split test (1319 rows),
  `main/test-00000-of-00001.parquet`; columns question, answer (a worked solution ending in `#### 72`). Uses
  question / the number after `####` (thousands separators dropped).
- `gsm8k_train`: the same repo and commit, split train (7473 rows), `main/train-00000-of-00001.parquet`; for
  `data.train`.

Parquet sources need `pyarrow` (`pip install pyarrow`); JSONL sources need nothing beyond `huggingface_hub`.
Rows without an id field get `<name>-<n>` (n counts from 1 over all files, in file order).

How to add a name: append a `Benchmark(...)` to `_ENTRIES` with the dataset repo id, a full 40-hex commit
(`revision`, from the repo's "Files and versions" history, so the set cannot drift), the file path(s) inside
the repo (`.jsonl`, `.json` holding a list of objects, or `.parquet`), the column names of the problem text
and the gold answer (and of an id, if any), and an `answer` normaliser when the gold answer is not a bare
final answer (see `gsm8k_final_answer`). Add an entry to the list above and a synthetic copy of the source
format to tests/test_benchmarks_by_name.py (the tests serve every registered name from a loopback Hub).
"""
from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_FORMAT = 'one JSON object per line: {"problem": "...", "answer": "..."} (optional "id")'


def gsm8k_final_answer(text: str) -> str | None:
    """GSM8K's gold answer is a worked solution ending in `#### <number>`: the number, without thousands
    separators (`"... #### 1,234"` -> `"1234"`); None when the marker is missing (a malformed row)."""
    if "####" not in text:
        return None
    final = text.rsplit("####", 1)[1].strip().replace(",", "")
    return final or None


def plain_answer(text: str) -> str | None:
    """The gold answer as given (stripped); None when empty."""
    return text.strip() or None


@dataclass(frozen=True)
class Benchmark:
    """One registered benchmark: where its source lives on the Hub, how its rows map to {problem, answer}."""

    name: str
    repo_id: str
    revision: str
    """A full commit hash: the set is pinned (and a cached copy is found offline without asking the Hub)."""
    files: tuple[str, ...]
    split: str
    problem_field: str
    answer_field: str
    id_field: str | None = None
    answer: Callable[[str], str | None] = plain_answer
    """Turns the raw answer field (as text) into the gold final answer; None marks the row malformed."""
    description: str = ""

    @property
    def short_revision(self) -> str:
        """The commit's first 12 characters: what messages show (the Hub resolves a prefix; a full 40-hex
        hash would read as a token to the secret redaction every error message goes through)."""
        return self.revision[:12]

    @property
    def needs_pyarrow(self) -> bool:
        return any(f.endswith(".parquet") for f in self.files)

    def hf_command(self) -> str:
        """The `hf` CLI command that puts the source file(s) into the Hugging Face cache."""
        files = " ".join(shlex.quote(f) for f in self.files)
        return f"hf download {self.repo_id} {files} --repo-type dataset --revision {self.short_revision}"

    def fetch_command(self, data_dir: str | Path) -> str:
        return f"vapo-mcp data fetch {self.name} --data-dir {shlex.quote(str(data_dir))}"


_ENTRIES = (
    Benchmark("aime_2024", "HuggingFaceH4/aime_2024", "2fe88a2f1091d5048c0f36abc874fb997b3dd99a",
              ("data/train-00000-of-00001.parquet",), "train", "problem", "answer", id_field="id",
              description="AIME 2024 I + II (30 problems; the paper's headline benchmark)"),
    Benchmark("aime_2025", "opencompass/AIME2025", "a6ad95f611d72cf628a80b58bd0432ef6638f958",
              ("aime2025-I.jsonl", "aime2025-II.jsonl"), "test", "question", "answer",
              description="AIME 2025 I + II (30 problems)"),
    Benchmark("math500", "HuggingFaceH4/MATH-500", "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be",
              ("test.jsonl",), "test", "problem", "answer", id_field="unique_id",
              description="MATH-500 (500 competition problems, LaTeX answers)"),
    Benchmark("gsm8k", "openai/gsm8k", "e53f048856ff4f594e959d75785d2c2d37b678ee",
              ("main/test-00000-of-00001.parquet",), "test", "question", "answer",
              answer=gsm8k_final_answer, description="GSM8K test (1319 grade-school word problems)"),
    Benchmark("gsm8k_train", "openai/gsm8k", "e53f048856ff4f594e959d75785d2c2d37b678ee",
              ("main/train-00000-of-00001.parquet",), "train", "question", "answer",
              answer=gsm8k_final_answer, description="GSM8K train (7473 problems; for data.train)"),
)

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in _ENTRIES}
"""Every registered name -> its source; `get_task(name, data_dir)` fetches one when its file is missing."""


def benchmark_names() -> list[str]:
    """The registered names, in table order."""
    return list(BENCHMARKS)


def fix_hint(bench: Benchmark, target: Path) -> str:
    """The three ways to get `target` when this machine cannot download it (the tail of every fetch error)."""
    fetch = bench.fetch_command(target.parent)
    return (f"Fix: on a machine with network access run `{fetch}` and copy {target} here; or fill the "
            f"Hugging Face cache that this machine uses (HF_HUB_CACHE) with `{bench.hf_command()}` and run "
            f"`{fetch}` again; or write {target} yourself, {_FORMAT}")
