"""Load a model directory's tokenizer exactly as it was saved.

transformers 5's `AutoTokenizer` picks the tokenizer class from the model type for some architectures
(qwen2 among them: `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`), ignoring a directory whose tokenizer_config.json
declares the generic fast backend. For the built-in character tokenizer (a Qwen2-architecture model) that
rebuilds it as a byte-level BPE tokenizer that silently drops spaces and newlines. A directory that declares
the generic backend (`TokenizersBackend` / `PreTrainedTokenizerFast`) and ships a tokenizer.json is therefore
loaded with `PreTrainedTokenizerFast`, i.e. tokenizer.json as written; every other directory goes through
`AutoTokenizer` as usual.

Every load passes `trust_remote_code=False` explicitly (docs/design.md §7): left unset, transformers asks `[y/N]` on
stdin for a folder whose config names an unknown `model_type` and an `auto_map`, and a "y" runs the folder's
code. `refuse_remote_code` turns such a folder into a clear error before anything is loaded; the model loaders
(trainer/models.py, serving/model.py) call it through `load_tokenizer` and pass `NO_REMOTE_CODE` themselves.
"""
from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

GENERIC = {"TokenizersBackend", "PreTrainedTokenizerFast"}
NO_REMOTE_CODE = {"trust_remote_code": False}


class RemoteCodeRefused(ValueError):
    """A model folder that only its own Python code could load (never run: docs/design.md §7)."""


def refuse_remote_code(path: str | Path) -> None:
    """`RemoteCodeRefused` when `path`/config.json names a `model_type` this transformers does not implement
    (only the folder's own code, `auto_map`, could load it). A folder without a readable config.json passes:
    `from_pretrained` then says what is missing."""
    from transformers import __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    config = Path(path) / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return
    kind = data.get("model_type") if isinstance(data, dict) else None
    if isinstance(kind, str) and kind in CONFIG_MAPPING_NAMES:
        return
    code = " and ships its own code (auto_map), which is never run" if isinstance(data, dict) and \
        data.get("auto_map") else ""
    raise RemoteCodeRefused(f"{config}: model_type {str(kind)[:60]!r} is not an architecture transformers "
                            f"{__version__} implements{code}; use a model whose architecture transformers "
                            "implements (qwen2, llama, …), or a transformers version that adds it")


def load_tokenizer(path: str | Path):
    p = Path(path)
    refuse_remote_code(p)
    try:
        declared = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError):
        declared = None
    if declared in GENERIC and (p / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(p, **NO_REMOTE_CODE)
    return AutoTokenizer.from_pretrained(p, **NO_REMOTE_CODE)
