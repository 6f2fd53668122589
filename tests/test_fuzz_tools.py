"""Fuzz every tool through the in-memory MCP client: a few hundred seeded random and malformed calls (wrong
types, out-of-range numbers, huge strings, NUL bytes, traversal paths, pasted keys, unknown and extra
arguments, bad overrides, real and made-up run ids), first as the local stdio agent, then as a remote HTTP
client. Asserts: the session survives every call; no result shows a traceback, pydantic's raw text or the API
key (or a key pasted into an argument); every error result names a fix (tests.mcp_helpers.names_a_fix) and none is the SDK's bare crash text.

Valid start_training / ablate calls do happen (and make real run directories), but a placeholder holds the run
manager's only slot (tests.mcp_helpers.slot_held), so they stay queued and no trainer process starts; they are
stopped at the end, and the test checks that none ever ran.

`test_fuzz_tasks_resources_and_prompts` sends the other requests an MCP client can make — tasks/get, tasks/cancel,
tasks/result, tasks/list (both protocol forms), resources/read, resources/subscribe and /unsubscribe, prompts/get,
and methods the server does not have — with hostile ids, URIs, names and arguments, the channel's key (known only
by value) and credential-shaped text among them: no answer is JSON-RPC error code 0 or an internal error, none
shows a traceback or the key, and the server logs no traceback and no key (server/scrubbing.py).

`test_fuzz_run_directory_json` does the same to the run directories (docs/security.md "A run directory is data, never authority"): each round mutates one file of
a run directory (a field set to junk, another type, a torn or deeply nested document, an attempt claiming
another id, invalid UTF-8, an empty file), sometimes deletes the registry so it is rebuilt from them, then calls
a run tool; the same assertions hold, and a live process that worker.json names is never signalled.
"""
from __future__ import annotations

import json
import random
import re

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.fake_openai import CANARY, FakeOpenAI
from tests.mcp_helpers import LEAKS, names_a_fix, project, slot_held, text

pytestmark = pytest.mark.anyio
SEED, CALLS_STDIO, CALLS_HTTP = 20251201, 260, 120
PASTED_KEY = "sk-proj-" + "A1b2" * 8
VALUE_KEY = "Qm7tX2vK9pL4wR8nB3jH6cD1fG5s"
"""The channel's key in the fuzz: no recognisable shape, so only its value tells it is the key."""

JUNK = [None, True, False, 0, -1, 1, 7, 10**12, -(10**12), 3.5, "", " ", "x" * 5000, "../../../../etc/passwd",
        "a\x00b", "ünï\u202ecødé", PASTED_KEY, "[1, 2]", '{"a": 1}', "true", "-5", "${HOME}",
        "'; DROP TABLE runs; --", [], [1, "a", None], {}, {"a": {"b": [1]}}, ["x"] * 60, VALUE_KEY, CANARY]
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
    assert CANARY not in msg and PASTED_KEY not in msg and VALUE_KEY not in msg, (tool, args, msg[:800])
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


async def test_fuzz_every_tool(tmp_path, monkeypatch, caplog):
    import logging

    from server.app import build_server
    from tools.access import Policy
    from tools.paths import files, manager_for
    ws = project(tmp_path, monkeypatch)
    (ws / "train.log").write_text("openai.AuthenticationError: Error code: 401 - invalid api key\n")
    (ws / "good.toml").write_text("[training]\ntotal_steps = 3\n")
    (ws / "src").mkdir()
    (ws / "src" / "client.py").write_text("import os\nkey = os.environ['TAOTOKEN_API_KEY']\n")
    rng = random.Random(SEED)
    monkeypatch.setenv("TAOTOKEN_API_KEY", VALUE_KEY)
    caplog.set_level(logging.INFO)
    with FakeOpenAI(key=VALUE_KEY) as fake, slot_held(ws / "logs") as keep_slot:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
        local = await _fuzz(build_server(Policy("stdio")), rng, CALLS_STDIO, ws, keep_slot)
        remote = await _fuzz(build_server(Policy("http")), rng, CALLS_HTTP, ws, keep_slot)
        mgr, _ = manager_for(files())
        states = {r.run_id: r.state.value for r in mgr.registry.list(limit=10_000) if r.run_id != "slot-holder"}
    assert local[0] > CALLS_STDIO // 3 and remote[0] > CALLS_HTTP // 3  # the fuzz reaches the error paths
    assert local[1] + remote[1] > 0  # ... and some valid starts
    assert set(states.values()) <= {"queued", "stopped"}, states  # no trainer ever ran
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    assert not [m for m in logged if VALUE_KEY in m or CANARY in m or PASTED_KEY in m]


# --- run-directory JSON: whoever can write a run directory chooses what its files say ---------------------------
RUN_FILES = ["run.json", "state.json", "summary.json", "worker.json", "config.json", "metrics.jsonl",
             "provider.json"]
