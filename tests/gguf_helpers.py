"""Small GGUF files written with the `gguf` package for the bad-input tests of vapo_engine/realmodels: a few KB
each, so every way a GGUF input can be unusable is tested on a real file in milliseconds."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def write_gguf(path: Path, *, arch: str = "llama", tensor_type: str = "F32", tokenizer: bool = False) -> Path:
    """A GGUF file of architecture `arch` holding one 8 × 32 tensor of GGML type `tensor_type` (F32 or I32) and,
    with `tokenizer`, nothing more: no model transformers could build (its config keys are missing)."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_block_count(1)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
    data = np.arange(256, dtype=np.float32 if tensor_type == "F32" else np.int32).reshape(8, 32)
    w.add_tensor("token_embd.weight", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def truncated_copy(src: Path, dst: Path, keep: float = 0.5) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[:int(len(data) * keep)])
    return dst
