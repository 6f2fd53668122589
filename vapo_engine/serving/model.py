"""The served model: weights and tokenizer loaded from a Hugging Face directory, and how a chat request
becomes prompt token ids within the model's context. Worker-side (torch/transformers).

Loading is the run's own way, made safe for a network service: the tokenizer through
`vapo_engine.rollout.tokenizer.load_tokenizer` (transformers 5's AutoTokenizer would rebuild the built-in
character tokenizer as BPE), the weights with `AutoModelForCausalLM` from safetensors only
(`use_safetensors=True`: no pickle is ever loaded) and without `trust_remote_code`. The checkpoint's own
`generation_config` is replaced by an empty one, so only the request's temperature / top_p apply, exactly as
in the run's rollouts and evaluation (`vapo_engine.rollout.backends.hf`, which the engine calls).

Prompt: the tokenizer's chat template when it has one (`add_generation_prompt=True`; a message whose content
holds a special token's text is a 400, since the tokenizer would parse it into that control token); otherwise the last user
message's content as-is, tokenized like the run's evaluation tokenizes a task prompt (the built-in model has
no template, so `0047+0385=` sent as the user message is exactly the held-out prompt).
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from vapo_engine.errors import UserError
from vapo_engine.rollout.backends.hf import generation_defaults
from vapo_engine.rollout.generate import special_ids
from vapo_engine.rollout.tokenizer import NO_REMOTE_CODE, load_tokenizer

from .protocol import ApiError, bad_request

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(UserError):
    """A model directory that cannot be served, with the fix."""


def pick_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda but CUDA is not available; use --device auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` = bf16 on a CUDA device that supports it, else float32 (exact for the tiny CPU models)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return DTYPES[name]


@dataclass
class ServedModel:
    """A loaded causal LM with its tokenizer, special ids and context length."""

    model: object
    tokenizer: object
    name: str
    device: torch.device
    pad_id: int
    eos_ids: list[int]
    context: int
    source: str
    has_template: bool = False
    controls: tuple[str, ...] = ()
    """The text of the tokenizer's special tokens (`control_tokens`): refused inside templated message content."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Serialises tokenizer use: a fast tokenizer's backend is mutated by each encode call (padding and
    truncation settings), and the engine thread decodes while the event loop encodes new prompts."""
    compute: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Serialises every use of the weights: the chat engine's batches, rollout-protocol samples and weight loads
    (`rollout_service`), so weights never change under a running generate call."""

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, text: str, special: bool = True) -> list[int]:
        with self.lock:
            return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def prompt_ids(self, messages) -> list[int]:
        """Token ids of the prompt for a validated message list; `ApiError` 400 when unusable."""
        if self.has_template:
            self._no_control_tokens(messages)
            try:
                text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                          tokenize=False)
            except Exception as e:  # noqa: BLE001 - a template rejecting the messages is the client's to fix
                raise bad_request(f"the model's chat template rejected the messages: {str(e)[:200]}",
                                  "messages") from None
            ids = self.encode(text, special=False)
        else:
            users = [m["content"] for m in messages if m["role"] == "user"]
            if not users:
                raise bad_request("this model has no chat template: send the prompt as a user message "
                                  "(its content is the prompt as-is)", "messages")
            ids = self.encode(users[-1])
        if not ids:
            raise bad_request("the prompt encodes to no tokens; send some text", "messages")
        return ids

    def _no_control_tokens(self, messages) -> None:
        """400 naming `messages[i].content` when it holds a special token's text: the tokenizer would turn it into
        that token, so a message could close its turn and open another role's."""
        for i, m in enumerate(messages):
            hit = next((c for c in self.controls if c in m["content"]), None)
            if hit is not None:
                raise bad_request(f"messages[{i}].content contains {hit[:40]!r}, a control token of this model's "
                                  "chat template; remove it (message text cannot open or close a turn)",
                                  f"messages[{i}].content", code="control_token_in_content")

    def budget(self, prompt_len: int, asked: int | None, default: int) -> int:
        """New tokens allowed for a prompt of `prompt_len` tokens; 400 when it cannot fit the context."""
        room = self.context - prompt_len
        if room < 1:
            raise ApiError(400, f"This model's maximum context length is {self.context} tokens, but the prompt "
                                f"has {prompt_len} tokens; shorten the messages", param="messages",
                           code="context_length_exceeded")
        if asked is None:
            return min(room, default)
        if asked > room:
            raise ApiError(400, f"This model's maximum context length is {self.context} tokens, but "
                                f"{prompt_len + asked} were requested ({prompt_len} in the messages, {asked} in "
                                f"max_tokens); lower max_tokens to at most {room} or shorten the messages",
                           param="max_tokens", code="context_length_exceeded")
        return asked


def load_served_model(model_dir: str | Path, name: str, *, device: str = "auto",
                      dtype: str = "auto") -> ServedModel:
    """Load `model_dir` (a folder, or a GGUF input: realmodels) for generation (eval mode, no gradients);
    `ModelLoadError` with the fix."""
    from vapo_engine.realmodels.convert import model_folder
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = model_folder(model_dir, log=lambda m: print(m, file=sys.stderr))  # a GGUF input: its cached folder
    dev = pick_device(device)
    try:
        tok = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, dev), use_safetensors=True,
                                                     **NO_REMOTE_CODE)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load a causal LM from {str(path)!r} ({str(e)[:300]}); serve a folder "
                             "written by save_pretrained with safetensors weights (a run's checkpoint "
                             "policy/ folder is one)") from None
    model.to(dev).eval().requires_grad_(False)
    pad, eos = special_ids(model, tok)  # before the checkpoint's generation_config (it may name EOS ids) goes
    model.generation_config = generation_defaults()
    limits = [v for v in (getattr(model.config, "max_position_embeddings", None),
                          getattr(tok, "model_max_length", None)) if isinstance(v, int) and 0 < v < 10**8]
    return ServedModel(model, tok, name, dev, pad, eos, min(limits) if limits else 4096, str(path),
                       has_template=bool(getattr(tok, "chat_template", None)), controls=control_tokens(tok))


def control_tokens(tok) -> tuple[str, ...]:
    """The text of every special token the tokenizer parses out of plain text (its special tokens and added
    tokens marked special), longest first."""
    found = {str(t) for t in getattr(tok, "all_special_tokens", None) or []}
    found |= {str(t.content) for t in (getattr(tok, "added_tokens_decoder", None) or {}).values()
              if getattr(t, "special", False)}
    return tuple(sorted((t for t in found if t), key=len, reverse=True))
