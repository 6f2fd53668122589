"""Prompts the model expects: a task's prompt as plain text, or wrapped in the model's chat template.

An instruct model is trained and evaluated on its chat template: an optional system message (the task's format
instruction unless `model.system_prompt` says otherwise), the prompt as the user message, and the template's
assistant header (`add_generation_prompt=True`). A base model, and the built-in tiny model (no template), gets
the prompt text as it is. `model.prompt_format` makes the choice explicit; `auto` = chat when the tokenizer has
a chat template, plain otherwise.

One encoding for every consumer, so the same prompt is the same ids everywhere: rollouts and the run's
evaluation (`rollout.generate`), replayed provider answers (`trainer.provider_samples`), `vapo-mcp eval`'s local
backend (`serving.local_eval`), and `vapo-mcp config check` / `start_training` (which read the model
directory's files through `check_prompts`). The chat messages are the ones the channel evaluation and provider
samples send to an API model (system only when non-empty, then the user prompt), and `serving.model` applies
the same template to a client's messages. Torch-free and transformers-free: the tokenizer is passed in; the
config is taken by shape (`ModelPrompts`: config.toml's [model] has these fields), so this leaf module, which the
worker-side rollout code imports, depends on no config model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from vapo_engine.errors import UserError

Mode = Literal["plain", "chat"]


class ModelPrompts(Protocol):
    """What the prompts need of config.toml's [model] (vapo_engine.config.train_model.ModelConfig)."""

    prompt_format: str
    system_prompt: str | None
    local_path: str | None
    builtin: str | None

BUILTIN = "the built-in model"


class PromptFormatError(UserError):
    """A prompt format that the model cannot use (chat asked of a tokenizer without a template), with the fix."""


@dataclass(frozen=True)
class PromptFormat:
    """How prompts are encoded: `plain` text, or `chat` with an optional system message."""

    mode: Mode = "plain"
    system: str | None = None
    """The system message of chat prompts (None or "" = none)."""

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat messages of `prompt`: [system?, user]."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": prompt}]


PLAIN = PromptFormat()


def has_chat_template(model_dir: str | Path) -> bool:
    """True when the tokenizer saved in `model_dir` has a chat template, read from its files (no transformers):
    a non-empty `chat_template.jinja` (transformers 5 writes it) or a `chat_template` in tokenizer_config.json.
    A processor's chat_template.json is not counted: AutoTokenizer does not load it."""
    p = Path(model_dir).expanduser()
    jinja = p / "chat_template.jinja"
    if jinja.is_file() and jinja.read_text(encoding="utf-8", errors="replace").strip():
        return True
    try:
        cfg = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("chat_template"))


NO_TEMPLATE_FIX = ("set model.prompt_format = \"plain\" (or \"auto\") for a base model, or point model.local_path at "
                   "an instruct model directory that ships its chat template")


def no_template_problem(where: str) -> str:
    """Why `model.prompt_format = "chat"` cannot work for the tokenizer of `where` (see NO_TEMPLATE_FIX)."""
    files = "" if where == BUILTIN else " (no chat_template.jinja, no chat_template in tokenizer_config.json)"
    return f"\"chat\" needs a chat template and {where} has none{files}"


def no_template_error(where: str) -> PromptFormatError:
    return PromptFormatError(f"model.prompt_format: {no_template_problem(where)}. Fix: {NO_TEMPLATE_FIX}")


def resolve_prompt_format(model: ModelPrompts, tokenizer_or_dir, task=None, *, where: str = "") -> PromptFormat:
    """The format for `task`'s prompts: `model.prompt_format` against the tokenizer (an object with a
    `chat_template` attribute, or a model directory); the system message is `model.system_prompt`, else the
    task's `system_prompt`. `PromptFormatError` (naming the key and the fix) for chat without a template, or a
    template that rejects the messages (some refuse a system message); a directory is not rendered."""
    is_dir = isinstance(tokenizer_or_dir, (str, Path))
    where = where or (str(tokenizer_or_dir) if is_dir else "the model's tokenizer")
    has = has_chat_template(tokenizer_or_dir) if is_dir else bool(getattr(tokenizer_or_dir, "chat_template", None))
    if model.prompt_format == "chat" and not has:
        raise no_template_error(where)
    if model.prompt_format == "plain" or not has:
        return PLAIN
    system = model.system_prompt if model.system_prompt is not None else getattr(task, "system_prompt", None)
    fmt = PromptFormat("chat", system or None)
    if not is_dir:
        _try_render(tokenizer_or_dir, fmt, where)
    return fmt


