"""How a policy writes a tool call and reads its result, in tokens (rollout.tools.format; docs/training.md#tools).

- `TagFormat` ("tags", plain prompts and the built-in model): the policy writes `<call>NAME ARGS</call>`; ARGS is
  a JSON object of arguments, or plain text given to the tool's one string parameter (`<call>calculate
  37*24</call>`). The environment inserts `<result>TEXT</result>` and the policy writes on. Prompts are unchanged
  (a plain model learns the format from its warm start; the tools are listed in the run's log).
- `ChatFormat` ("chat", instruct models): the tools' schemas go to the chat template (`apply_chat_template(...,
  tools=...)`), the policy writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the format of
  Qwen2.5 / Hermes-style templates), and the environment inserts what the template renders between that
  assistant message and the next assistant header for a `{"role": "tool"}` message holding the result (the end of
  the turn, the tool message, the new assistant header).

A turn ends at the first end tag (`end`); the tokens the policy drew after it are dropped (a stop string, applied
after sampling). The result's text is tokenized with special tokens split, so a tool cannot insert a control
token (an end of turn, an EOS) by writing its text. This file does not call tools or sample.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from vapo_engine.errors import UserError
from vapo_engine.prompts import PromptFormat, encode_prompts

CALL_SENTINEL, RESULT_SENTINEL = "VAPOCALLSENTINEL", "VAPORESULTSENTINEL"


@dataclass(frozen=True)
class Call:
    """A parsed call: the tool and its arguments, or `error` (the observation the policy gets instead)."""

    name: str = ""
    arguments: dict | None = None
    error: str | None = None


def cut_after(tokenizer, ids: list[int], end: str) -> int | None:
    """The number of leading tokens of `ids` whose text first contains `end` (the turn ends there), or None."""
    if end not in tokenizer.decode(ids, skip_special_tokens=False):
        return None
    lo, hi = 1, len(ids)  # the smallest prefix that contains `end` (decoding a longer prefix never loses it)
    while lo < hi:
        mid = (lo + hi) // 2
        if end in tokenizer.decode(ids[:mid], skip_special_tokens=False):
            hi = mid
        else:
            lo = mid + 1
    return lo


def result_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a tool's text, special-token strings split into plain text (no control token from a tool)."""
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def _plain_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _one_string_parameter(spec: dict | None) -> str | None:
    """The name of a tool's only (required) string parameter, if it has exactly one."""
    params = ((spec or {}).get("parameters") or {})
    props = params.get("properties") or {}
    names = params.get("required") or list(props)
    if len(names) == 1 and (props.get(names[0]) or {}).get("type", "string") == "string":
        return names[0]
    return None


class TagFormat:
    """`<call>NAME ARGS</call>` → `<result>TEXT</result>` (see the module docstring)."""

    name, start, end = "tags", "<call>", "</call>"

    def __init__(self, specs: list[dict]):
        self.specs = {s["function"]["name"]: s["function"] for s in specs}

    def prompt_ids(self, tokenizer, prompts: list[str], prompt_format: PromptFormat | None) -> list[list[int]]:
        return encode_prompts(tokenizer, prompts, prompt_format)

    def parse(self, turn_text: str) -> Call:
        body = turn_text[turn_text.rfind(self.start) + len(self.start):turn_text.rfind(self.end)] \
            if self.start in turn_text else ""
        name, _, args = body.strip().partition(" ")
        if not name:
            return Call(error=f"error: write a call as {self.start}NAME ARGUMENTS{self.end}")
        args = args.strip()
        if args.startswith("{"):
            return _json_arguments(name, args)
        param = _one_string_parameter(self.specs.get(name))
        if param is None:
            return Call(name, error=f"error: give {name}'s arguments as a JSON object")
        return Call(name, {param: args})

    def observation(self, tokenizer, text: str) -> list[int]:
        return _plain_ids(tokenizer, "<result>") + result_ids(tokenizer, text) + _plain_ids(tokenizer, "</result>")


