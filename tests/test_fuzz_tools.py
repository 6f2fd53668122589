"""Fuzz every tool through the in-memory MCP client: a few hundred seeded random and malformed calls (wrong
types, out-of-range numbers, huge strings, NUL bytes, traversal paths, pasted keys, unknown and extra
arguments, bad overrides, real and made-up run ids), first as the local stdio agent, then as a remote HTTP
client. Asserts: the session survives every call; no result shows a traceback, pydantic's raw text or the API
key (or a key pasted into an argument); every error result names a fix (tests.mcp_helpers.names_a_fix) and none is the SDK's bare crash text.

Valid start_training / ablate calls do happen (and make real run directories), but a placeholder holds the run
manager's only slot (tests.mcp_helpers.slot_held), so they stay queued and no trainer process starts; they are
stopped at the end, and the test checks that none ever ran.
"""
from __future__ import annotations

import random
import re

import pytest
from mcp import Client

from tests.fake_openai import CANARY, FakeOpenAI
from tests.mcp_helpers import LEAKS, names_a_fix, project, slot_held, text

pytestmark = pytest.mark.anyio
SEED, CALLS_STDIO, CALLS_HTTP = 20251201, 260, 120
PASTED_KEY = "sk-proj-" + "A1b2" * 8

JUNK = [None, True, False, 0, -1, 1, 7, 10**12, -(10**12), 3.5, "", " ", "x" * 5000, "../../../../etc/passwd",
        "a\x00b", "ünï\u202ecødé", PASTED_KEY, "[1, 2]", '{"a": 1}', "true", "-5", "${HOME}",
        "'; DROP TABLE runs; --", [], [1, "a", None], {}, {"a": {"b": [1]}}, ["x"] * 60]
OVERRIDES = ["vapo.alpha=0.5", "training.total_steps=3", "vapo.alpah=1", "vapo.alpha=-1", "training.batch_size=60",
             "noequals", "=", "a..b=1", "distributed.nnodes=2", "distributed.rdzv_endpoint=0.0.0.0:1",
             "distributed.nproc_per_node=2", 'model.local_path="/etc"', 'data.data_dir="/"',
             "eval.benchmark=missing_set", 'eval.benchmark="../../etc/x"', "training.algorithm=nope",
             "vapo.alpha=[1, 2]", "model.temperature=1e999", "api.api_key_env=sk-proj-abcdefghijklmnop1234",
             'data.train="/proc/self/environ.jsonl"', "model.max_tokens=10", "vapo.group_size=2"]


def _value(rng: random.Random, name: str, prop: dict, pools: dict, typed: bool) -> object:
    """A value for argument `name`: well-typed calls take its semantic pool (else a value of its schema type),
    malformed ones take the pool 40% of the time and plain junk otherwise."""
    if name in pools and (typed or rng.random() < 0.4):
        return pools[name](rng)
    kinds = {o.get("type") for o in prop.get("anyOf", [prop])}
    if typed and "boolean" in kinds:
        return rng.random() < 0.5
    if typed and "integer" in kinds:
        return rng.randint(0, 50)
    if typed and "string" in kinds:
        return rng.choice(["vapo", "vapo-aime-qwen32b", "rl", "x"])
    return rng.choice(JUNK)


def _pools(ws, run_ids: list[str]) -> dict:
    from vapo_engine.metrics import CATALOGUE
    from vapo_engine.variants import VARIANTS
    paths = [str(ws / "train.log"), "train.log", "missing.log", str(ws), "/proc/self/environ", "/etc/hostname",
             "../outside.log", str(ws / "config.toml"), "/dev/zero", "~/.bashrc", "src"]
    ids = lambda r: r.choice(run_ids + ["20990101-000000-abcdef", "abl-00000000", "abl-zz", "x", "../x", "a" * 81])
    return {
        "run_id": ids,
        "preset": lambda r: r.choice(["cpu-demo", "cpu-demo", "cpu-demo", "cpu-demo", "nope", "../../presets/cpu-demo", "/etc/x.toml",
                                      str(ws / "good.toml"), "good.toml", "cpu-demo.toml", "../outside.toml"]),
        "overrides": lambda r: r.sample(OVERRIDES, r.randint(0, 4)),
        "tags": lambda r: r.sample(["a", "b", "x" * 70, "", "ü"], r.randint(0, 3)),
        "variants": lambda r: r.sample([*VARIANTS, "bogus"], r.randint(0, 3)),
        "names": lambda r: r.sample([*CATALOGUE, "bogus/metric"], r.randint(0, 4)),
        "log_path": lambda r: r.choice(paths), "code_path": lambda r: r.choice(paths),
        "status": lambda r: r.choice([401, 404, 429, 500, 200, r.randint(-5, 1200)]),
        "body": lambda r: r.choice(['{"error": {"message": "Incorrect API key"}}', {"error": {"code": 429}},
                                    ["x"], "Rate limit reached", "{not json"]),
        "headers": lambda r: r.choice([{"retry-after": "2"}, {"authorization": "Bearer " + CANARY}, {"x": "y"}]),
        "text": lambda r: r.choice(["openai.RateLimitError: Error code: 429", "ECONNREFUSED", "NaN loss at step 3",
                                    "why doesn't my AIME score match the paper?", ""]),
        "limit": lambda r: r.choice([r.randint(1, 200), r.randint(-2, 600)]), "cursor": lambda r: r.randint(-1, 10),
        "log_lines": lambda r: r.choice([r.randint(0, 200), r.randint(-1, 250)]),
        "state": lambda r: r.choice(["queued", "running", "stopped", "zombie"]),
        "prompt": lambda r: r.choice(["What is 2+2?", "q" * 4001]), "expected": lambda r: r.choice(["4", "80"]),
        "model": lambda r: r.choice(["qwen-32b", "no-such-model", "../../x"]),
    }


