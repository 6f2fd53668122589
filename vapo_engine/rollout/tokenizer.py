"""Load a model directory's tokenizer exactly as it was saved.

transformers 5's `AutoTokenizer` picks the tokenizer class from the model type for some architectures
(qwen2 among them: `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`), ignoring a directory whose tokenizer_config.json
declares the generic fast backend. For the built-in character tokenizer (a Qwen2-architecture model) that
rebuilds it as a byte-level BPE tokenizer that silently drops spaces and newlines. A directory that declares
the generic backend (`TokenizersBackend` / `PreTrainedTokenizerFast`) and ships a tokenizer.json is therefore
loaded with `PreTrainedTokenizerFast`, i.e. tokenizer.json as written; every other directory goes through
`AutoTokenizer` as usual.
"""
from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

GENERIC = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_tokenizer(path: str | Path):
    p = Path(path)
    try:
        declared = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError):
        declared = None
    if declared in GENERIC and (p / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(p)
    return AutoTokenizer.from_pretrained(p)
