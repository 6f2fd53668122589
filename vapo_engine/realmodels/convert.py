"""A GGUF model as a Hugging Face folder: dequantized once into the cache, reused afterwards.

    model_folder("builtin:smollm2-135m-instruct")  -> <cache>/gguf/SmolLM2-135M-Instruct.Q4_1-<sha256[:16]>/
    model_folder("/models/x.Q8_0.gguf")            -> <cache>/gguf/x.Q8_0-<sha256[:16]>/
    model_folder("/models/hf-folder")              -> /models/hf-folder (anything else is returned as given)

The folder holds float32 safetensors, the tokenizer (tokenizer.json, with the GGUF's chat template as
chat_template.jinja), config.json, a generation config whose EOS is the GGUF's, and `provenance.json` (the
GGUF's path, size and sha256, its architecture and quantization, the package it came from, the library
versions): it is written last, and marks the folder complete. The cache key is the GGUF's sha256, so a changed
file converts again. transformers dequantizes (`from_pretrained(folder, gguf_file=NAME)`); its model refuses
`save_pretrained` ("quantized with gguf"), so the weights move into a plain model built from the same config.

Nothing half-written is ever left: the conversion writes into `.tmp-<pid>-<random>` beside the final folder
and `os.replace`s it into place; any failure removes it, and a temp folder left by a killed process (its pid
gone) is swept by the next conversion. Before writing, the free space is checked against the float32 size.
Every problem is one `GgufError` line (source.py). Worker-side: imports torch and transformers.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from .source import (
    PACKAGED,
    PROVENANCE,
    GgufError,
    GgufInfo,
    check_magic,
    converted_folder,
    gguf_path,
    is_gguf_spec,
    packaged_name,
    read_header,
    sha256_of,
)

_SLACK = 64 * 2**20
"""Free space wanted beyond the float32 weights: tokenizer files (~3.5 MB for SmolLM2), config, headroom."""


def model_folder(spec: str | Path, *, cache_dir: str | Path | None = None, log=print) -> Path:
    """The Hugging Face folder to load for `spec`: a packaged name or a .gguf file converted (once) into the
    cache, anything else unchanged."""
    if not is_gguf_spec(spec):
        return Path(spec).expanduser()
    return convert(gguf_path(spec), cache_dir=cache_dir, log=log, package=packaged_name(str(spec)))


def convert(path: Path, *, cache_dir: str | Path | None = None, log=print, package: str | None = None) -> Path:
    """The converted folder of the GGUF file `path` (see the module docstring). A cached folder is found from
    the file's sha256 alone (0.1 s for SmolLM2); only a conversion reads the header (seconds: the tokenizer's
    49k-entry arrays are parsed in Python)."""
    check_magic(path)
    sha = sha256_of(path)
    final = converted_folder(path, sha, cache_dir)
    root = final.parent
    if (final / PROVENANCE).is_file():
        return final
    info = read_header(path)
    _check_supported(info)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GgufError(f"cannot create the model cache {root} ({e.strerror}); set VAPO_MCP_CACHE to a writable "
                        "folder") from None
    _sweep_dead_temps(root)
    _check_space(root, info)
    tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    log(f"converting {path.name} ({info.architecture}, {'/'.join(info.tensor_types)}) to float32 in {final} "
        "(once)")
    t0 = time.perf_counter()
    try:
        _write_folder(path, tmp, info, sha, package)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / PROVENANCE).is_file():  # else another process finished first: use its folder
                raise
    except OSError as e:
        raise GgufError(f"converting {path} into {final} failed ({e.strerror or e}); free disk space or set "
                        "VAPO_MCP_CACHE to a folder with room, then retry") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"converted {path.name} in {time.perf_counter() - t0:.0f} s")
    return final


def _check_supported(info: GgufInfo) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    archs = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if info.architecture not in archs:
        raise GgufError(f"{info.path}: GGUF architecture {info.architecture!r} cannot be read by this transformers "
                        f"(it reads {', '.join(archs)}); convert the model to a Hugging Face folder another way "
                        "and point model.local_path at it")
    readable = {"F32", "F16"} | {t.name for t in _type_traits if isinstance(t, GGMLQuantizationType)}
    bad = [t for t in info.tensor_types if t not in readable]
    if bad:
        raise GgufError(f"{info.path}: quantization {', '.join(bad)} cannot be dequantized by gguf (it reads "
                        f"{', '.join(sorted(readable))}); use a GGUF file quantized as Q8_0, Q4_K_M, F16 or similar")


def _check_space(root: Path, info: GgufInfo) -> None:
    need = info.elements * 4 + _SLACK
    free = shutil.disk_usage(root).free
    if free < need:
        raise GgufError(f"not enough disk for the float32 copy of {info.path.name} in {root}: it needs about "
                        f"{need / 2**20:.0f} MiB, {free / 2**20:.0f} MiB are free; free some space or set "
                        "VAPO_MCP_CACHE to a folder with room")


def _sweep_dead_temps(root: Path) -> None:
    """Remove temp folders whose converting process is gone (killed mid-conversion)."""
    for tmp in root.glob(".tmp-*"):
        try:
            pid = int(tmp.name.split("-")[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue


def _write_folder(path: Path, out: Path, info: GgufInfo, sha: str, package: str | None) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out.mkdir()
    kw = {"gguf_file": path.name, "trust_remote_code": False}
    try:
        with _no_progress_bars():  # transformers' own tqdm bar of the dequantization
            tokenizer = AutoTokenizer.from_pretrained(path.parent, **kw)
            quantized = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:
        raise GgufError(f"{path}: transformers cannot load this GGUF as a causal LM ({type(e).__name__}: "
                        f"{str(e)[:160]}); use a Hugging Face folder of the model instead") from None
    config = quantized.config
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), assign=True, strict=True)
    if config.tie_word_embeddings:
        plain.tie_weights()
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    defaults = plain.generation_config  # built from the config by transformers; only its token ids are set here
    defaults.bos_token_id, defaults.eos_token_id = tokenizer.bos_token_id, eos
    defaults.pad_token_id = tokenizer.pad_token_id or eos
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    import gguf
    record = {"gguf": str(path), "sha256": sha, "size": path.stat().st_size, "architecture": info.architecture,
              "name": info.name, "tensor_types": list(info.tensor_types), "parameters": info.elements,
              "dtype": "float32", "package": PACKAGED[package].requirement if package else None,
              "license": PACKAGED[package].license if package else None,
              "versions": {"transformers": transformers.__version__, "gguf": _version(gguf), "torch": torch.__version__},
              "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / PROVENANCE).write_text(json.dumps(record, indent=1) + "\n")


@contextlib.contextmanager
def _no_progress_bars():
    """transformers draws a tqdm bar over the dequantization on stderr (tqdm reads TQDM_DISABLE only at import)."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def _version(module) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(module.__name__)
    except PackageNotFoundError:
        return "unknown"
