"""`vapo-mcp eval` and the MCP tool `evaluate`: the same held-out problems, checker and avg@k as a run's
evaluation, locally (a worker process running the run's own evaluation) and through the channel (here: a real
served checkpoint on 127.0.0.1), which must agree on greedy accuracy; exit codes, failures, the run's
settings, path confinement for remote callers, and a provider that refuses the key."""
from __future__ import annotations

import json
import random

import pytest
from mcp import Client

from server.cli import main
from tests.fake_openai import CANARY, FakeOpenAI, closed_port
from tests.mcp_helpers import names_a_fix, text
from tests.serving_helpers import cached_addition_model, run_with_checkpoint, serving


def test_accuracy_names_and_values_match_the_runs_evaluation():
    from tools.evaluate import accuracies
    from vapo_engine.rollout.evaluate import accuracies as run_accuracies
    from vapo_engine.tasks.chain import ChainTask
    task = ChainTask()
    problems = task.heldout(60)
    rewards = [float(random.Random(i).random() < 0.4) for i in range(60)]
    ours = accuracies("greedy", task, problems, rewards)
    assert ours == run_accuracies("greedy", task, problems, rewards)
    assert {"eval/greedy_accuracy", "eval/greedy_accuracy_short", "eval/greedy_accuracy_long"} <= set(ours)


@pytest.fixture
def eval_files(runs_env, monkeypatch):
    """The runs_env workspace with a channel key; the base URL is set by each test."""
    monkeypatch.setenv("TAOTOKEN_API_KEY", CANARY)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return runs_env[0]


def test_local_and_served_greedy_accuracy_agree_tiny(eval_files, model_dir, monkeypatch):
    from tools.evaluate import evaluate_sync
    with serving(model_dir, model_name="tiny") as s:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", s.url)
        remote = evaluate_sync(eval_files, backend="channel", model="tiny", benchmark="builtin:addition",
                               num_problems=16, samples_per_problem=1)
    local = evaluate_sync(eval_files, backend="local", model_dir=str(model_dir), benchmark="builtin:addition",
                          num_problems=16, samples_per_problem=1)
    assert local.ok and remote.ok and local.problems == remote.problems == 16
    assert abs(local.greedy_accuracy - remote.greedy_accuracy) <= 0.02
    assert remote.requests == 32 and remote.failures.count == 0 and remote.models_used == {"tiny": 32}
    assert remote.tokens["prompt"] > 0 and remote.latency_ms["p95"] >= remote.latency_ms["p50"] > 0
    assert remote.max_tokens == local.max_tokens == 38  # config.toml's 4096, capped by the task's answer length
    assert set(local.metrics) == set(remote.metrics)  # the run's eval/* names on both sides


@pytest.mark.skipif(cached_addition_model() is None, reason="built-in addition model's recipe changed, not rebuilt")
def test_local_and_served_greedy_accuracy_agree_on_the_addition_model(eval_files, monkeypatch, capsys):
    import tools.evaluate as ev
    model = cached_addition_model()
    local = ev.evaluate_sync(eval_files, backend="local", model_dir=str(model), benchmark="builtin:addition",
                             num_problems=200, samples_per_problem=0)
    with serving(model, model_name="tiny-addition") as s:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", s.url)
        remote = ev.evaluate_sync(eval_files, backend="channel", model="tiny-addition",
                                  benchmark="builtin:addition", num_problems=200, samples_per_problem=0)
        calls = s.health()["engine"]["generate_calls"]
    with capsys.disabled():
        print(f"\n[agreement] builtin:addition, 200 held-out problems, greedy: local {local.greedy_accuracy:.3f} "
              f"({local.seconds:.1f} s), served {remote.greedy_accuracy:.3f} ({remote.seconds:.1f} s, "
              f"{calls} generate calls, p50 {remote.latency_ms['p50']:.0f} ms)")
    assert local.greedy_accuracy > 0.4  # a trained model, so agreement means something
    assert abs(local.greedy_accuracy - remote.greedy_accuracy) <= 0.02


