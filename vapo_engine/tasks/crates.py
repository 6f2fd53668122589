"""`builtin:crates`: one-line word problems whose answer is the product of two 2-digit numbers — easy to read, hard
to compute for a ~1M-parameter character model, trivial with a calculator (the tool-use demo, docs/training.md).

    "37 crates hold 24 apples each. How many apples?"  ->  ";888"
    with the calculator (rollout.episode = "tool_calls", tags format):
    "<call>calculate 37*24</call>"  +  inserted "<result>888</result>"  +  ";888"

The answer is what follows the last ';' (verifier "exact"). Train and held-out problems sit on opposite sides of a
stable hash split of the (ordered) factor pair, whatever the wording. `reference_solution` is the warm-start
teacher of the built-in model `builtin:crates`: it calls the calculator on `TOOL_RATE` of the problems (chosen by
a hash of the problem) and answers the others directly, so the model starts out using the tool sometimes — a
deficit put in on purpose, which RL with the tool can remove. Torch-free.
"""
from __future__ import annotations

import hashlib
import random
import re

from .answers import BUILTIN_ANSWER_MARK, builtin_answer_correct
from .base import Problem, sample_split

TEMPLATES = ("{a} crates hold {b} apples each. How many apples?",
             "A hall has {a} rows of {b} seats. How many seats?",
             "{a} buses carry {b} people each. How many people?",
             "Each of {a} boxes holds {b} pens. How many pens?")
TOOL_RATE = 0.3
"""The share of problems the warm-start teacher solves with the calculator."""
_HELDOUT_FRACTION = 0.1
_HELDOUT_SEED = 20261205
_FACTORS = re.compile(r"^crates-(\d+)\*(\d+)-\d+$")


class CratesTask:
    """Products of two factors in [12, 99] asked in words (see the module docstring)."""

    name = "builtin:crates"
    verifier = "exact"
    """The default verifier (tasks/verifiers.py): the text after the last `;` equals the answer."""
    max_new_tokens = 64
    """The longest tool transcript (`<call>calculate 99*99</call><result>9801</result>;9801`, 52 tokens) and EOS."""
    system_prompt = ("Answer the question with ';' and the number. You may call the calculator first: "
                     "<call>calculate A*B</call>.")

    def _make(self, rng: random.Random) -> tuple[str, Problem]:
        a, b, t = rng.randint(12, 99), rng.randint(12, 99), rng.randrange(len(TEMPLATES))
        return f"{min(a, b)}*{max(a, b)}", Problem(id=f"crates-{a}*{b}-{t}", prompt=TEMPLATES[t].format(a=a, b=b),
                                                    answer=str(a * b))

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return sample_split(self._make, n, rng, heldout=False, salt=self.name, fraction=_HELDOUT_FRACTION)

    def heldout(self, n: int) -> list[Problem]:
        return sample_split(self._make, n, random.Random(_HELDOUT_SEED), heldout=True, salt=self.name,
                            fraction=_HELDOUT_FRACTION, unique=True)

    def reward(self, response: str, answer: str) -> float:
        return 1.0 if builtin_answer_correct(response, answer) else 0.0

    def factors(self, problem: Problem) -> tuple[int, int]:
        a, b = _FACTORS.match(problem.id).groups()
        return int(a), int(b)

    def uses_tool(self, problem: Problem) -> bool:
        """Whether the warm-start teacher calls the calculator on `problem` (TOOL_RATE of them, by a stable hash)."""
        digest = hashlib.blake2b(f"tool:{problem.id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < TOOL_RATE

    def reference_solution(self, problem: Problem) -> str:
        """The teacher's response: the calculator transcript, or the answer alone (see `uses_tool`)."""
        a, b = self.factors(problem)
        answer = BUILTIN_ANSWER_MARK + str(a * b)
        if not self.uses_tool(problem):
            return answer
        return f"<call>calculate {a}*{b}</call><result>{a * b}</result>{answer}"

    def __repr__(self) -> str:
        return f"CratesTask(name={self.name!r})"
