"""Batched KV-cache generation: shapes, left/right padding, EOS masking, greedy batch == one-by-one."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from vapo_engine.builtin_model import make_model_dir
from vapo_engine.rollout.generate import Generation, generate, mask_after_eos, response_lengths
from vapo_engine.rollout.tokenizer import load_tokenizer

PROMPTS = ["1+1=", "0047+0385=", "hello, world: ", "9", "The quick brown fox jumps over"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = make_model_dir(tmp_path_factory.mktemp("gen") / "m", hidden=32, layers=2, heads=2, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():  # spread the logits so greedy decisions are far from ties
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(p.numel()))
    model.save_pretrained(out)
    return out


@pytest.fixture
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir)


@pytest.fixture
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


def _boost_eos(model, tokenizer, amount: float):
    """Add `amount` to the EOS logit so that some rows stop early and some do not."""
    eos = tokenizer.eos_token_id

    def hook(_module, _inputs, output):
        output[..., eos] += amount
        return output
    return model.lm_head.register_forward_hook(hook)


def _skewed_config() -> GenerationConfig:
    """What a checkpoint's generation_config.json might carry; must not leak into RL sampling."""
    return GenerationConfig(top_k=1, repetition_penalty=5.0, eos_token_id=2, pad_token_id=0)


def _check_invariants(gen: Generation, tokenizer, n: int, max_new: int):
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    assert gen.prompt_ids.shape[0] == gen.response_ids.shape[0] == n and len(gen.texts) == n
    assert gen.response_ids.shape == gen.response_mask.shape and gen.response_ids.shape[1] <= max_new
    assert gen.response_mask.dtype == torch.float32 and gen.finished.dtype == torch.bool
    for i in range(n):
        row, mask = gen.response_ids[i].tolist(), gen.response_mask[i].tolist()
        length = int(sum(mask))
        assert mask == [1.0] * length + [0.0] * (len(mask) - length)  # contiguous from the left
        assert all(t == pad for t in row[length:])
        eos_positions = [j for j, t in enumerate(row[:length]) if t == eos]
        if gen.finished[i]:
            assert eos_positions == [length - 1]  # mask includes the first (and only) EOS
        else:
            assert eos_positions == [] and length == max_new
        assert gen.texts[i] == tokenizer.decode(row[:length], skip_special_tokens=True)
        prompt_len = int(gen.prompt_mask[i].sum())
        assert gen.prompt_mask[i].tolist() == [0] * (gen.prompt_mask.shape[1] - prompt_len) + [1] * prompt_len
        assert (gen.prompt_ids[i, : gen.prompt_mask.shape[1] - prompt_len] == pad).all()
    assert torch.equal(response_lengths(gen.response_mask), gen.response_mask.sum(-1).long())


def test_sampling_shapes_masks_and_eos_handling(model, tokenizer):
    handle = _boost_eos(model, tokenizer, 4.0)
    torch.manual_seed(0)
    prompts = PROMPTS * 8
    gen = generate(model, tokenizer, prompts, max_new_tokens=12, temperature=1.0)
    handle.remove()
    _check_invariants(gen, tokenizer, len(prompts), 12)
    assert gen.finished.any() and not gen.finished.all()
    assert gen.response_ids.shape[1] == 12


def test_all_rows_finish_early_gives_narrow_response(model, tokenizer):
    handle = _boost_eos(model, tokenizer, 1e4)
    gen = generate(model, tokenizer, PROMPTS, max_new_tokens=10, do_sample=False)
    handle.remove()
    assert gen.finished.all() and gen.response_ids.shape == (len(PROMPTS), 1)
    assert gen.response_mask.tolist() == [[1.0]] * len(PROMPTS) and gen.texts == [""] * len(PROMPTS)


def test_sampling_is_seeded_by_the_global_rng(model, tokenizer):
    torch.manual_seed(123)
    a = generate(model, tokenizer, PROMPTS, max_new_tokens=8)
    torch.manual_seed(123)
    b = generate(model, tokenizer, PROMPTS, max_new_tokens=8)
    c = generate(model, tokenizer, PROMPTS, max_new_tokens=8)
    assert torch.equal(a.response_ids, b.response_ids) and not torch.equal(a.response_ids, c.response_ids)


