"""Supervised warm-start: teacher-forced training on `prompt + reference_solution + EOS` of a built-in task.

Recipe: fresh problems every step from `task.train_batch`, loss on response tokens only (prompt and padding
labelled -100), AdamW with a short linear warmup, and every `eval_every` steps the greedy accuracy on a
fixed validation draw; training stops as soon as that accuracy reaches the target band. The band is a
*start* for RL, not a finished model: a weak start is fragile, a strong one leaves no room for RL to show.

Accuracy comes from `vapo_engine.rollout.evaluate` and the schedule from `vapo_engine.algo.schedule`, the
same code the trainer uses. This file does not build or cache models (see `build.py`) and never sees JSONL
sets (they have no reference solutions).
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from vapo_engine.algo.schedule import warmup_constant
from vapo_engine.rollout.evaluate import scores
from vapo_engine.tasks import Problem


def encode_sft_batch(tokenizer, prompts: list[str], responses: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask` and `labels` (-100 except response tokens and the EOS).

    Prompt and response are tokenized separately, exactly as a rollout sees them (prompt tokens, then the
    generated ones).
    """
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    pad = eos if pad is None else pad
    rows, label_rows = [], []
    for prompt, response in zip(prompts, responses):
        p = tokenizer(prompt)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        rows.append(p + r)
        label_rows.append([-100] * len(p) + r)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lab) in enumerate(zip(rows, label_rows)):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def evaluate(model, tokenizer, task, problems: list[Problem], *, max_new_tokens: int, greedy: bool = True,
             temperature: float = 1.0, batch_size: int | None = 256) -> float:
    """Fraction of `problems` whose single response (greedy, or sampled at `temperature`) gets reward 1."""
    if not problems:
        return 0.0
    rewards, _ = scores(model, tokenizer, task, problems, max_new_tokens=max_new_tokens, greedy=greedy,
                        temperature=temperature, batch_size=batch_size)
    return sum(rewards) / len(problems)


def _train_step(model, optimizer, scheduler, batch: dict[str, torch.Tensor], max_grad_norm: float,
                bf16: bool) -> float:
    model.train()
    batch = {k: v.to(model.device) for k, v in batch.items()}
    with torch.autocast(device_type=model.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    return float(loss.item())


def _batches(task, draw, batch_size: int, rng: random.Random, length_buckets: bool):
    """Endless batches of problems; with `length_buckets`, similar lengths share a batch (order shuffled)."""
    while True:
        if not length_buckets:
            yield draw(batch_size, rng)
            continue
        pool = sorted(draw(batch_size * 8, rng), key=lambda p: len(p.prompt) + len(task.reference_solution(p)))
        chunks = [pool[i:i + batch_size] for i in range(0, len(pool), batch_size)]
        rng.shuffle(chunks)
        yield from chunks


def sft_warm_start(model, tokenizer, task, *, max_steps: int = 2000, batch_size: int = 32, lr: float = 2e-3,
                   target_greedy: tuple[float, float] = (0.55, 0.75), eval_every: int = 25,
                   val_size: int = 256, warmup_steps: int = 20, weight_decay: float = 0.01,
                   max_grad_norm: float = 1.0, seed: int = 0, max_new_tokens: int | None = None,
                   bf16: bool | None = None, length_buckets: bool = False, val_buckets: tuple[str, ...] = (),
                   draw: Callable | None = None, log: Callable[[str], None] = print) -> dict:
    """Train until the greedy validation accuracy reaches `target_greedy[0]` (or `max_steps`); return metrics.

    Validation problems are a fixed draw from the *training* distribution (seeded), so the held-out split
    stays untouched for RL evaluation. Landing above `target_greedy[1]` is reported (`in_band=False`), not
    undone: pick `eval_every` small enough for the band. `bf16` runs the forward pass under bfloat16
    autocast (weights and optimizer stay float32): ~1.4x faster on CPUs with bf16 instructions (AVX512-BF16,
    AMX), but ~100x slower on AVX2-only CPUs, so the default (None) measures which is faster here.

    Problems come from `draw(n, rng)`, by default `task.sft_batch` when the task has one (its warm-start
    distribution), else `task.train_batch`. `length_buckets` draws eight batches at a time and groups problems of similar length
    into the same batch, so a batch is padded to its own length, not to the longest problem of the draw
    (~3× faster on tasks whose answers vary in length). `val_buckets` restricts the validation draw (and so
    the stopping rule) to those difficulty buckets of the task (e.g. only short chains).
    """
    if bf16 is None:
        from vapo_engine.algo.precision import bf16_matmul_is_fast
        bf16 = model.device.type == "cuda" or bf16_matmul_is_fast()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    draw = draw or getattr(task, "sft_batch", task.train_batch)
    val = draw(val_size * (8 if val_buckets else 1), random.Random(seed + 1_000_003))
    val = [p for p in val if not val_buckets or task.bucket(p) in val_buckets][:val_size]
    batches = _batches(task, draw, batch_size, rng, length_buckets)
    max_new = max_new_tokens or getattr(task, "max_new_tokens", None) or 64
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_constant(warmup_steps))
    t0, train_s, tokens, losses = time.perf_counter(), 0.0, 0, []
    greedy, step, stop = 0.0, 0, "max_steps"
    while step < max_steps:
        problems = next(batches)
        batch = encode_sft_batch(tokenizer, [p.prompt for p in problems],
                                 [task.reference_solution(p) for p in problems])
        ts = time.perf_counter()
        losses.append(_train_step(model, optimizer, scheduler, batch, max_grad_norm, bf16))
        train_s += time.perf_counter() - ts
        tokens += int(batch["attention_mask"].sum())
        step += 1
        if step % eval_every == 0 or step == max_steps:
            greedy = evaluate(model, tokenizer, task, val, max_new_tokens=max_new)
            elapsed = time.perf_counter() - t0
            log(f"sft step {step}: loss {losses[-1]:.4f}  greedy acc {greedy:.3f}  ({elapsed:.0f}s)")
            if greedy >= target_greedy[0]:
                stop = "target"
                break
    sampled = evaluate(model, tokenizer, task, val, max_new_tokens=max_new, greedy=False, temperature=1.0)
    return {
        "steps": step, "stop_reason": stop, "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None, "val_greedy_acc": greedy, "val_sampled_acc": sampled,
        "in_band": target_greedy[0] <= greedy <= target_greedy[1], "target_greedy": list(target_greedy),
        "train_tokens": tokens, "train_tokens_per_s": tokens / max(train_s, 1e-9),
        "seconds": time.perf_counter() - t0, "losses": losses,
    }
