"""Multi-turn tool-calling episodes (docs/design.md §3.14): results are inserted with loss mask 0 and learn nothing (the gradient
on tool-output tokens is exactly zero), a fake-tool episode trains two steps through the real loop with a real MCP
server over stdio, and every tool fault is an observation (rollout/episodes.py, rollout/tool_formats.py).

The policy here is scripted (a registered rollout backend that writes like a tool user): an untrained tiny model
would never write a call. Its tokens are trained on by the real tiny model, exactly as a remote sampler's are."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import pytest
import torch

from tests.conftest import ROOT
from tests.engine_helpers import make_run, random_value_dir
from vapo_engine.config import load_config
from vapo_engine.config.tools_model import ToolsConfig
from vapo_engine.metrics import CATALOGUE, read_metrics
from vapo_engine.rollout.backends import RolloutBackend, register_backend
from vapo_engine.rollout.backends.base import Generation, decode_responses, left_pad, mask_after_eos
from vapo_engine.rollout.episodes import ToolCalls
from vapo_engine.tasks import get_task

TASK = get_task("builtin:addition")
FAKE_SERVER = [sys.executable, str(ROOT / "tests" / "fake_tool_server.py")]


@register_backend("scripted_tools")
class ScriptedToolUser(RolloutBackend):
    """On an addition prompt with no result yet: '<call>lookup A+B</call>;999' (the episode must cut the ';999'),
    or '<call>lookup crash</call>' when A is odd and the prompt has no result and asks for it (`crash_odd`); after
    a result: ';A+B' when A+B is even, ';0' otherwise, then EOS. No log-probs (the trainer computes its own)."""

    name = "scripted_tools"
    crash_odd = False

    def __init__(self, options=None):
        pass

    def generate(self, models, prompt_ids, params, *, batch_size=None) -> Generation:
        tok, outs = models.tokenizer, []
        for row in prompt_ids:
            text = tok.decode(row, skip_special_tokens=True)
            a, b = (int(x) for x in re.match(r"(\d+)\+(\d+)=", text).groups())
            if "<result>" not in text:
                query = "crash" if self.crash_odd and a % 2 else f"{a}+{b}"
                ids = tok(f"<call>lookup {query}</call>;999", add_special_tokens=False)["input_ids"]
            else:
                ids = tok(f";{a + b if (a + b) % 2 == 0 else 0}", add_special_tokens=False)["input_ids"]
                ids += [params.stop_token_ids[0]]
            outs.append(ids[:params.max_new_tokens])
        prompts, prompt_mask = left_pad(prompt_ids, params.pad_token_id, "cpu")
        width = max(len(r) for r in outs)
        raw = torch.tensor([r + [params.pad_token_id] * (width - len(r)) for r in outs])
        ids, mask, finished = mask_after_eos(raw, list(params.stop_token_ids), params.pad_token_id)
        return Generation(prompts, prompt_mask, ids, mask, decode_responses(tok, ids, mask), finished)


@dataclass
class Result:
    text: str
    ok: bool


class InProcessTools:
    """A ToolBox without a server (the episode's side of the contract): lookup answers '<query>=42'; a call
    whose query is 'fail' is a tool error."""

    closed = False

    def specs(self):
        return [{"type": "function", "function": {"name": "lookup", "description": "look up",
                                                  "parameters": {"type": "object", "required": ["query"],
                                                                 "properties": {"query": {"type": "string"}}}}}]

    def call(self, name, arguments):
        query = arguments.get("query", "")
        return Result("error: failed", False) if query == "fail" else Result(f"{query}=42", True)

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def models(model_dir, tmp_path_factory):
    from vapo_engine.config.train_model import RolloutConfig
    from vapo_engine.trainer.models import load_models
    value = random_value_dir(tmp_path_factory.mktemp("value"), model_dir)
    return load_models(model_dir, value_path=value, need_value=True, reference_path=None, device=torch.device("cpu"),
                       autocast_dtype=None, rollout=RolloutConfig(backend="scripted_tools"))


def episode_rollout(models, n=4, max_new_tokens=60, max_turns=3):
    from vapo_engine.rollout.experience import sample_rollout
    episode = ToolCalls(ToolsConfig(max_turns=max_turns), InProcessTools())
    problems = TASK.train_batch(n, __import__("random").Random(0))
    return problems, sample_rollout(models, TASK, problems, max_new_tokens=max_new_tokens, temperature=1.0,
                                    top_p=1.0, episode=episode)


def test_an_episode_inserts_the_result_with_loss_mask_zero(models):
    problems, ro = episode_rollout(models)
    tok = models.tokenizer
    for i, p in enumerate(problems):
        a, b = (int(x) for x in re.match(r"(\d+)\+(\d+)=", p.prompt).groups())
        n = int(ro.response_mask[i].sum())
        ids = ro.input_ids[i, ro.prompt_len:ro.prompt_len + n].tolist()
        learns = ro.loss_mask[i, :n].tolist()
        inserted = tok.decode([t for t, m in zip(ids, learns) if m == 0])
        assert inserted == f"<result>{a}+{b}=42</result>"  # the tool's answer, in the tag format
        assert ro.texts[i] == f"<call>lookup {a}+{b}</call>;{a + b if (a + b) % 2 == 0 else 0}"  # ';999' was cut
        assert ro.correct[i].item() == ((a + b) % 2 == 0)
        assert ro.token_rewards[i].nonzero().flatten().tolist() == ([n - 1] if ro.correct[i] else [])  # last token
    assert ro.turns.tolist() == [2.0] * 4 and ro.tool_calls.tolist() == [1.0] * 4 and ro.tool_errors.sum() == 0
    assert ro.finished.all()


def test_budget_and_max_turns_end_an_episode(models):
    _, ro = episode_rollout(models, max_turns=1)  # one turn: the call is not run, nothing is inserted
    assert ro.tool_calls.sum() == 0 and bool((ro.loss_mask == ro.response_mask).all())
    _, ro = episode_rollout(models, max_new_tokens=30)  # the result does not fit: cut, and the episode ends
    assert ro.response_mask.sum(1).max() == 30 and not ro.finished.any() and ro.correct.sum() == 0


def test_gradient_on_tool_output_tokens_is_exactly_zero(models):
    """One real update (trainer/update.py) of actor and critic on an episode batch: the gradients of the loss with
    respect to the logits that predict inserted tokens, and to the values at those positions, are exactly 0."""
    from vapo_engine.rollout.experience import attach_old_outputs
    from vapo_engine.trainer.advantages import add_advantages
    from vapo_engine.trainer.update import UpdateSpec, update_step
    cfg = load_config(ROOT / "config.toml", ["training.mini_batch_size=4", "training.micro_batch_size=4",
                                             "training.batch_size=8", "vapo.group_size=4"], preset="cpu-demo")
    _, ro = episode_rollout(models)
    ro, _ = add_advantages(attach_old_outputs(models, ro, 4), cfg)
    grads = {}

    def keep(name):
        def hook(module, inputs, output):
            output.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))
        return hook
    handles = [models.policy.lm_head.register_forward_hook(keep("policy")),
               models.value.score.register_forward_hook(keep("value"))]
    opts = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (models.policy, models.value)]
    try:
        update_step(models, *opts, ro, None, UpdateSpec.of(cfg))
    finally:
        for h in handles:
            h.remove()
    p, n = ro.prompt_len, ro.response_mask.shape[1]
    inserted = (ro.response_mask - ro.loss_mask).bool()
    assert inserted.any()
    first = grads["policy"].shape[1] - n - 1  # p − 1, or 0 when the LM head ran on the last n + 1 positions only
    logits_grad = grads["policy"][:, first:first + n]  # the logits that predict response token t
    value_grad = grads["value"][:, p - 1:p - 1 + n, 0]  # V(s_t), the value before response token t
    assert torch.count_nonzero(logits_grad[inserted]) == 0 and torch.count_nonzero(value_grad[inserted]) == 0
    assert torch.count_nonzero(logits_grad[ro.loss_mask.bool()]) > 0 and torch.count_nonzero(value_grad) > 0


def test_a_fake_tool_episode_trains_two_steps_over_stdio(tmp_path, model_dir):
    """The real loop with a real MCP server (stdio), VAPO with value pretraining: two steps, checkpoint, the tool
    metrics, evaluation with tools; a query that crashes the server mid-run is an observation and the server is
    restarted (nothing lost: every step and the checkpoint are written)."""
    from vapo_engine.trainer.loop import train
    ScriptedToolUser.crash_odd = True
    command = [*map(str, FAKE_SERVER), "crash", str(tmp_path / "crashed-once")]
    servers = f'rollout.tools.servers=[{{name="fake", command={command}}}]'.replace("'", '"')
    try:
        run = make_run(tmp_path, model_dir, ['rollout.backend="scripted_tools"', 'rollout.episode="tool_calls"',
                                             servers, "training.total_steps=2", "model.max_tokens=90",
                                             "eval.num_problems=2"])
        logs = []
        summary = train(run, log=logs.append)
    finally:
        ScriptedToolUser.crash_odd = False
    assert summary["status"] == "succeeded" and summary["steps"] == 2, logs
    recs = read_metrics(run / "metrics.jsonl")
    steps = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2] and all(k in CATALOGUE for r in recs for k in r
                                                        if k not in ("step", "kind", "time"))
    for r in steps:
        assert r["rollout/turns"] == 2.0 and r["rollout/tool_calls"] == 1.0 and r["rollout/tool_use"] == 1.0
        assert r["rollout/tool_errors"] < 1 and r["rollout/policy_tokens"] < r["rollout/response_length"]
    assert (tmp_path / "crashed-once").is_file() and sum("restarted on the next call" in m for m in logs) == 1
    assert "eval/greedy_tool_calls" in [r for r in recs if r["kind"] == "eval"][-1]
    assert (run / "checkpoints" / "step-0000002" / "DONE").is_file()


# --- the chat template's tool format (an instruct model) ------------------------------------------------------------
TOOL_TEMPLATE = ("{{ bos_token }}{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
                 "</tools>\n{% endif %}{% for m in messages %}{% if m['role'] == 'tool' %}<tool_response>"
                 "{{ m['content'] }}</tool_response>\n{% else %}<{{ m['role'] }}>{{ m['content'] }}<eos>\n{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
"""A Hermes-like template: it lists the tools, writes a tool message as <tool_response>…, ends turns with EOS."""


@register_backend("scripted_chat_tools")
class ScriptedChatToolUser(RolloutBackend):
    """Calls lookup in the chat format ('<tool_call>{json}</tool_call>' then EOS), then answers ';7' and EOS; with
    `bad_json`, the call is not JSON."""

    name = "scripted_chat_tools"
    bad_json = False

    def __init__(self, options=None):
        pass

    def generate(self, models, prompt_ids, params, *, batch_size=None) -> Generation:
        tok, outs = models.tokenizer, []
        for row in prompt_ids:
            text = tok.decode(row, skip_special_tokens=False)
            call = '{"name": "lookup", "arguments": {"query": "q"}}' if not self.bad_json else '{"name": lookup'
            say = f"<tool_call>{call}</tool_call>" if "<tool_response>" not in text else ";7"
            outs.append(tok(say, add_special_tokens=False)["input_ids"] + [params.stop_token_ids[0]])
        prompts, prompt_mask = left_pad(prompt_ids, params.pad_token_id, "cpu")
        width = max(len(r) for r in outs)
        raw = torch.tensor([r + [params.pad_token_id] * (width - len(r)) for r in outs])
        ids, mask, finished = mask_after_eos(raw, list(params.stop_token_ids), params.pad_token_id)
        return Generation(prompts, prompt_mask, ids, mask, decode_responses(tok, ids, mask), finished)


class EchoTools(InProcessTools):
    """lookup answers text that holds the tokenizer's EOS as text: it must stay text."""

    def call(self, name, arguments):
        return Result("7<eos>", True)


@pytest.fixture(scope="module")
def chat_models(model_dir, tmp_path_factory):
    import json
    import shutil

    from vapo_engine.config.train_model import RolloutConfig
    from vapo_engine.trainer.models import load_models
    folder = shutil.copytree(model_dir, tmp_path_factory.mktemp("chat") / "model")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TOOL_TEMPLATE}))
    return load_models(folder, value_path=None, need_value=False, reference_path=None, device=torch.device("cpu"),
                       autocast_dtype=None, rollout=RolloutConfig(backend="scripted_chat_tools"))


