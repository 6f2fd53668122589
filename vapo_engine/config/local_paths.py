"""The config's local paths checked on disk (`vapo-mcp config check`): model folders and data files.

Only fields that name something on this machine are checked, resolved the way a run resolves them
(`path_fields.freeze_paths`: relative to config.toml's folder): model.local_path, model.value_path and
critic.model_path must be Hugging Face model folders (config.json inside); data.train and eval.benchmark must
be a `builtin:` task, a registered benchmark (fetched into data.data_dir on first use), or a JSONL file that
exists; data.data_dir, when it exists, must be a folder. Nothing is downloaded or loaded. Torch-free.
"""
from __future__ import annotations

import re
from pathlib import Path

from .errors import ConfigIssue
from .path_fields import freeze_paths

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_MODEL_FIELDS = ("model.local_path", "model.value_path", "critic.model_path")


def local_path_issues(config, config_file: str | Path) -> list[ConfigIssue]:
    """One error per local path of `config` (already validated) that is missing or of the wrong kind."""
    base = Path(config_file).resolve().parent
    frozen = freeze_paths(config, base)
    out = []
    for key in _MODEL_FIELDS:
        section, name = key.split(".")
        given = getattr(getattr(config, section), name)
        if given:
            out += _model_dir(str(config_file), key, given, _absolute(given, base))
    data_dir = Path(frozen.data.data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        out.append(ConfigIssue(str(config_file), "data.data_dir", f"{data_dir} is a file, not a folder",
                               "point data.data_dir at the folder that holds <name>.jsonl (e.g. \"./data\")"))
    for key, given, spec in (("data.train", config.data.train, frozen.data.train),
                             ("eval.benchmark", config.eval.benchmark, frozen.eval.benchmark)):
        out += _dataset(str(config_file), key, given.strip(), spec.strip(), data_dir)
    return out


def _absolute(given: str, base: Path) -> Path:
    p = Path(given).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _model_dir(file: str, key: str, given: str, path: Path) -> list[ConfigIssue]:
    if path.is_dir() and (path / "config.json").is_file():
        return []
    if given.lower().endswith(".gguf"):  # converted into the cache on first use (vapo_engine/realmodels)
        from vapo_engine.realmodels.source import GgufError, check_magic
        try:
            check_magic(path)
        except GgufError as e:
            return [ConfigIssue(file, key, str(e).split("; ")[0], "; ".join(str(e).split("; ")[1:]))]
        return []
    unset = ("unset it to use the built-in tiny model" if key == "model.local_path"
             else "unset it to start the value model from the policy")
    if not path.exists():
        problem = f"{path} does not exist"
        fix = f"point {key} at a Hugging Face model folder (one made by save_pretrained), or {unset}"
        if _HUB_ID.match(given) and not given.startswith("."):
            problem += f" ({given!r} looks like a Hugging Face Hub id, but {key} takes a local folder)"
            fix = (f"download it first, e.g. `hf download {given} --local-dir models/{given.split('/')[-1]}`, "
                   f"and set {key} to that folder; or {unset}")
        return [ConfigIssue(file, key, problem, fix)]
    what = "is a file, not a folder" if not path.is_dir() else "is not a Hugging Face model folder (no config.json)"
    return [ConfigIssue(file, key, f"{path} {what}",
                        f"point {key} at a folder made by save_pretrained (config.json and weights inside), or "
                        f"{unset}")]


def _dataset(file: str, key: str, given: str, spec: str, data_dir: Path) -> list[ConfigIssue]:
    from vapo_engine.tasks import BENCHMARKS, BUILTIN_PREFIX, benchmark_names
    if spec.startswith(BUILTIN_PREFIX):
        return []  # the task name itself is checked when the config loads
    if spec.endswith(".jsonl"):
        path = Path(spec).expanduser()
        path = path if path.is_absolute() or path.exists() else data_dir / path
    else:
        path = data_dir / f"{spec}.jsonl"
        if spec in BENCHMARKS:
            return []  # fetched into data.data_dir when a run starts (or `vapo-mcp data fetch` now)
    if path.is_file():
        return []
    problem = f"{given}: {path} " + ("is not a file" if path.exists() else "does not exist")
    if not data_dir.exists() and not spec.endswith(".jsonl"):
        problem += f" (data.data_dir {data_dir} does not exist either)"
    return [ConfigIssue(file, key, problem,
                        f"put the file at {path} (one {{\"problem\", \"answer\"}} object per line), set {key} to a "
                        f"built-in task (builtin:addition), or to a registered benchmark ({', '.join(benchmark_names())})")]