RUN_TOOLS = ["list_runs", "run_status", "report_metrics", "stop_run", "resume_run", "diagnose_error"]
MUTATIONS_STDIO, MUTATIONS_HTTP = 70, 30


def _junk_json(rng: random.Random, original: object) -> bytes:
    """A mutated file: the original with one field set to junk, junk of another type, a torn or deeply nested
    document, a key claiming another run, invalid UTF-8, or nothing."""
    pick = rng.randrange(8)
    if pick == 0 and isinstance(original, dict) and original:
        return json.dumps({**original, rng.choice(sorted(original)): rng.choice(JUNK)}).encode()
    if pick == 1 and isinstance(original, dict) and isinstance(original.get("attempts"), dict):
        attempts = {k: {**v, rng.choice(["created", "nprocs", "state", "pid", "tags", "started"]): rng.choice(JUNK)}
                    if isinstance(v, dict) else v for k, v in original["attempts"].items()}
        attempts[rng.choice(["x", "../y", "slot-holder", "a" * 200, "r-r1x"])] = {"state": "running", "pid": 1}
        return json.dumps({**original, "attempts": attempts}).encode()
    if pick == 2:
        return json.dumps(rng.choice(JUNK)).encode()
    if pick == 3:
        return json.dumps(original).encode()[: rng.randint(0, 40)]
    if pick == 4:
        return b"[" * 100_000 + b"]" * 100_000
    if pick == 5:
        return b'{"run_id": "\xff\xfe", "created": NaN, "step": Infinity}'
    if pick == 6:
        return b"\n".join(json.dumps({"kind": rng.choice(["train", "eval", 3, None]), "step": rng.choice(JUNK),
                                      "eval/greedy_accuracy": rng.choice(JUNK)}).encode() for _ in range(5))
    return b""


def _mutate(rng: random.Random, run_dirs: list, logs) -> None:
    run_dir = rng.choice(run_dirs)
    name = rng.choice(RUN_FILES)
    path = run_dir / name
    try:
        original = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        original = None
    path.write_bytes(_junk_json(rng, original))
    if rng.random() < 0.3:  # the registry is rebuilt from whatever the directories now say
        for db in logs.glob("runs.sqlite3*"):
            db.unlink()


async def _fuzz_run_dirs(server, rng: random.Random, rounds: int, run_dirs: list, logs, keep_slot) -> int:
    errors = 0
    ids = [d.name for d in run_dirs] + [f"{d.name}-r1" for d in run_dirs] + ["x", "../x", "a" * 81]
    async with Client(server) as c:
        for i in range(rounds):
            _mutate(rng, run_dirs, logs)
            tool = rng.choice(RUN_TOOLS)
            args = {} if tool == "list_runs" else {"run_id": rng.choice(ids)}
            if tool == "stop_run":
                args["force"] = rng.random() < 0.5
            res = await c.call_tool(tool, args)
            _check(tool, args, res)
            errors += bool(res.is_error)
            if i % 10 == 0:
                keep_slot()
        alive = await c.call_tool("list_runs", {"limit": 200})
        assert not alive.is_error, text(alive)
    return errors


async def test_fuzz_run_directory_json(tmp_path, monkeypatch):
    import subprocess
    import sys

    from server.app import build_server
    from tests.conftest import ROOT
    from tools.access import Policy
    from vapo_engine.config import load_config, load_settings
    from vapo_engine.jobs import Registry, State
    from vapo_engine.rundir import RunDir
    from vapo_engine.runs import create_run
    ws = project(tmp_path, monkeypatch)
    logs = ws / "logs"
    reg = Registry(logs)
    cfg, settings = load_config(ROOT / "config.toml"), load_settings(ws / "settings.json")
    run_dirs = []
    for i, state in enumerate([State.SUCCEEDED, State.FAILED, State.STOPPED, State.FAILED]):
        run_dir = create_run(cfg, settings, logs, run_id=f"fz{i}").run_dir
        reg.add(f"fz{i}", settings.experiment.name, ["fz"], run_dir)
        reg.claim_queued(1)
        reg.transition(f"fz{i}", state, "for the fuzz")
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s, "actor/pg_loss": 0.1})
                                                       + "\n" for s in range(1, 4)))
        RunDir(run_dir).write_json("worker.json", {"pid": 1, "pgid": 1, "host": "x"})
        run_dirs.append(run_dir)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],  # noqa: ASYNC220
                                 start_new_session=True)
    try:
        for d in run_dirs[:2]:  # a live process a planted record names: it must never be signalled
            RunDir(d).write_json("worker.json", {"pid": bystander.pid, "pgid": bystander.pid})
        rng = random.Random(SEED + 1)
        with slot_held(logs) as keep_slot:
            local = await _fuzz_run_dirs(build_server(Policy("stdio")), rng, MUTATIONS_STDIO, run_dirs, logs,
                                         keep_slot)
            remote = await _fuzz_run_dirs(build_server(Policy("http")), rng, MUTATIONS_HTTP, run_dirs, logs,
                                          keep_slot)
        assert bystander.poll() is None, "a process named only by a run directory was signalled"
    finally:
        bystander.kill()
    assert local + remote > (MUTATIONS_STDIO + MUTATIONS_HTTP) // 5  # the fuzz reaches the error paths


