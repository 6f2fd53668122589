"""Built-in verifiable arithmetic tasks: `builtin:addition` (carry chain) and `builtin:multistep`.

Prompts are plain text with no chat template; a reference response writes the working step by step and
ends with `;<answer>` (checked by exact match). Examples:

    addition   "0047+0385="  ->  "7+5+0=2,4+8+1=3,0+3+1=4,0+0+0=0;432"
    multistep  "23*7+45-18=" ->  "23*7=161,161+45=206,206-18=188;188"

Train and held-out problems come from the same generator but sit on opposite sides of a stable hash split
of the (order-normalised) operands, so no training draw can ever be a held-out problem. This file does not
tokenize, train or generate; it does not add an EOS token to reference solutions.
"""
from __future__ import annotations

import random
import re

from .answers import BUILTIN_ANSWER_MARK, builtin_answer_correct
from .base import Problem, sample_split

_HELDOUT_FRACTION = 0.1
_HELDOUT_SEED = 20250405


class ArithmeticTask:
    """Shared machinery: hash-split sampling, exact reward, reference solutions from the prompt alone."""

    name = "builtin:arithmetic"
    verifier = "exact"
    """The default verifier (tasks/verifiers.py): the text after the last `;` equals the answer."""
    max_new_tokens = 48
    """Enough new tokens for the longest reference response plus the EOS token."""

    def _make(self, rng: random.Random) -> tuple[str, Problem]:
        raise NotImplementedError

    def solve(self, prompt: str) -> str:
        """The reference response for `prompt` (without EOS)."""
        raise NotImplementedError

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return sample_split(self._make, n, rng, heldout=False, salt=self.name, fraction=_HELDOUT_FRACTION)

    def heldout(self, n: int) -> list[Problem]:
        rng = random.Random(_HELDOUT_SEED)
        return sample_split(
            self._make, n, rng, heldout=True, salt=self.name, fraction=_HELDOUT_FRACTION, unique=True
        )

    def reward(self, response: str, answer: str) -> float:
        return 1.0 if builtin_answer_correct(response, answer) else 0.0

    def reference_solution(self, problem: Problem) -> str:
        return self.solve(problem.prompt)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _random_int(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def carry_chain(a: int, b: int, width: int = 0) -> str:
    """Digit-by-digit addition from the right, e.g. (47, 385) -> '7+5+0=2,4+8+1=3,0+3+1=4'.

    One fixed-width step `x+y+c=s` per digit of the longer operand, or `width` steps if that is more (x, y
    the digits, 0 when missing; c the carry in; s the sum digit); the last carry out is the answer's
    leading digit.
    """
    sa, sb = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(sa), len(sb), width)):
        x = int(sa[i]) if i < len(sa) else 0
        y = int(sb[i]) if i < len(sb) else 0
        total = x + y + carry
        steps.append(f"{x}+{y}+{carry}={total % 10}")
        carry = total // 10
    return ",".join(steps)


class AdditionTask(ArithmeticTask):
    """Addition of two numbers of `min_digits`..`max_digits` digits, written zero-padded to `max_digits`.

    The zero padding gives every digit a fixed position in the prompt, and with `fixed_steps` (default) the
    chain always has `max_digits` fixed-width steps, so every digit sits at a fixed position in the response
    too: the ~1M-parameter model learns it in about a minute on 2 CPU cores (stopping the chain at the real
    digit count, `fixed_steps=False`, learned about 2x slower; natural unpadded prompts several times
    slower). Responses are 34-37 characters; `builtin:multistep` is the task with varied lengths.
    """

    name = "builtin:addition"
    system_prompt = ("Add the two numbers digit by digit from the right. Write each step as x+y+c=s (x, y the "
                     "digits, c the carry in, s the sum digit), steps separated by commas, then ';' and the sum. "
                     "Example: 0047+0385= -> 7+5+0=2,4+8+1=3,0+3+1=4,0+0+0=0;432. Reply with that line only.")

    def __init__(self, min_digits: int = 2, max_digits: int = 4, fixed_steps: bool = True):
        self.fixed_steps = fixed_steps
        if not 1 <= min_digits <= max_digits <= 9:
            raise ValueError("need 1 <= min_digits <= max_digits <= 9")
        self.min_digits, self.max_digits = min_digits, max_digits
        # Longest response: d steps of 7 chars + (d-1) commas + ';' + (d+1) answer digits, plus the EOS token.
        self.max_new_tokens = 9 * max_digits + 2

    def _make(self, rng: random.Random) -> tuple[str, Problem]:
        a = _random_int(rng, rng.randint(self.min_digits, self.max_digits))
        b = _random_int(rng, rng.randint(self.min_digits, self.max_digits))
        key = f"{min(a, b)}+{max(a, b)}"  # a+b and b+a are the same problem for the split
        w = self.max_digits
        return key, Problem(id=f"add-{a}+{b}", prompt=f"{a:0{w}d}+{b:0{w}d}=", answer=str(a + b))

    def solve(self, prompt: str) -> str:
        m = re.fullmatch(r"(\d+)\+(\d+)=", prompt)
        if not m:
            raise ValueError(f"not an addition prompt: {prompt!r}")
        a, b = int(m.group(1)), int(m.group(2))
        width = len(m.group(1)) if self.fixed_steps else 0
        return carry_chain(a, b, width) + BUILTIN_ANSWER_MARK + str(a + b)


