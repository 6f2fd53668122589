"""Preflight checks of a run's inputs: the training and held-out sets (present, or a registered benchmark that
can be fetched), and the tokenizer's prompt format round trip.

Nothing is downloaded here: a registered benchmark that is missing is reported as fetchable (start_training
fetches it). The round trip loads the tokenizer (transformers, imported only here), encodes a real prompt in
the run's format, writes the task's reference answer as the assistant turn of that format, decodes it the way
rollouts decode responses (special tokens skipped) and asks the task's own answer checker to read it.
"""
from __future__ import annotations

import re
from pathlib import Path

from vapo_engine.prompts import NO_TEMPLATE_FIX, check_prompts
from vapo_engine.tasks import BENCHMARKS, BUILTIN_PREFIX, Task, TaskError, get_task
from vapo_engine.tasks.verifiers import make_judge

from .findings import Finding, error, info, warning

INSTRUCT_NAME = re.compile(r"(?i)(instruct|chat|[-_]it\b|[-_]sft\b)")
"""A model folder named like an instruct release (Qwen2.5-7B-Instruct, gemma-2-9b-it, …)."""


def data_findings(cfg) -> tuple[list[Finding], Task | None]:
    """Each dataset of the run present, fetchable or missing; and the training task when it can be read now."""
    out, train = [], None
    data_dir = Path(cfg.data.data_dir)
    for key, spec in (("data.train", cfg.data.train), ("eval.benchmark", cfg.eval.benchmark)):
        finding, task = _dataset(key, spec.strip(), data_dir)
        out.append(finding)
        train = task if key == "data.train" else train
    return out, train


def _dataset(key: str, spec: str, data_dir: Path) -> tuple[Finding, Task | None]:
    path = Path(spec).expanduser() if spec.endswith(".jsonl") else data_dir / f"{spec}.jsonl"
    if spec.endswith(".jsonl") and not path.is_absolute() and not path.exists():
        path = data_dir / path
    if spec.startswith(BUILTIN_PREFIX) or path.is_file():
        try:
            task = get_task(spec, data_dir)
        except TaskError as e:
            return error("data", f"{key}: {e}", "fix the file or the name (the message says how)", spec=spec), None
        size = len(task) if hasattr(task, "__len__") else None
        return info("data", f"{key}: {spec} is ready" + (f" ({size} problems)" if size else ""), spec=spec), task
    bench = BENCHMARKS.get(spec)
    if bench is not None:
        from vapo_engine.tasks.hub import hub_settings
        offline = hub_settings()[1]
        what = f"{key}: {spec} is not downloaded yet; it is fetched from the Hugging Face Hub ({bench.repo_id})"
        if offline:
            return warning("data", what + " but the hub is set offline (HF_HUB_OFFLINE): only a cached copy can "
                           "be used", f"run {bench.fetch_command(data_dir)} where the hub is reachable",
                           spec=spec, path=str(path)), None
        return info("data", what + " when the run is started", spec=spec, path=str(path)), None
    return error("data", f"{key}: {spec} is missing ({path} does not exist)", f"put the file at {path} (one "
                 "{\"problem\", \"answer\"} object per line), use a built-in task (builtin:addition), or a "
                 f"registered benchmark ({', '.join(BENCHMARKS)})", spec=spec), None


def model_dir(cfg) -> Path | None:
    """The folder whose config.json and tokenizer a run loads: model.local_path, else the shipped built-in; for a
    GGUF input (a .gguf file, a packaged model) its converted folder, None before the first conversion."""
    from vapo_engine.realmodels.source import cached_folder, is_gguf_spec
    gguf = cfg.model.local_path or cfg.model.builtin
    if is_gguf_spec(gguf):
        return cached_folder(gguf)
    if cfg.model.local_path:
        return Path(cfg.model.local_path).expanduser()
    from vapo_engine.builtin_model.recipes import RECIPES
    from vapo_engine.builtin_model.shipped import shipped_folder
    name = cfg.model.builtin or (cfg.data.train if cfg.data.train in RECIPES else "builtin:addition")
    return shipped_folder(RECIPES[name]) if name in RECIPES else None


