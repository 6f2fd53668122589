"""Real pretrained models offline (docs/training.md#a-real-model-offline-gguf-files-and-smollm2-135m-instruct): GGUF files as input, and the ones pip packages ship by name.

`source` (torch-free): the packaged names (`builtin:smollm2-135m-instruct`), locating their file without
importing the package, GGUF header checks with one-line errors. `convert` (torch): the GGUF dequantized once
into a cached Hugging Face folder (`model_folder`), which every loader then uses like any model folder.
"""
from __future__ import annotations

from .source import (
    PACKAGED,
    GgufError,
    is_gguf_spec,
    packaged_file,
    packaged_name,
    packaged_specs,
    read_header,
)

__all__ = ["PACKAGED", "GgufError", "is_gguf_spec", "packaged_file", "packaged_name", "packaged_specs",
           "read_header"]