_TOKEN_RE = re.compile(r"\d+|[-+*]")


def eval_steps(prompt: str) -> tuple[list[str], int]:
    """Evaluate `a op b op c ...=` strictly left to right; returns the written steps and the result."""
    body = prompt.removesuffix("=")
    tokens = _TOKEN_RE.findall(body)
    if "".join(tokens) != body or len(tokens) < 3 or len(tokens) % 2 == 0:
        raise ValueError(f"not a multistep prompt: {prompt!r}")
    value, steps = int(tokens[0]), []
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        rhs = int(operand)
        new = value + rhs if op == "+" else value - rhs if op == "-" else value * rhs
        steps.append(f"{value}{op}{rhs}={new}")
        value = new
    return steps, value


class MultistepTask(ArithmeticTask):
    """Left-to-right chains of `min_ops`-`max_ops` operations, e.g. `23*7+45-18=`; responses of ~20-60 chars.

    Only the first operation may be `*` (by a single digit), so left-to-right order equals the usual
    precedence; subtractions never go below zero.
    """

    name = "builtin:multistep"
    system_prompt = ("Evaluate left to right. Write each step as a<op>b=c, steps separated by commas, then ';' "
                     "and the result. Example: 23*7+45= -> 23*7=161,161+45=206;206. Reply with that line only.")

    def __init__(self, min_ops: int = 3, max_ops: int = 5):
        if not 2 <= min_ops <= max_ops <= 6:
            raise ValueError("need 2 <= min_ops <= max_ops <= 6")
        self.min_ops, self.max_ops = min_ops, max_ops
        # Values stay below 10**4: a step 'vvvv+oo=vvvv' is <= 12 chars + a comma; then ';', answer, EOS.
        self.max_new_tokens = 13 * max_ops + 6

    def _make(self, rng: random.Random) -> tuple[str, Problem]:
        n_ops = rng.randint(self.min_ops, self.max_ops)
        value = rng.randint(10, 99)
        text = str(value)
        for i in range(n_ops):
            if i == 0 and rng.random() < 0.5:
                rhs = rng.randint(2, 9)
                value, text = value * rhs, f"{text}*{rhs}"
            elif rng.random() < 0.5 and value >= 10:
                rhs = rng.randint(1, min(99, value))
                value, text = value - rhs, f"{text}-{rhs}"
            else:
                rhs = rng.randint(10, 99)
                value, text = value + rhs, f"{text}+{rhs}"
        return text, Problem(id=f"ms-{text}", prompt=f"{text}=", answer=str(value))

    def solve(self, prompt: str) -> str:
        steps, value = eval_steps(prompt)
        return ",".join(steps) + BUILTIN_ANSWER_MARK + str(value)


def _builtin_tasks() -> dict:
    from .chain import ChainTask, LongChainTask
    from .crates import CratesTask
    from .word import SpeedTask, WordTask
    return {"addition": AdditionTask, "multistep": MultistepTask, "chain": ChainTask, "chain-long": LongChainTask,
            "word": WordTask, "word-speed": SpeedTask, "crates": CratesTask}


BUILTIN_TASKS = _builtin_tasks()
"""Built-in task classes by short name (`builtin:<name>`)."""
