"""What to serve or evaluate: a run directory (its newest verified checkpoint, or `step`) or any Hugging Face
model directory, resolved to the folder that holds the weights and a default model name. Torch-free: the CLI
and the tools call it before anything heavy is imported.

    resolve_source(run_dir)            -> <run>/checkpoints/step-NNNNNNN/policy, name = the run id
    resolve_source(run_dir, step=200)  -> that checkpoint, when it exists and verifies
    resolve_source(hf_dir)             -> hf_dir itself, name = the folder's name
    resolve_source("x.gguf")           -> the file (converted into the cache when it loads), name = its stem
    resolve_source("builtin:smollm2-135m-instruct") -> the packaged model, name = smollm2-135m-instruct

A run id is resolved to its directory by the caller (the run registry is the tools' business:
`tools.paths.manager_for`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vapo_engine.errors import UserError
from vapo_engine.rundir import RunDir, step_of


class SourceError(UserError):
    """The thing to serve/evaluate cannot be used; the message says what to pass instead."""


@dataclass(frozen=True)
class ModelSource:
    model_dir: Path
    """A Hugging Face model directory (config.json + safetensors weights + tokenizer files)."""
    name: str
    """The default served model name: the run id, or the directory's name."""
    run_id: str | None = None
    run_dir: Path | None = None
    step: int | None = None
    """The checkpoint's policy step (runs only)."""


def _checkpoint(rd: RunDir, run_id: str, step: int | None) -> tuple[Path, int]:
    ok, broken = rd.usable_checkpoints()
    damaged = "; ".join(f"{p.name} ({why})" for p, why in broken[:3])
    steps = [step_of(p) for p in ok]
    if step is None:
        if ok:
            return ok[0], steps[0]
        why = f" (damaged: {damaged})" if damaged else ""
        raise SourceError(f"run {run_id} has no complete checkpoint yet{why}; checkpoints are written every "
                          "eval.save_interval policy steps and at the end: wait for one (run_status / vapo-mcp runs status shows "
                          "the step), or serve the model the run started from (its model.local_path)")
    for p, s in zip(ok, steps):
        if s == step:
            return p, s
    listed = ", ".join(map(str, steps)) or "none"
    extra = f"; damaged: {damaged}" if damaged else ""
    raise SourceError(f"run {run_id} has no usable checkpoint at step {step} (usable steps: {listed}{extra}); "
                      "pass one of those to --step, or omit it for the newest")


def resolve_source(path: str | Path, *, step: int | None = None) -> ModelSource:
    """A run directory or an HF model directory → the weights folder and default name (see the module doc)."""
    from vapo_engine.realmodels.source import check_magic, is_gguf_spec, packaged_name
    if is_gguf_spec(path):  # a .gguf file or a packaged name: converted into the cache when it loads
        if step is not None:
            raise SourceError(f"--step applies to a run, and {path} is a model; drop --step")
        name = packaged_name(str(path))
        if name is None:
            check_magic(Path(path).expanduser())
        return ModelSource(Path(str(path)) if name else Path(path).expanduser(), name or Path(path).stem)
    p = Path(path).expanduser()
    rd = RunDir(p)
    if rd.is_run():
        run_id = str(rd.meta().get("run_id") or p.name)
        ckpt, s = _checkpoint(rd, run_id, step)
        return ModelSource(ckpt / "policy", run_id, run_id=run_id, run_dir=p, step=s)
    if (p / "config.json").is_file():
        if step is not None:
            raise SourceError(f"--step applies to a run, and {p} is a model directory; drop --step, or pass the "
                              "run id (or run directory)")
        return ModelSource(p, p.resolve().name or "model")
    what = "does not exist" if not p.exists() else "is neither a run directory (run.json) nor a Hugging Face " \
                                                   "model directory (config.json)"
    raise SourceError(f"{p} {what}; pass a run id (list_runs / vapo-mcp runs list), a run directory, or a folder "
                      "written by save_pretrained")
