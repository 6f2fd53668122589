"""`builtin:chain` — running totals over labelled steps: long, length-varying answers checkable step by step.

The task VAPO's parts are made for, in miniature (docs/design.md §3: long chains of thought of very different lengths,
sparse success, a value model that must notice a mistake when it is made):

    prompt    "47 a+8 b-3 c+9\\n"                      a start value, then `steps` labelled operations
    response  "a 47+8=55\\nb 55-3=52\\nc 52+9=61\\n;61"   one fixed-width line per step, then `;answer`

- **Length varies ≥ 10×** inside one batch: 1 to 14 steps give responses of 14 to 144 tokens (10 characters a
  line with the built-in character tokenizer, plus `;`, the two answer digits and EOS).
- **Difficulty is visible from the prompt** (the number of operations) and `bucket()` names it: short (1–3
  steps), mid (4–8), long (9–14). The hard part is finding a line's operation among many in a long prompt
  (copying the wrong sign, not the sums). The built-in model's warm-start (v2) has learnt that, then learnt from
  a teacher that stops after 8 lines: RL starts with long chains at ~0% greedy and ~3% sampled, and must learn
  to keep going (`vapo_engine.builtin_model.build.RECIPES`).
- **Every step is checkable locally**: a line copies the previous line's total and the operation with its
  label from the prompt, and adds or subtracts one digit; totals stay in 0–99 and are written with two digits,
  so every line has the same shape. Every line is determined by the prompt, so a response that has left the
  reference path (`on_path`) almost never ends on the right total: a small critic can see the mistake in the
  line where it is made.
- **Reward is exact**: 1 when the text after the last `;` is the final total, else 0.

Train and held-out problems sit on opposite sides of a stable hash split of (start, operations).
"""
from __future__ import annotations

import random
import string

from .answers import BUILTIN_ANSWER_MARK, builtin_answer_correct
from .base import Problem, heldout_by_kind, sample_split

LABELS = string.ascii_lowercase
LINE = 10
"""Characters per response line: `a 47+8=55` plus the newline."""
BUCKETS = (("short", 1, 3), ("mid", 4, 8), ("long", 9, 26))
_HELDOUT_FRACTION = 0.1
_HELDOUT_SEED = 20251201
_SALT = "builtin:chain"
"""The hash split's salt: every chain task variant shares one train / held-out split."""


