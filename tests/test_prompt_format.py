"""Prompts the model expects (docs/training.md "Train a real model"): an instruct model's chat template (with the task's format instruction as
the system message unless model.system_prompt says otherwise), plain text for base models, one encoding for
rollouts, evaluation, replayed provider answers and `vapo-mcp eval`, shown by `vapo-mcp config check`."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from server.cli import main
from tests.conftest import write_workspace
from tests.engine_helpers import make_run
from vapo_engine.config.train_model import ModelConfig
from vapo_engine.prompts import (
    PLAIN,
    PromptFormatError,
    check_prompts,
    encode_prompts,
    has_chat_template,
    resolve_prompt_format,
)
from vapo_engine.tasks import get_task

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
"""A template that writes its own BOS: the encoded prompt must hold exactly one."""
TASK = get_task("builtin:addition")


@pytest.fixture(scope="module")
def chat_dir(model_dir, tmp_path_factory):
    """The tiny model with a chat template in its tokenizer_config.json (an 'instruct' model)."""
    folder = shutil.copytree(model_dir, tmp_path_factory.mktemp("chat") / "model")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return folder


def _models(path):
    from vapo_engine.trainer.models import load_models
    return load_models(path, value_path=None, need_value=False, reference_path=None, device=torch.device("cpu"),
                       autocast_dtype=None)


def _prompt_rows(ro) -> list[list[int]]:
    """The unpadded prompt ids of each rollout row."""
    p = ro.prompt_len
    return [ids[:p][mask[:p] > 0].tolist() for ids, mask in zip(ro.input_ids, ro.attention_mask)]


def _rollout(models, fmt, n: int = 2):
    from vapo_engine.rollout.experience import sample_rollout
    problems = TASK.heldout(n)
    return problems, sample_rollout(models, TASK, problems, max_new_tokens=3, temperature=1.0, top_p=1.0,
                                    prompt_format=fmt)


def test_has_chat_template_reads_the_tokenizer_files(model_dir, chat_dir, tmp_path):
    assert has_chat_template(chat_dir) and not has_chat_template(model_dir)
    jinja = shutil.copytree(model_dir, tmp_path / "jinja")
    (jinja / "chat_template.jinja").write_text(TEMPLATE)
    assert has_chat_template(jinja)
    processor_only = shutil.copytree(model_dir, tmp_path / "processor")
    (processor_only / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    assert not has_chat_template(processor_only), "AutoTokenizer does not read a processor's chat_template.json"
    assert not has_chat_template(tmp_path / "missing")


def test_auto_uses_the_chat_template_and_rollout_ids_equal_apply_chat_template(chat_dir):
    models = _models(chat_dir)
    tok = models.tokenizer
    fmt = resolve_prompt_format(ModelConfig(), tok, TASK)
    assert fmt.mode == "chat" and fmt.system == TASK.system_prompt
    problems, ro = _rollout(models, fmt)
    for row, prob in zip(_prompt_rows(ro), problems):
        msgs = [{"role": "system", "content": TASK.system_prompt}, {"role": "user", "content": prob.prompt}]
        assert row == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert row.count(tok.bos_token_id) == 1 and row[0] == tok.bos_token_id, "one BOS, the template's"
        assert tok.decode(row[1:]) == f"<system>{TASK.system_prompt}\n<user>{prob.prompt}\n<assistant>"


def test_plain_on_a_templated_model_gives_the_raw_prompt_ids(chat_dir):
    models = _models(chat_dir)
    assert resolve_prompt_format(ModelConfig(prompt_format="plain"), models.tokenizer, TASK) == PLAIN
    problems, ro = _rollout(models, PLAIN)
    assert _prompt_rows(ro) == [models.tokenizer(p.prompt)["input_ids"] for p in problems]
    assert _prompt_rows(_rollout(models, None)[1]) == _prompt_rows(ro), "None is plain (today's behaviour)"


def test_chat_without_a_template_is_a_clear_error(model_dir):
    models = _models(model_dir)
    chat = ModelConfig(prompt_format="chat")
    for source in (models.tokenizer, model_dir):
        with pytest.raises(PromptFormatError, match=r"model\.prompt_format.*Fix: set model\.prompt_format = \"plain\""):
            resolve_prompt_format(chat, source, TASK)
    assert resolve_prompt_format(ModelConfig(), models.tokenizer, TASK) == PLAIN, "auto: plain without a template"


def test_system_prompt_none_empty_and_custom(chat_dir):
    tok = _models(chat_dir).tokenizer
    prompt = TASK.heldout(1)[0].prompt

    def text(system):
        fmt = resolve_prompt_format(ModelConfig(system_prompt=system), tok, TASK)
        return tok.decode(encode_prompts(tok, [prompt], fmt)[0], skip_special_tokens=True)

    assert text(None) == f"<system>{TASK.system_prompt}\n<user>{prompt}\n<assistant>"
    assert text("") == f"<user>{prompt}\n<assistant>", "\"\" = no system message"
    assert text("Be brief.") == f"<system>Be brief.\n<user>{prompt}\n<assistant>"


def test_a_template_that_refuses_a_system_message_is_named_at_setup(model_dir):
    from vapo_engine.rollout.tokenizer import load_tokenizer
    tok = load_tokenizer(model_dir)
    tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                         "{% endif %}" + TEMPLATE)
    with pytest.raises(PromptFormatError, match=r"model\.system_prompt.*System role not supported.*Fix: set "
                                                r"model\.system_prompt = \"\""):
        resolve_prompt_format(ModelConfig(), tok, TASK)
    assert resolve_prompt_format(ModelConfig(system_prompt=""), tok, TASK).system is None


def test_a_chat_model_trains_and_provider_answers_are_encoded_like_rollouts(tmp_path, chat_dir, monkeypatch):
    from vapo_engine.trainer import setup
    from vapo_engine.trainer.loop import train
    from vapo_engine.trainer.provider_samples import ProviderSamples
    run_dir = make_run(tmp_path, chat_dir, ["training.total_steps=2", "data.train=builtin:addition",
                                            "eval.benchmark=builtin:addition"])
    lines: list[str] = []
    summary = train(run_dir, log=lines.append)
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    said = [x for x in lines if x.startswith("prompts:")]
    assert said == [f"prompts: chat template of {chat_dir} (system: the task's format instruction)"]
    seen = {}
    real = setup.provider_samples
    monkeypatch.setattr(setup, "provider_samples", lambda *a, **kw: seen.update(kw) or real(*a, **kw))
    tr = setup.build_trainer(run_dir, write=False, log=lambda m: None)
    assert seen["prompt_format"] == tr.prompts and tr.prompts.mode == "chat"
    assert tr.eval_prompts.system == tr.eval_task.system_prompt
    problems, ro = _rollout(tr.models, tr.prompts)
    from vapo_engine.tasks.verifiers import make_judge
    fake = SimpleNamespace(counts=Counter(), task=TASK, tok=tr.models.tokenizer, cap=64, prompt_format=tr.prompts,
                           judge=make_judge("", TASK))
    for row, prob in zip(_prompt_rows(ro), problems):
        prompt_ids, resp = ProviderSamples._pair(fake, prob.prompt, prob.answer, TASK.solve(prob.prompt))
        assert prompt_ids == row == encode_prompts(tr.models.tokenizer, [prob.prompt], tr.prompts)[0]
        assert resp[-1] == tr.models.tokenizer.eos_token_id


def _check(project, *sets: str) -> int:
    args = ["config", "check", "--config", str(project / "config.toml"), "--settings", str(project / "settings.json")]
    return main([*args, *[x for s in sets for x in ("--set", s)]])


def test_config_check_shows_how_prompts_are_made(project, clean_env, capsys, chat_dir, model_dir):
    assert _check(project) == 0
    assert "  prompts: plain (the built-in model has no chat template)" in capsys.readouterr().out
    assert _check(project, f'model.local_path="{chat_dir}"') == 0
    assert f"prompts: chat template of {chat_dir} (system: the task's format instruction)" in capsys.readouterr().out
    assert _check(project, f'model.local_path="{chat_dir}"', 'model.system_prompt=""') == 0
    assert "(system: none)" in capsys.readouterr().out
    assert _check(project, f'model.local_path="{chat_dir}"', 'model.prompt_format="plain"') == 0
    assert 'prompts: plain (model.prompt_format = "plain")' in capsys.readouterr().out
    assert _check(project, f'model.local_path="{model_dir}"') == 0
    assert f"prompts: plain ({model_dir} has no chat template)" in capsys.readouterr().out
    assert _check(project, f'model.local_path="{model_dir}"', 'model.prompt_format="chat"') == 2
    err = capsys.readouterr().err
    assert "model.prompt_format" in err and "has none" in err and "Traceback" not in err
    rc = main(["config", "check", "--json", "--config", str(project / "config.toml"), "--settings",
               str(project / "settings.json"), "--set", f'model.local_path="{chat_dir}"'])
    assert rc == 0 and json.loads(capsys.readouterr().out)["prompts"]["format"] == "chat"


def test_check_prompts_resolves_relative_paths_against_the_config_folder(chat_dir):
    rel = ModelConfig(local_path=chat_dir.name)
    assert check_prompts(rel, chat_dir.parent).mode == "chat"
    assert check_prompts(rel, chat_dir.parent / "elsewhere").mode is None


def test_start_training_refuses_chat_for_a_model_without_a_template(tmp_path, model_dir):
    from tools.paths import Files, ToolInputError
    from tools.training import prepare_config
    files = Files(*write_workspace(tmp_path))
    over = [f'model.local_path="{model_dir}"', 'model.prompt_format="chat"', "eval.benchmark=builtin:addition"]
    with pytest.raises(ToolInputError, match=r"model\.prompt_format"):
        prepare_config(files, None, over)


def test_local_eval_uses_the_configured_format(chat_dir, monkeypatch):
    from vapo_engine.rollout import evaluate as rollout_evaluate
    from vapo_engine.serving.local_eval import evaluate_dir
    seen = []
    monkeypatch.setattr(rollout_evaluate, "evaluate", lambda *a, **kw: seen.append(kw["prompt_format"]) or {})
    spec = {"model_dir": str(chat_dir), "benchmark": "builtin:addition", "data_dir": ".", "num_problems": 1,
            "samples_per_problem": 1, "max_tokens": 4, "temperature": 1.0, "top_p": 1.0, "seed": 0, "device": "cpu"}
    evaluate_dir(spec)
    evaluate_dir({**spec, "prompt_format": "plain"})
    assert seen[0].mode == "chat" and seen[0].system == TASK.system_prompt and seen[1] == PLAIN


def test_the_eval_plan_carries_the_config_format(tmp_path):
    from tools.evaluate import make_plan
    from tools.paths import Files
    files = Files(*write_workspace(tmp_path))
    text = files.config.read_text().replace('# prompt_format = "auto"', 'prompt_format = "plain"')
    files.config.write_text(text)
    plan, _ = make_plan(files, run_dir=None, step=None, benchmark="builtin:addition", num_problems=1, samples=1,
                        max_tokens=None)
    assert (plan.prompt_format, plan.system_prompt) == ("plain", None)
