"""The built-in tiny model itself: a char-level tokenizer and a ~1M-parameter Qwen2 causal LM, as an HF directory.

- `build_tokenizer()`: vocabulary = printable ASCII + newline, special tokens <pad>/<bos>/<eos>/<unk>, BOS
  prepended, left padding, exact round-trip decoding; built locally with `tokenizers` (no hub access).
- `make_model_dir(out_dir, ...)`: an untrained model + tokenizer saved with `save_pretrained`, so
  `AutoModelForCausalLM.from_pretrained(dir)` loads it like any other checkpoint; load the tokenizer with
  `vapo_engine.rollout.tokenizer.load_tokenizer(dir)` (transformers 5's AutoTokenizer rebuilds a qwen2
  directory's tokenizer as byte-level BPE and drops spaces and newlines).

It deliberately has no chat template (prompts are plain text).
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from vapo_engine.rollout.backends.hf import generation_defaults

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Ids 0..3 in this order."""
CHARSET = "".join(chr(i) for i in range(32, 127)) + "\n"
"""Printable ASCII plus newline; anything else encodes to <unk> (dropped when decoding)."""
MAX_POSITIONS = 512


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (one token per character, BOS prepended, left padding)."""
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *CHARSET])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # concatenate characters: no spaces inserted
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=MAX_POSITIONS,
    )


def make_config(tokenizer, *, hidden: int = 128, layers: int = 4, heads: int = 4) -> Qwen2Config:
    """A small Qwen2 config: intermediate 4x hidden, tied embeddings, float32."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, dtype="float32",
    )


def make_model(tokenizer, *, hidden: int = 128, layers: int = 4, heads: int = 4,
               seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised tiny causal LM (deterministic given `seed`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(make_config(tokenizer, hidden=hidden, layers=layers, heads=heads))
    model.generation_config = generation_defaults(
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return model.float()


def make_model_dir(out_dir: str | Path, *, hidden: int = 128, layers: int = 4, heads: int = 4,
                   seed: int = 0) -> Path:
    """Save an untrained tiny model and its tokenizer to `out_dir` (a normal HF directory); returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    make_model(tokenizer, hidden=hidden, layers=layers, heads=heads, seed=seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