class ChainTask:
    """Running-total chains of `min_steps`..`max_steps` labelled operations (see the module docstring)."""

    name = "builtin:chain"
    verifier = "exact"
    """The default verifier (tasks/verifiers.py): the text after the last `;` equals the answer."""
    system_prompt = ("Apply the labelled operations in order, starting from the first number. Write one line per "
                     "operation as '<label> <total><op><digit>=<new total>' with two-digit totals, then a line "
                     "';<final total>'. Example: '47 a+8 b-3' -> 'a 47+8=55', 'b 55-3=52', ';52'. Reply with "
                     "those lines only.")

    def __init__(self, min_steps: int = 1, max_steps: int = 14):
        if not 1 <= min_steps <= max_steps <= len(LABELS):
            raise ValueError(f"need 1 <= min_steps <= max_steps <= {len(LABELS)}")
        self.min_steps, self.max_steps = min_steps, max_steps
        self.max_new_tokens = LINE * max_steps + len(BUILTIN_ANSWER_MARK) + 2 + 1  # lines, ';', 2 digits, EOS

    # --- problems ------------------------------------------------------------------------------------------
    def _make(self, rng: random.Random, steps: int | None = None) -> tuple[str, Problem]:
        n = steps or rng.randint(self.min_steps, self.max_steps)
        total = rng.randint(10, 99)
        parts = [f"{total:02d}"]
        for label in LABELS[:n]:
            d = rng.randint(1, 9)
            sign = "+" if total - d < 0 else "-" if total + d > 99 else rng.choice("+-")
            total = total + d if sign == "+" else total - d
            parts.append(f"{label}{sign}{d}")
        key = " ".join(parts)
        return key, Problem(id=f"chain-{key.replace(' ', '')}", prompt=key + "\n", answer=f"{total:02d}")

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return sample_split(self._make, n, rng, heldout=False, salt=_SALT, fraction=_HELDOUT_FRACTION)

    def sft_batch(self, n: int, rng: random.Random) -> list[Problem]:
        """The first warm-start phase's problems: step counts drawn ∝ 1/steps, so most are short (56% have ≤ 3
        steps) and long ones rare; the builder's second phase (the RL distribution) stops while long chains are
        still mostly failed (sparse reward for RL)."""
        counts = list(range(self.min_steps, self.max_steps + 1))
        weights = [1 / c for c in counts]
        out = []
        for _ in range(n):
            steps = rng.choices(counts, weights)[0]
            out += sample_split(lambda r, s=steps: self._make(r, s), 1, rng, heldout=False, salt=_SALT,
                                fraction=_HELDOUT_FRACTION)
        return out

    def heldout(self, n: int) -> list[Problem]:
        """`n` distinct held-out problems, the same number of each step count (so every bucket is measured)."""
        return heldout_by_kind(self._make, list(range(self.min_steps, self.max_steps + 1)), n,
                               random.Random(_HELDOUT_SEED), salt=_SALT, fraction=_HELDOUT_FRACTION)

    # --- checking ------------------------------------------------------------------------------------------
    def reward(self, response: str, answer: str) -> float:
        return 1.0 if builtin_answer_correct(response, answer) else 0.0

    @staticmethod
    def steps_of(prompt: str) -> int:
        return len(prompt.split()) - 1

    def bucket(self, problem: Problem) -> str:
        n = self.steps_of(problem.prompt)
        return next(name for name, lo, hi in BUCKETS if lo <= n <= hi)

    def solve(self, prompt: str, max_lines: int | None = None, flips: frozenset[int] = frozenset()) -> str:
        """The reference response for `prompt` (without EOS); with `max_lines`, the response of a solver that
        stops after that many lines and answers the total so far (the planted-stop teacher); lines whose index
        is in `flips` copy their operation's sign wrong and the lines after them carry the wrong total on
        (`legal_flip` says which flips keep every total in 0–99)."""
        head, *ops = prompt.split()
        total, lines = int(head), []
        for i, op in enumerate(ops[:max_lines]):
            label, sign, d = op[0], op[1], int(op[2])
            if i in flips:
                sign = "-" if sign == "+" else "+"
            new = total + d if sign == "+" else total - d
            lines.append(f"{label} {total:02d}{sign}{d}={new:02d}")
            total = new
        return "\n".join(lines) + "\n" + BUILTIN_ANSWER_MARK + f"{total:02d}"

    @staticmethod
    def legal_flip(prompt: str, flips: frozenset[int], line: int) -> bool:
        """Whether flipping the sign of `line` as well as `flips` keeps every running total in 0–99."""
        head, *ops = prompt.split()
        total = int(head)
        for i, op in enumerate(ops):
            sign = op[1] if i not in flips | {line} else ("-" if op[1] == "+" else "+")
            total = total + int(op[2]) if sign == "+" else total - int(op[2])
            if not 0 <= total <= 99:
                return False
        return True

    def reference_solution(self, problem: Problem) -> str:
        return self.solve(problem.prompt)

    def on_path(self, prompt: str, prefix: str) -> bool:
        """Whether the response prefix is still a prefix of the reference solution (the only way to finish
        correctly: every line is determined by the prompt)."""
        return self.solve(prompt).startswith(prefix)

    def __repr__(self) -> str:
        return f"ChainTask(steps={self.min_steps}..{self.max_steps})"


class LongChainTask(ChainTask):
    """`builtin:chain-long`: the long end of `builtin:chain` alone (9–14 steps), on the same train / held-out
    split. As an evaluation benchmark it spends every held-out problem on the bucket where RL has the most to
    do (96 long problems cost what 224 mixed ones would)."""

    name = "builtin:chain-long"

    def __init__(self):
        super().__init__(min_steps=9, max_steps=14)
