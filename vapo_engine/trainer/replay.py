"""Positive replay buffer: past correct (prompt, response) token-id pairs for the positive-example LM loss; a
multi-turn episode's response keeps its loss mask as a third element (only the policy's tokens learn).

Off-policy positives need no importance ratio in an NLL term (docs/design.md §3.8). FIFO with a fixed capacity; sampling
uses the caller's `random.Random` so runs are reproducible; the whole buffer is part of a checkpoint.
"""
from __future__ import annotations

import random
from collections import deque

import torch


class ReplayBuffer:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: deque[tuple] = deque(maxlen=capacity)
        self.sources: deque[str] = deque(maxlen=capacity)
        """Where each item came from: "policy" (this run's rollouts) or "provider" (the API channel)."""

    def __len__(self) -> int:
        return len(self.items)

    def add_correct(self, ro) -> int:
        """Store the correct rows of a Rollout (prompt without padding, response up to its last valid token, and
        the row's loss mask where inserted tokens make it differ from the response's extent)."""
        added = 0
        p = ro.prompt_len
        for i in torch.nonzero(ro.correct).squeeze(-1).tolist():
            prompt = ro.input_ids[i, :p][ro.attention_mask[i, :p].bool()].tolist()
            extent = ro.response_mask[i].bool()
            resp = ro.input_ids[i, p:][extent].tolist()
            loss = ro.loss_mask[i][extent]
            if resp:
                self.items.append((prompt, resp) if bool(loss.ne(0).all()) else (prompt, resp, loss.tolist()))
                self.sources.append("policy")
                added += 1
        return added

    def add_pairs(self, pairs: list[tuple[list[int], list[int]]], source: str) -> int:
        """Add already tokenized correct (prompt, response) pairs, e.g. provider answers."""
        for prompt, resp in pairs:
            self.items.append((list(prompt), list(resp)))
            self.sources.append(source)
        return len(pairs)

    def count(self, source: str) -> int:
        return sum(1 for s in self.sources if s == source)

    def sample(self, n: int, rng: random.Random) -> list[tuple]:
        n = min(n, len(self.items))
        return [self.items[i] for i in rng.sample(range(len(self.items)), n)] if n else []

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "items": [list(map(list, it)) for it in self.items],
                "sources": list(self.sources)}

    def load_state_dict(self, state: dict) -> None:
        self.items = deque((tuple(list(x) for x in it) for it in state["items"]), maxlen=self.capacity)
        sources = state.get("sources") or ["policy"] * len(self.items)  # checkpoints from before sources
        self.sources = deque(sources, maxlen=self.capacity)


def replay_count(n_positive: int, ratio: float, available: int) -> int:
    """How many replayed samples make them a fraction `ratio` of the positive batch: n·r/(1 − r).
    With no fresh positives the batch is filled from the buffer alone (ratio 1 in effect)."""
    if ratio <= 0 or available == 0:
        return 0
    base = max(n_positive, 1)
    want = base if ratio >= 1 else round(base * ratio / (1 - ratio))
    return min(max(want, 1), available)