def template_findings(cfg, task: Task | None) -> list[Finding]:
    """The prompt format the model's tokenizer can take, and (for a model directory) the round trip."""
    check = check_prompts(cfg.model)
    folder = model_dir(cfg) if cfg.model.local_path or cfg.model.builtin else None
    ev = {"prompt_format": cfg.model.prompt_format, "model": str(folder) if folder else "built-in"}
    if check.problem:
        return [error("template", f"model.prompt_format: {check.problem}", NO_TEMPLATE_FIX, **ev)]
    out = []
    if folder and check.mode == "plain" and cfg.model.prompt_format == "auto" and INSTRUCT_NAME.search(folder.name):
        out.append(warning("template", f"{folder.name} is named like an instruct model but its tokenizer has no "
                           "chat template: prompts go in as plain text, not in the format it was tuned on",
                           "copy the instruct release's tokenizer files (with its chat template) into the folder, "
                           "or set model.prompt_format = \"plain\" if plain prompts are meant", **ev))
    if folder is None or check.mode is None or task is None:
        return [*out, info("template", check.line, **ev)]
    return [*out, *_round_trip(cfg, folder, task, ev)]


def _reference(task: Task, problem) -> str:
    """A correct response in the task's own format: its reference solution, else a boxed final answer."""
    try:
        return task.reference_solution(problem)
    except (AttributeError, TaskError):
        return f"The final answer is \\boxed{{{problem.answer}}}."


def _round_trip(cfg, folder: Path, task: Task, ev: dict) -> list[Finding]:
    from vapo_engine.prompts import PromptFormatError, encode_prompts, resolve_prompt_format
    from vapo_engine.rollout.tokenizer import load_tokenizer
    try:
        tok = load_tokenizer(folder)
        fmt = resolve_prompt_format(cfg.model, tok, task, where=str(folder))
    except PromptFormatError as e:
        return [error("template", str(e).split(". Fix: ")[0], str(e).partition(". Fix: ")[2] or NO_TEMPLATE_FIX,
                      **ev)]
    except (OSError, ValueError) as e:
        return [error("template", f"the tokenizer of {folder} cannot be loaded ({str(e)[:200]})",
                      "point model.local_path at a folder made by save_pretrained (tokenizer files included)", **ev)]
    problem = task.heldout(1)[0]
    ids = encode_prompts(tok, [problem.prompt], fmt)[0]
    reference = _reference(task, problem)
    response = reference
    if fmt.mode == "chat":
        head = tok.apply_chat_template(fmt.messages(problem.prompt), add_generation_prompt=True, tokenize=False)
        whole = tok.apply_chat_template([*fmt.messages(problem.prompt), {"role": "assistant", "content": reference}],
                                        tokenize=False)
        response = whole[len(head):] if whole.startswith(head) else reference
    decoded = tok.decode(tok(response, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    ev = {**ev, "format": fmt.mode, "prompt_tokens": len(ids), "task": task.name}
    if not ids:
        return [error("template", "the prompt encodes to no tokens", "check the tokenizer files of model.local_path",
                      **ev)]
    if not make_judge(cfg.data.verifier, task)([decoded], [problem])[0].correct:
        return [error("template", f"the task's answer checker does not read a correct answer written in the "
                      f"{fmt.mode} format after encoding and decoding (wrote {reference[-80:]!r}, read back "
                      f"{decoded[-80:]!r})", "use a tokenizer that round-trips the answer text (model.local_path), "
                      "or set model.prompt_format = \"plain\" if the chat template rewrites the answer", **ev)]
    return [info("template", f"{check_prompts(cfg.model).line}; round trip ok: the prompt encodes "
                 f"({len(ids)} tokens) and the reference answer reads back", **ev)]