def test_greedy_batched_left_padding_matches_one_by_one(model, tokenizer):
    batched = generate(model, tokenizer, PROMPTS, max_new_tokens=10, temperature=0.0)
    assert len({int(m.sum()) for m in batched.prompt_mask}) > 2  # prompts really differ in length
    for i, prompt in enumerate(PROMPTS):
        single = generate(model, tokenizer, [prompt], max_new_tokens=10, do_sample=False)
        n = int(single.response_mask.sum())
        assert batched.response_ids[i, :n].tolist() == single.response_ids[0, :n].tolist()
        assert batched.texts[i] == single.texts[0]
    chunked = generate(model, tokenizer, PROMPTS, max_new_tokens=10, do_sample=False, batch_size=2)
    assert torch.equal(chunked.response_ids, batched.response_ids)
    assert torch.equal(chunked.prompt_ids, batched.prompt_ids)
    assert torch.equal(chunked.response_mask, batched.response_mask)


def test_restores_training_mode_and_generation_config(model, tokenizer):
    model.generation_config = _skewed_config()
    saved = model.generation_config
    model.train()
    generate(model, tokenizer, PROMPTS[:2], max_new_tokens=3)
    assert model.training and model.generation_config is saved
    model.eval()
    generate(model, tokenizer, PROMPTS[:2], max_new_tokens=3)
    assert not model.training and tokenizer.padding_side == "left"


def test_checkpoint_generation_defaults_do_not_change_sampling(model, tokenizer):
    torch.manual_seed(5)
    plain = generate(model, tokenizer, PROMPTS * 4, max_new_tokens=6)
    model.generation_config = _skewed_config()
    torch.manual_seed(5)
    skewed = generate(model, tokenizer, PROMPTS * 4, max_new_tokens=6)
    assert torch.equal(plain.response_ids, skewed.response_ids)


def test_right_padded_tokenizer_is_handled(model, tokenizer):
    tokenizer.padding_side = "right"
    a = generate(model, tokenizer, PROMPTS, max_new_tokens=5, do_sample=False)
    tokenizer.padding_side = "left"
    b = generate(model, tokenizer, PROMPTS, max_new_tokens=5, do_sample=False)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.prompt_mask, b.prompt_mask)


def test_mask_after_eos_unit():
    tokens = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 9, 9, 9], [5, 6, 3, 2]])
    ids, mask, finished = mask_after_eos(tokens, [2, 3], pad_id=0)
    assert ids.tolist() == [[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0], [5, 6, 3, 0]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert finished.tolist() == [True, False, True, True]
    assert response_lengths(mask).tolist() == [2, 4, 1, 3]


def test_bad_arguments(model, tokenizer):
    with pytest.raises(ValueError):
        generate(model, tokenizer, [], max_new_tokens=4)
    with pytest.raises(ValueError):
        generate(model, tokenizer, ["x"], max_new_tokens=0)


def test_sampling_is_not_truncated_by_a_default_top_k(model, tokenizer):
    """transformers' global default top_k=50 would hide half of this 100-token vocabulary."""
    def nearly_flat(_module, _inputs, output):  # distinct values, so a top-k cut would bite
        return torch.arange(output.shape[-1], dtype=output.dtype).expand_as(output) * 0.01
    handle = model.lm_head.register_forward_hook(nearly_flat)
    torch.manual_seed(0)
    gen = generate(model, tokenizer, ["x"] * 64, max_new_tokens=8)
    handle.remove()
    assert len(set(gen.response_ids[gen.response_mask.bool()].tolist())) > 60


def test_tokenizer_without_pad_token_pads_with_eos(model, tokenizer):
    reference = generate(model, tokenizer, PROMPTS, max_new_tokens=5, do_sample=False)
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    gen = generate(model, tokenizer, PROMPTS, max_new_tokens=5, do_sample=False)
    eos = tokenizer.eos_token_id
    assert (gen.prompt_ids[gen.prompt_mask == 0] == eos).all()
    assert torch.equal(gen.response_mask, reference.response_mask)
    assert gen.texts == reference.texts