# --- tasks, resources, prompts and unknown methods ------------------------------------------------------------------
REQUESTS_2025, REQUESTS_2026 = 160, 60
SECRETS = (VALUE_KEY, CANARY, PASTED_KEY)


def _hostile(rng: random.Random, real: list[str]) -> str:
    junk = [s for s in JUNK if isinstance(s, str)]
    return rng.choice([*real, *junk, *SECRETS, f"task-{VALUE_KEY}", "x" * 100_000, "a/b", "%2e%2e", "\ud800",
                       f"abl-{CANARY}", rng.choice(real or ["x"]) + "/../../etc"])


def _request(rng: random.Random, legacy: bool, real: list[str]) -> tuple[str, dict]:
    ids = real + ["20990101-000000-abcdef", "abl-00000000", "task-0123"]
    uri = rng.choice(["vapo://runs", *(f"vapo://runs/{r}{p}" for r in real for p in ("", "/log", "/config")),
                      f"vapo://runs/{_hostile(rng, ids)}", f"vapo://{_hostile(rng, [])}", "file:///etc/passwd",
                      "vapo://runs/" + "y" * 3_000_000])
    prompt = rng.choice(["diagnose_api_error", "train_and_watch", "compare_checkpoints", _hostile(rng, [])])
    args = {rng.choice(["error", "status", "model_path", "preset", "steps", "benchmark", "checkpoint_a",
                        "checkpoint_b", "num_problems", _hostile(rng, [])]): _hostile(rng, ids)
            for _ in range(rng.randint(0, 4))}
    choices = [("tasks/get", {"taskId": _hostile(rng, ids)}), ("tasks/cancel", {"taskId": _hostile(rng, ids)}),
               ("tasks/list", {}), ("resources/read", {"uri": uri}), ("prompts/get", {"name": prompt, "arguments": args}),
               (f"no/such/{rng.choice(SECRETS)}", {}), ("tasks/get", {"taskId": 7})]
    if legacy:
        choices += [("resources/subscribe", {"uri": uri}), ("resources/unsubscribe", {"uri": uri}),
                    ("tasks/result", {"taskId": rng.choice(["task-0123", "nope", *SECRETS])})]
    return rng.choice(choices)


async def _fuzz_requests(server, rng: random.Random, n: int, legacy: bool, real: list[str]) -> int:
    from tests.task_client import Tasks
    errors = 0
    async with Client(server, **({"mode": "legacy"} if legacy else {"extensions": [Tasks()]})) as c:
        for _ in range(n):
            method, params = _request(rng, legacy, real)
            data: dict = {"method": method, "params": params}
            opts: dict = {}
            c.session._stamp(data, opts)
            try:
                shown = json.dumps(await c.session._dispatcher.send_raw_request(method, data["params"], opts))
            except MCPError as e:
                errors += 1
                assert e.error.code not in (0, -32603), (method, str(params)[:300], e.error)
                shown = json.dumps(e.error.model_dump(mode="json"))
            assert not [k for k in SECRETS if k in shown], (method, str(params)[:300], shown[:500])
            assert not any(leak in shown for leak in LEAKS), (method, shown[:500])
        assert not (await c.call_tool("list_runs", {})).is_error  # the session survived everything
    return errors


async def test_fuzz_tasks_resources_and_prompts(tmp_path, monkeypatch, caplog):
    import logging

    from server.app import build_server
    ws = project(tmp_path, monkeypatch)
    monkeypatch.setenv("TAOTOKEN_API_KEY", VALUE_KEY)
    caplog.set_level(logging.INFO)
    rng = random.Random(SEED + 2)
    with slot_held(ws / "logs"):
        async with Client(build_server()) as c:
            real = [(await c.call_tool("start_training", {"preset": "cpu-demo"})).structured_content["run"]["run_id"],
                    (await c.call_tool("ablate", {"preset": "cpu-demo", "variants": ["vapo"]})).structured_content[
                        "ablation_id"]]
        errors = await _fuzz_requests(build_server(), rng, REQUESTS_2025, True, real)
        errors += await _fuzz_requests(build_server(), rng, REQUESTS_2026, False, real)
    assert errors > (REQUESTS_2025 + REQUESTS_2026) // 3  # the fuzz reaches the error paths
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    assert not [m for m in logged if any(k in m for k in SECRETS)], [m[:300] for m in logged if VALUE_KEY in m]
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
