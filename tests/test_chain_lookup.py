"""bench.experiments.chain_lookup: the positions it reads are the signs and digits of each line, and its smoke
run writes a record with one probability per line for every prompt length (a tiny random model, seconds)."""
from __future__ import annotations

import json
import subprocess
import sys

from bench.experiments.chain_lookup import sign_position
from tests.conftest import ROOT
from vapo_engine.builtin_model.model import build_tokenizer
from vapo_engine.tasks.chain import ChainTask


def test_sign_position_points_at_each_lines_operation():
    tok, task = build_tokenizer(), ChainTask()
    for p in task.heldout(28):
        pids = tok(p.prompt)["input_ids"]
        ids = pids + tok(task.solve(p.prompt), add_special_tokens=False)["input_ids"]
        ops = p.prompt.split()[1:]
        for k, op in enumerate(ops):
            pos = sign_position(len(pids), k)
            assert tok.decode(ids[pos:pos + 2]) == op[1:], (p.prompt, k)


def test_smoke_record_has_a_probability_per_line(tmp_path):
    subprocess.run([sys.executable, "-m", "bench.experiments.chain_lookup", "--smoke", "--out", str(tmp_path)],
                   check=True, cwd=ROOT, timeout=300, capture_output=True)
    rec = json.loads((tmp_path / "chain_lookup.json").read_text())
    assert rec["benchmark"] == "chain_lookup" and rec["config"]["smoke"] is True
    table = rec["results"][0]["by_steps"]
    assert sorted(int(n) for n in table) == list(range(1, 15))
    for n, row in table.items():
        assert len(row["sign_by_line"]) == len(row["digit_by_line"]) == int(n)
        assert all(0.0 <= v <= 1.0 for v in row["sign_by_line"] + row["digit_by_line"])
        assert row["problems"] == 2