class ChatFormat:
    """The chat template's tool format (see the module docstring); built once per run from the tokenizer."""

    name, start, end = "chat", "<tool_call>", "</tool_call>"

    def __init__(self, tokenizer, prompt_format: PromptFormat, specs: list[dict], where: str = "the model"):
        self.specs, self.fmt = specs, prompt_format
        msgs = prompt_format.messages("Q") + [{"role": "assistant", "content": CALL_SENTINEL},
                                              {"role": "tool", "content": RESULT_SENTINEL}]
        try:
            text = tokenizer.apply_chat_template(msgs, tools=specs, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # noqa: BLE001 - jinja raises many kinds
            raise _no_tools(where, f"it rejected a tool message ({str(e)[:120]})") from None
        after = text.split(CALL_SENTINEL, 1)[-1]
        if CALL_SENTINEL not in text or RESULT_SENTINEL not in after:
            raise _no_tools(where, "it does not render a tool message after an assistant message")
        self.pre, self.post = after.split(RESULT_SENTINEL, 1)

    def prompt_ids(self, tokenizer, prompts: list[str], prompt_format: PromptFormat | None) -> list[list[int]]:
        texts = [tokenizer.apply_chat_template(self.fmt.messages(p), tools=self.specs, add_generation_prompt=True,
                                               tokenize=False) for p in prompts]
        return [_plain_ids(tokenizer, t) for t in texts]

    def parse(self, turn_text: str) -> Call:
        body = turn_text[turn_text.rfind(self.start) + len(self.start):turn_text.rfind(self.end)] \
            if self.start in turn_text else ""
        try:
            call = json.loads(body)
        except ValueError as e:
            return Call(error=f"error: the tool call is not valid JSON ({e.msg} at character {e.pos})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Call(error='error: write a call as {"name": TOOL, "arguments": {...}}')
        args = call.get("arguments", {})
        if isinstance(args, str):
            return _json_arguments(call["name"], args)
        return Call(call["name"], args) if isinstance(args, dict) else \
            Call(call["name"], error="error: arguments must be a JSON object")

    def observation(self, tokenizer, text: str) -> list[int]:
        return _plain_ids(tokenizer, self.pre) + result_ids(tokenizer, text) + _plain_ids(tokenizer, self.post)


def _json_arguments(name: str, text: str) -> Call:
    try:
        args = json.loads(text)
    except ValueError as e:
        return Call(name, error=f"error: the arguments are not valid JSON ({e.msg} at character {e.pos})")
    return Call(name, args) if isinstance(args, dict) else Call(name, error="error: arguments must be a JSON object")


def _no_tools(where: str, why: str) -> UserError:
    return UserError(f"rollout.tools.format: the chat template of {where} cannot hold tool calls: {why}. Fix: set "
                     "rollout.tools.format = \"tags\" (plain-text calls), or use a model whose template renders tools")


def shows_tools(tokenizer, prompt_format: PromptFormat, specs: list[dict]) -> bool:
    """Whether the chat template renders the tools' schemas into the prompt (it uses its `tools` argument)."""
    msgs = prompt_format.messages("Q")
    try:
        return tokenizer.apply_chat_template(msgs, tools=specs, add_generation_prompt=True, tokenize=False) != \
            tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not show them
        return False


def pick_format(choice: str, tokenizer, prompt_format: PromptFormat | None, specs: list[dict],
                where: str = "the model"):
    """The format of rollout.tools.format = `choice` (auto: chat when the prompts are chat and the template
    shows the tools, else tags)."""
    chat = prompt_format is not None and prompt_format.mode == "chat"
    if choice == "chat" and not chat:
        raise UserError("rollout.tools.format = \"chat\" needs chat prompts (model.prompt_format chat, a model with "
                        "a chat template). Fix: set rollout.tools.format = \"tags\" or \"auto\"")
    if choice == "chat" or (choice == "auto" and chat and shows_tools(tokenizer, prompt_format, specs)):
        return ChatFormat(tokenizer, prompt_format, specs, where)
    return TagFormat(specs)