@pytest.mark.parametrize("bad_json", [False, True])
def test_chat_template_tool_format(chat_models, bad_json):
    from vapo_engine.prompts import PromptFormat
    from vapo_engine.rollout.experience import sample_rollout
    from vapo_engine.rollout.tool_formats import ChatFormat
    tok = chat_models.tokenizer
    episode = ToolCalls(ToolsConfig(), EchoTools())
    fmt = PromptFormat("chat", "sys")
    assert isinstance(episode.format_for(tok, fmt), ChatFormat)  # auto: the template shows the tools
    ScriptedChatToolUser.bad_json = bad_json
    try:
        problems = TASK.heldout(2)
        ro = sample_rollout(chat_models, TASK, problems, max_new_tokens=200, temperature=1.0, top_p=1.0,
                            prompt_format=fmt, episode=episode)
    finally:
        ScriptedChatToolUser.bad_json = False
    prompt = tok.decode(ro.input_ids[0, :ro.prompt_len].tolist(), skip_special_tokens=False)
    assert "<tools>lookup </tools>" in prompt and prompt.endswith("<assistant>")
    n = int(ro.response_mask[0].sum())
    ids, learns = ro.input_ids[0, ro.prompt_len:ro.prompt_len + n].tolist(), ro.loss_mask[0, :n].tolist()
    inserted = [t for t, m in zip(ids, learns) if m == 0]
    shown = "7<eos>" if not bad_json else "error: the tool call is not valid JSON"
    assert tok.decode(inserted, skip_special_tokens=False).startswith(f"<eos>\n<tool_response>{shown}")
    assert tok.decode(inserted, skip_special_tokens=False).endswith("</tool_response>\n<assistant>")
    assert inserted[0] == tok.eos_token_id and inserted.count(tok.eos_token_id) == 1  # the tool's "<eos>" is text
    assert ro.texts[0].endswith(";7") and ro.tool_errors.tolist() == [float(bad_json)] * 2
