"""[critic] (docs/design.md §3.8): a value model smaller than the policy — its own folder or a width/depth fraction of the
policy. Config errors are clear; the scaled config has the expected shape; a run with the smaller critic trains,
its critic has fewer parameters, its checkpoint holds the small critic and resume continues identically."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.engine_helpers import make_run
from vapo_engine.config import load_config
from vapo_engine.metrics import read_metrics


@pytest.mark.parametrize("over, key, words", [
    (["critic.width_ratio=0"], "critic.width_ratio", "greater than 0"),
    (["critic.depth_ratio=1.5"], "critic.depth_ratio", "less than or equal to 1"),
    (['critic.model_path="/m"', "critic.depth_ratio=0.5"], "critic.model_path", "not both"),
    (['critic.model_path="/m"', 'model.value_path="/v"'], "critic.model_path", "keep one of the two"),
])
def test_bad_critic_settings_are_named_with_the_fix(over, key, words):
    from vapo_engine.config import ConfigError
    with pytest.raises(ConfigError) as e:
        load_config(ROOT / "config.toml", over)
    assert key in str(e.value) and words in str(e.value)


def test_smaller_config_scales_layers_heads_and_mlp():
    from transformers import Qwen2Config

    from vapo_engine.trainer.small_critic import CriticShapeError, smaller_config
    cfg = Qwen2Config(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=512, vocab_size=100)
    small = smaller_config(cfg, width=0.5, depth=0.5)
    assert (small.num_hidden_layers, small.num_attention_heads, small.num_key_value_heads, small.hidden_size,
            small.intermediate_size, small.vocab_size) == (2, 2, 1, 64, 256, 100)
    assert len(small.layer_types) == 2 and cfg.num_hidden_layers == 4  # a copy
    assert smaller_config(cfg, width=0.1, depth=0.1).num_hidden_layers == 1  # at least one layer and head
    from transformers import GPT2Config  # n_inner, no intermediate_size
    with pytest.raises(CriticShapeError, match="no intermediate_size: give the critic its own folder"):
        smaller_config(GPT2Config(), 0.5, 1.0)


def _value_weights(ckpt):
    return load_file(ckpt / "value" / "model.safetensors")


def test_a_run_with_the_smaller_critic_trains_checkpoints_and_resumes(tmp_path, model_dir):
    from vapo_engine.trainer.loop import train
    from vapo_engine.trainer.setup import build_trainer
    over = ["critic.width_ratio=0.5", "critic.depth_ratio=0.5", "training.total_steps=4", "eval.eval_interval=100"]
    full = make_run(tmp_path, model_dir, over, name="full")
    tr = build_trainer(full, write=False, log=lambda m: None)
    n_value = sum(p.numel() for p in tr.models.value.parameters())
    n_policy = sum(p.numel() for p in tr.models.policy.parameters())
    assert tr.models.value.config.num_hidden_layers == 1 and n_value < n_policy / 4
    assert train(full, log=lambda m: None)["status"] == "succeeded"
    recs = [r for r in read_metrics(full / "metrics.jsonl") if r["kind"] == "train"]
    assert len(recs) == 4 and all("critic/value_loss" in r for r in recs)  # (an untrained model earns no reward)
    saved = json.loads((full / "checkpoints/step-0000004/value/config.json").read_text())
    assert saved["num_hidden_layers"] == 1 and saved["hidden_size"] == tr.models.value.config.hidden_size

    cut = make_run(tmp_path, model_dir, over, name="cut")
    assert train(cut, stop_after=3, log=lambda m: None)["status"] == "interrupted"
    train(cut, resume=True, log=lambda m: None)
    w_full, w_cut = _value_weights(full / "checkpoints/step-0000004"), _value_weights(cut / "checkpoints/step-0000004")
    assert w_full.keys() == w_cut.keys() and all(torch.equal(w_full[k], w_cut[k]) for k in w_full)


def test_depth_only_critic_starts_from_the_policys_first_layers(tmp_path, model_dir):
    from vapo_engine.trainer.models import load_models
    m = load_models(model_dir, value_path=None, need_value=True, reference_path=None, device=torch.device("cpu"),
                    autocast_dtype=None, value_shape=(1.0, 0.5))
    assert m.value.config.num_hidden_layers == 1 < m.policy.config.num_hidden_layers
    assert torch.equal(m.value.model.layers[0].mlp.up_proj.weight, m.policy.model.layers[0].mlp.up_proj.weight)
    assert float(m.value.score.weight.detach().abs().sum()) == 0.0  # the head starts at zero


def test_a_critic_folder_with_another_vocabulary_is_refused(tmp_path, model_dir):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vapo_engine.trainer.models import ModelLoadError, load_models
    other = tmp_path / "other"
    Qwen2ForCausalLM(Qwen2Config(vocab_size=10, hidden_size=16, num_hidden_layers=1, num_attention_heads=1,
                                 num_key_value_heads=1, intermediate_size=32)).save_pretrained(other)
    with pytest.raises(ModelLoadError, match="knows 10 token ids, the policy's tokenizer has"):
        load_models(model_dir, value_path=other, need_value=True, reference_path=None, device=torch.device("cpu"),
                    autocast_dtype=None)