def test_eval_cli_exit_codes_and_json(eval_files, model_dir, capsys, monkeypatch):
    argv = ["--config", str(eval_files.config), "--settings", str(eval_files.settings)]
    assert main(["eval", *argv]) == 2
    assert "--run RUN_ID or --model-dir DIR" in capsys.readouterr().err
    with serving(model_dir, model_name="qwen-32b") as s:  # settings.json's models.reasoning
        monkeypatch.setenv("TAOTOKEN_BASE_URL", s.url)
        code = main(["eval", *argv, "--channel", "--benchmark", "builtin:addition", "--num-problems", "4",
                     "--samples", "0", "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0 and report["ok"] and report["model"] == "qwen-32b" and report["requests"] == 4
        code = main(["eval", *argv, "--channel", "--benchmark", "builtin:addition", "--num-problems", "3",
                     "--samples", "1"])
        out = capsys.readouterr().out
        assert code == 0 and "greedy" in out and "avg@1" in out and "latency" in out and "OK:" in out
    monkeypatch.setenv("TAOTOKEN_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    code = main(["eval", *argv, "--channel", "--benchmark", "builtin:addition", "--num-problems", "50", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["ok"] and report["failures"]["count"] == report["requests"]
    assert "stopped" in report["summary"] and report["failures"]["kinds"].get("cancelled", 0) > 0
    assert main(["eval", *argv, "--model-dir", str(model_dir), "--benchmark", "no_such_set"]) == 2
    assert "no_such_set.jsonl" in capsys.readouterr().err


def test_a_provider_that_refuses_the_key_stops_the_evaluation_early(eval_files, monkeypatch):
    from tools.evaluate import evaluate_sync
    with FakeOpenAI(key="sk-the-right-key-000000000000") as fake:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", fake.base_url)
        report = evaluate_sync(eval_files, backend="channel", benchmark="builtin:addition", num_problems=200,
                               samples_per_problem=2, concurrency=4)
        sent = fake.count("POST /v1/chat/completions")
    assert not report.ok and report.failures.kinds.get("auth", 0) >= 1 and "401" in report.summary
    assert sent <= 8 < report.requests == 600  # not 600 doomed requests
    assert CANARY not in report.model_dump_json()


def test_eval_of_a_runs_checkpoint_uses_the_runs_settings(runs_env, eval_files, model_dir, monkeypatch):
    from tools.evaluate import evaluate_sync
    files, mgr = runs_env
    run_with_checkpoint(files, mgr, model_dir, step=2)
    report = evaluate_sync(files, backend="local", run_id="served-run")
    assert report.ok and report.run_id == "served-run" and report.step == 2
    assert report.model == "served-run@step-2"
    assert (report.problems, report.samples_per_problem, report.max_tokens) == (12, 1, 12)  # run config.json
    assert report.benchmark == "builtin:addition" and "run served-run" in report.settings_from
    with serving(model_dir, model_name="qwen-32b") as s:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", s.url)
        api = evaluate_sync(files, backend="channel", run_id="served-run")  # the API model on the run's eval
    assert api.ok and (api.problems, api.requests, api.max_tokens, api.temperature) == (12, 24, 12, 1.0)
    assert abs(api.greedy_accuracy - report.greedy_accuracy) <= 0.02  # the same weights behind both


@pytest.mark.anyio
async def test_mcp_evaluate_tool(proj, model_dir, monkeypatch):
    from server.app import build_server
    from tools.access import Policy
    from tools.paths import files, manager_for
    mgr, _ = manager_for(files())
    run_with_checkpoint(files(), mgr, model_dir, step=4)
    with serving(model_dir, model_name="qwen-32b") as s:
        monkeypatch.setenv("TAOTOKEN_BASE_URL", s.url)
        async with Client(build_server()) as c:
            tool = {t.name: t for t in (await c.list_tools()).tools}["evaluate"]
            bounds = [o.get("maximum") for o in tool.input_schema["properties"]["num_problems"]["anyOf"]]
            assert tool.annotations.read_only_hint and 1000 in bounds
            res = await c.call_tool("evaluate", {"benchmark": "builtin:addition", "num_problems": 5,
                                                 "samples_per_problem": 1})
            assert not res.is_error, text(res)
            sc = res.structured_content
            assert sc["ok"] and sc["backend"] == "channel" and sc["problems"] == 5 and sc["requests"] == 10
            local = await c.call_tool("evaluate", {"backend": "local", "run_id": "served-run",
                                                   "benchmark": "builtin:addition", "num_problems": 5})
            assert not local.is_error and local.structured_content["step"] == 4, text(local)
            cases = (({"backend": "local"}, "run_id"),
                     ({"run_id": "nope-run", "backend": "local"}, "unknown run id"),
                     ({"benchmark": "missing_set"}, "missing_set.jsonl"),
                     ({"num_problems": 5000}, "1–1000"),
                     ({"backend": "local", "run_id": "served-run", "step": 9}, "usable steps: 4"))
            for args, needle in cases:
                bad = await c.call_tool("evaluate", args)
                assert bad.is_error and needle in text(bad) and names_a_fix(text(bad)), (args, text(bad))
        async with Client(build_server(Policy("http"))) as c:
            bad = await c.call_tool("evaluate", {"benchmark": "/etc/passwd.jsonl"})
            assert bad.is_error and "outside the allowed roots" in text(bad)
    assert CANARY not in json.dumps(sc)
