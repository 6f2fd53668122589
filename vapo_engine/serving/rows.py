"""One generated answer (a "row" of a batch) as text that grows token by token: incremental detokenization,
stop strings, and the per-request token budget. Torch-free; the engine feeds it one token id per step.

Text is emitted only when it is final: a trailing U+FFFD (half of a multi-byte character) and a tail that
could still become a stop string are held back until the next token decides. When a stop string appears,
the text before it is the answer and the row finishes with `finish_reason = "stop"`; the EOS token finishes
it the same way (not counted as text); reaching the row's `max_tokens` finishes it with `"length"`.
Each step decodes the row's whole token list (simple and exact; fine for answers of a few thousand tokens).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string (0 if none)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class RowText:
    """The answer of one choice. `add(token)` returns the new final text (possibly "")."""

    def __init__(self, decode: Callable[[list[int]], str], eos_ids: Sequence[int], max_tokens: int,
                 stops: Sequence[str] = ()):
        self.decode, self.eos, self.max_tokens, self.stops = decode, set(eos_ids), max_tokens, tuple(stops)
        self.tokens: list[int] = []
        self.generated = 0
        """Tokens generated, the EOS token included (the usage's completion tokens)."""
        self.text = ""
        """Text emitted so far (always final)."""
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: int) -> str:
        """Take the next generated token; returns newly final text. No-op once the row is done."""
        if self.done:
            return ""
        self.generated += 1
        if token in self.eos:
            return self.finish("stop")
        self.tokens.append(int(token))
        full = self.decode(self.tokens)
        if self.stops:
            cut = self._stop_at(full)
            if cut is not None:
                return self._emit(full[:cut], "stop")
        if self.generated >= self.max_tokens:
            return self._emit(full, "length")
        hold = partial_stop_len(full, self.stops) if self.stops else 0
        safe = full[:len(full) - hold]
        if safe.endswith("\ufffd"):
            safe = safe.rstrip("\ufffd")
        return self._emit(safe, None)

    def finish(self, reason: str) -> str:
        """End the row (EOS, the batch's last step, a cancelled request): the held-back text is released."""
        if self.done:
            return ""
        return self._emit(self.decode(self.tokens) if self.tokens else self.text, reason)

    def _stop_at(self, full: str) -> int | None:
        start = max(0, len(self.text) - max(len(s) for s in self.stops))
        hits = [i for i in (full.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _emit(self, final: str, reason: str | None) -> str:
        delta = final[len(self.text):] if final.startswith(self.text) else ""
        self.text += delta
        if reason is not None:
            self.finish_reason = reason
        return delta