def _try_render(tokenizer, fmt: PromptFormat, where: str) -> None:
    """Render one probe prompt now, so a template that rejects the messages stops the run at setup."""
    try:
        tokenizer.apply_chat_template(fmt.messages("1+1="), add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001 - jinja raises many kinds (TemplateError, raise_exception, ...)
        key, fix = "model.prompt_format", "set model.prompt_format = \"plain\""
        if fmt.system:
            key, fix = "model.system_prompt", "set model.system_prompt = \"\" (no system message), or " + fix
        raise PromptFormatError(f"{key}: the chat template of {where} rejected the prompt messages "
                                f"({str(e)[:200]}). Fix: {fix}") from None


def encode_prompts(tokenizer, prompts: list[str], fmt: PromptFormat | None = None) -> list[list[int]]:
    """Token ids of each prompt. plain (or None): `tokenizer(prompts)`, special tokens as the tokenizer adds
    them (the encoding runs always had). chat: the template rendered as text with the assistant header, then
    encoded without adding special tokens, so a BOS the template writes is the only one — the ids
    `apply_chat_template(..., tokenize=True)` gives."""
    if fmt is None or fmt.mode == "plain":
        return [list(r) for r in tokenizer(prompts)["input_ids"]]
    texts = [tokenizer.apply_chat_template(fmt.messages(p), add_generation_prompt=True, tokenize=False)
             for p in prompts]
    return [list(r) for r in tokenizer(texts, add_special_tokens=False)["input_ids"]]


@dataclass(frozen=True)
class PromptCheck:
    """What `vapo-mcp config check` shows about prompts, and the error a run would stop with."""

    mode: Mode | None
    """plain, chat, or None when no format is usable or the model directory cannot be read."""
    line: str
    problem: str | None = None
    """Why a run would stop (the fix is NO_TEMPLATE_FIX); None when it would not."""

    @property
    def error(self) -> str | None:
        """The whole error message a run would stop with (key, problem, fix), or None."""
        return f"model.prompt_format: {self.problem}. Fix: {NO_TEMPLATE_FIX}" if self.problem else None

    def as_dict(self) -> dict:
        return {"format": self.mode, "line": self.line, "error": self.error}


def system_origin(model: ModelPrompts) -> str:
    """Where the system message of chat prompts comes from, in words."""
    if model.system_prompt is None:
        return "the task's format instruction"
    return "none" if model.system_prompt == "" else f"model.system_prompt, {len(model.system_prompt)} characters"


def describe(fmt: PromptFormat, model: ModelPrompts, where: str) -> str:
    """One line for logs: `chat template of <where> (system: ...)` or `plain (<why>)`."""
    if fmt.mode == "chat":
        return f"chat template of {where} (system: {system_origin(model)})"
    if model.prompt_format == "plain":
        return "plain (model.prompt_format = \"plain\")"
    return f"plain ({where} has no chat template)"


def check_prompts(model: ModelPrompts, base_dir: str | Path = ".") -> PromptCheck:
    """The prompt format a run of this `[model]` section would use, from the model directory's files
    (`local_path` relative to `base_dir`, the config file's folder, as runs resolve it)."""
    from vapo_engine.realmodels.source import cached_folder, is_gguf_spec
    gguf = model.local_path if is_gguf_spec(model.local_path) else model.builtin if is_gguf_spec(model.builtin) \
        else None
    if gguf:  # read the converted folder; before the first conversion the run decides
        folder = cached_folder(gguf if model.local_path is None or Path(gguf).is_absolute()
                               else Path(base_dir) / gguf)
        if folder is None:
            return PromptCheck(None, f"prompts: decided when {gguf} is first converted (its chat template, if any)")
        return _dir_check(model, folder, gguf)
    if not model.local_path:
        if model.prompt_format == "chat":
            return PromptCheck(None, f"prompts: none usable ({BUILTIN} has no chat template)",
                               no_template_problem(BUILTIN))
        return PromptCheck("plain", f"prompts: {describe(PLAIN, model, BUILTIN)}")
    path = Path(model.local_path).expanduser()
    path = path if path.is_absolute() else Path(base_dir) / path
    if not (path / "config.json").is_file():
        return PromptCheck(None, f"prompts: unknown (model.local_path {path} is not a model directory)")
    return _dir_check(model, path, str(path))


def _dir_check(model: ModelPrompts, path: Path, where: str) -> PromptCheck:
    try:
        fmt = resolve_prompt_format(model, path, where=where)
    except PromptFormatError:
        return PromptCheck(None, f"prompts: none usable ({where} has no chat template)", no_template_problem(where))
    return PromptCheck(fmt.mode, f"prompts: {describe(fmt, model, where)}")