def _call(rng: random.Random, schemas: dict, pools: dict) -> tuple[str, dict]:
    tools = sorted(schemas)
    weights = [0.25 if t in ("check_channel", "smoke_test") else 1.0 for t in tools]
    tool = "no_such_tool" if rng.random() < 0.02 else rng.choices(tools, weights)[0]
    props = (schemas.get(tool) or {}).get("properties", {})
    typed = rng.random() < 0.55
    required = set((schemas.get(tool) or {}).get("required", []))
    args = {name: _value(rng, name, prop, pools, typed) for name, prop in props.items()
            if rng.random() < 0.6 or (typed and name in required)}
    if rng.random() < 0.08:
        args[rng.choice(["extra", "ctx", "run id", "__class__"])] = rng.choice(JUNK)
    return tool, args


def _check(tool: str, args: dict, res) -> None:
    msg = text(res)
    assert CANARY not in msg and PASTED_KEY not in msg, (tool, args, msg[:800])
    assert not any(leak in msg for leak in LEAKS), (tool, args, msg[:800])
    if res.is_error:
        assert not re.fullmatch(r"Error executing tool \w+", msg.strip()), (tool, args, msg)  # a crash
        assert names_a_fix(msg), (tool, args, msg[:800])


async def _fuzz(server, rng: random.Random, calls: int, ws, keep_slot) -> tuple[int, int]:
    run_ids: list[str] = []
    errors = 0
    async with Client(server) as c:
        schemas = {t.name: t.input_schema for t in (await c.list_tools()).tools}
        for i in range(calls):
            tool, args = _call(rng, schemas, _pools(ws, run_ids))
            res = await c.call_tool(tool, args)
            _check(tool, args, res)
            errors += bool(res.is_error)
            sc = res.structured_content or {}
            run_ids += [r["run_id"] for r in sc.get("runs", []) if isinstance(r, dict) and tool == "ablate"]
            if tool == "start_training" and not res.is_error:
                run_ids.append(sc["run"]["run_id"])
            if i % 20 == 0:
                keep_slot()
        alive = await c.call_tool("list_runs", {"limit": 200})  # the session survived everything
        assert not alive.is_error
    return errors, len(set(run_ids))


async def test_fuzz_every_tool(tmp_path, monkeypatch):
    from server.app import build_server
    from tools.access import Policy
    from tools.paths import files, manager_for
    ws = project(tmp_path, monkeypatch)
    (ws / "train.log").write_text("openai.AuthenticationError: Error code: 401 - invalid api key\n")
    (ws / "good.toml").write_text("[training]\ntotal_steps = 3\n")
    (ws / "src").mkdir()
    (ws / "src" / "client.py").write_text("import os\nkey = os.environ['TAOTOKEN_API_KEY']\n")
    rng = random.Random(SEED)
    with FakeOpenAI(key=CANARY) as fake, slot_held(ws / "logs") as keep_slot:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
        local = await _fuzz(build_server(Policy("stdio")), rng, CALLS_STDIO, ws, keep_slot)
        remote = await _fuzz(build_server(Policy("http")), rng, CALLS_HTTP, ws, keep_slot)
        mgr, _ = manager_for(files())
        states = {r.run_id: r.state.value for r in mgr.registry.list(limit=10_000) if r.run_id != "slot-holder"}
    assert local[0] > CALLS_STDIO // 3 and remote[0] > CALLS_HTTP // 3  # the fuzz reaches the error paths
    assert local[1] + remote[1] > 0  # ... and some valid starts
    assert set(states.values()) <= {"queued", "stopped"}, states  # no trainer ever ran
