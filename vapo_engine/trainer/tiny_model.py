"""The built-in tiny model: a char-level tokenizer and a ~1M-parameter Qwen2 causal LM, as an HF directory.

- `build_tokenizer()`: vocabulary = printable ASCII + newline, special tokens <pad>/<bos>/<eos>/<unk>, BOS
  prepended, left padding, exact round-trip decoding; built locally with `tokenizers` (no hub access).
- `make_model_dir(out_dir, ...)`: an untrained model + tokenizer saved with `save_pretrained`, so
  `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(dir)` load it like any other checkpoint.
- `builtin_model_dir()`: the SFT-warm-started model the CPU demo trains, built once and cached under
  `$VAPO_MCP_CACHE` or `~/.cache/vapo-mcp`. Builds go to a temporary folder with a done-marker written last
  and are `os.replace`d into place under a lock, so a killed build never leaves a half directory and two
  concurrent builders cannot corrupt the cache.

It deliberately has no chat template (prompts are plain text) and no RL code; the SFT recipe is in `sft.py`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Ids 0..3 in this order."""
CHARSET = "".join(chr(i) for i in range(32, 127)) + "\n"
"""Printable ASCII plus newline; anything else encodes to <unk> (dropped when decoding)."""
MAX_POSITIONS = 512

BUILTIN_VERSION = 1
"""Bump whenever the tokenizer, architecture or SFT recipe changes: it is part of the cache folder name."""
DONE_MARKER = "BUILD_COMPLETE.json"
"""Written last inside a finished build; a folder without it is ignored and rebuilt."""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (one token per character, BOS prepended, left padding)."""
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *CHARSET])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # concatenate characters: no spaces inserted
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left", clean_up_tokenization_spaces=False, model_max_length=MAX_POSITIONS,
    )


def make_config(tokenizer, *, hidden: int = 128, layers: int = 4, heads: int = 4) -> Qwen2Config:
    """A small Qwen2 config: intermediate 4x hidden, tied embeddings, float32."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    return Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, dtype="float32",
    )


def make_model(tokenizer, *, hidden: int = 128, layers: int = 4, heads: int = 4,
               seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised tiny causal LM (deterministic given `seed`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(make_config(tokenizer, hidden=hidden, layers=layers, heads=heads))
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return model.float()


def make_model_dir(out_dir: str | Path, *, hidden: int = 128, layers: int = 4, heads: int = 4,
                   seed: int = 0) -> Path:
    """Save an untrained tiny model and its tokenizer to `out_dir` (a normal HF directory); returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    make_model(tokenizer, hidden=hidden, layers=layers, heads=heads, seed=seed).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------- cached, SFT-warm-started built-in model


@dataclasses.dataclass(frozen=True)
class BuildRecipe:
    """Everything that determines the built-in model; non-default values get their own cache folder."""

    seed: int = 0
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    task: str = "builtin:addition"
    max_steps: int = 2000
    batch_size: int = 32
    lr: float = 2e-3
    eval_every: int = 25
    val_size: int = 256
    target_greedy: tuple[float, float] = (0.60, 0.75)
    """Stop at >= 0.60 greedy on the validation draw; lands near the ~65% greedy start RL needs."""
    report_size: int = 500
    num_threads: int = 0
    """torch threads during the build (0 = all available cores); restored afterwards."""

    def folder_name(self) -> str:
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default and f.name != "num_threads"}
        if not changed:
            return f"tiny-addition-v{BUILTIN_VERSION}"
        digest = hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:10]
        return f"tiny-addition-v{BUILTIN_VERSION}-{digest}"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$VAPO_MCP_CACHE`, else `~/.cache/vapo-mcp`."""
    if cache_dir is None:
        cache_dir = os.environ.get("VAPO_MCP_CACHE") or Path.home() / ".cache" / "vapo-mcp"
    return Path(cache_dir).expanduser()


def is_complete(model_dir: str | Path) -> bool:
    """True when `model_dir` holds a finished build (its done-marker exists)."""
    return (Path(model_dir) / DONE_MARKER).is_file()


@contextlib.contextmanager
def _build_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX flock); elsewhere, "rename wins" alone keeps the cache sound."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    saved = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _build_into(tmp: Path, recipe: BuildRecipe, log: Callable[[str], None]) -> dict:
    """Create, SFT-train, evaluate and save the model in `tmp`; the done-marker is the last file written."""
    from vapo_engine.tasks import get_task

    from .sft import evaluate, sft_warm_start

    t0 = time.perf_counter()
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    tokenizer = build_tokenizer()
    model = make_model(tokenizer, hidden=recipe.hidden, layers=recipe.layers, heads=recipe.heads,
                       seed=recipe.seed)
    task = get_task(recipe.task)
    sft = sft_warm_start(model, tokenizer, task, max_steps=recipe.max_steps, batch_size=recipe.batch_size,
                         lr=recipe.lr, target_greedy=recipe.target_greedy, eval_every=recipe.eval_every,
                         val_size=recipe.val_size, seed=recipe.seed, log=log)
    heldout = task.heldout(recipe.report_size)
    greedy = evaluate(model, tokenizer, task, heldout, max_new_tokens=task.max_new_tokens)
    sampled = evaluate(model, tokenizer, task, heldout, max_new_tokens=task.max_new_tokens, greedy=False)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    metrics = {k: v for k, v in sft.items() if k != "losses"}
    metrics.update(heldout_greedy_acc=greedy, heldout_sampled_acc=sampled, heldout_size=len(heldout),
                   build_seconds=time.perf_counter() - t0, recipe=dataclasses.asdict(recipe),
                   version=BUILTIN_VERSION, torch_threads=torch.get_num_threads())
    (tmp / "sft_metrics.json").write_text(json.dumps(metrics, indent=2))
    (tmp / DONE_MARKER).write_text(json.dumps({"version": BUILTIN_VERSION, "time": time.time()}))
    return metrics


def builtin_model_dir(cache_dir: str | Path | None = None, *, log: Callable[[str], None] = print,
                      **sft_kwargs) -> Path:
    """The cached SFT-warm-started tiny model directory, built (≈1–3 min on 2 CPU cores) the first time.

    `sft_kwargs` override `BuildRecipe` fields (e.g. `max_steps=5, hidden=16` in tests); a non-default
    recipe is cached in its own folder. Unfinished folders (no done-marker) are ignored and rebuilt.
    """
    recipe = BuildRecipe(**sft_kwargs)
    root = cache_root(cache_dir)
    final = root / recipe.folder_name()
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f"{final.name}.lock"):
        if is_complete(final):  # another process finished while we waited
            return final
        for stale in [final, *root.glob(f".tmp-{final.name}.*")]:
            shutil.rmtree(stale, ignore_errors=True)  # leftovers of a killed build: we hold the lock
        tmp = root / f".tmp-{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"  # '.': no other recipe matches
        tmp.mkdir()
        log(f"building the built-in tiny model in {final} (first use only) ...")
        try:
            with _torch_threads(recipe.num_threads):
                metrics = _build_into(tmp, recipe, log)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            os.replace(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if is_complete(final):  # "rename wins": a builder without our lock got there first
                return final
            raise
        log(f"built-in tiny model ready: held-out greedy {metrics['heldout_greedy_acc']:.2f}, sampled "
            f"{metrics['heldout_sampled_acc']:.2f}, {metrics['build_seconds']:.0f}s")
    return final
