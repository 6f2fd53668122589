"""`builtin:word` — arithmetic word problems in English, grown outward from the seed's smoke question.

The task a small pretrained instruct model (SmolLM2-135M-Instruct, docs/training.md) is trained on: "A train covers
240 km in 3 hours. What is its average speed in km/h?" (→ 80) and its relatives, five kinds with integer answers:

    speed     distance / time             "A train covers 240 km in 3 hours. What is its average speed in km/h?"
    price     total / count               "5 notebooks cost 35 dollars. How many dollars does one notebook cost?"
    rate      rate × time                 "A machine makes 12 parts per hour. How many parts does it make in 7 hours?"
    percent   p % of x                    "What is 25% of 80?"
    two_step  rate × time + extra, or money − count × price (change)

`bucket()` is the kind; the kinds differ in difficulty for the model (measured: bench/results/smollm_word_baseline.json).
Generation is deterministic for a seeded `random.Random`; train and held-out problems sit on opposite sides of a
stable hash split of (kind, template, numbers), and `heldout(n)` takes the kinds in turn, so every bucket is
measured.

The checker (`word_answer`) reads the response's final answer and compares it exactly with the gold integer: the
last `\\boxed{…}` if any, else what follows the last "answer is" / "Answer:", else the last line after its last
"=", else the last line. That final part must hold exactly one distinct number (units and `$` are ignored, so
`80`, `80 km/h`, `\\boxed{80}`, `Answer: $80.00` all read 80); a final part with several different numbers
("80 or 90", two different boxed values) is refused as a hedge, whatever the gold answer. Torch-free.
"""
from __future__ import annotations

import random
import re

from .answers import _NUMBER_RE, to_fraction
from .base import Problem, heldout_by_kind, sample_split

_HELDOUT_FRACTION = 0.1
_HELDOUT_SEED = 20251205
KINDS = ("speed", "price", "rate", "percent", "two_step")

_SPEED = ("A train covers {d} km in {t} hours. What is its average speed in km/h?",
          "A car travels {d} km in {t} hours. What is its average speed in km/h?",
          "A cyclist rides {d} km in {t} hours at a steady pace. How many km does she ride per hour?")
_PRICE = ("{n} notebooks cost {c} dollars. How many dollars does one notebook cost?",
          ("Tom pays {c} dollars for {n} tickets. Each ticket costs the same. What is the price of one ticket in "
          "dollars?"),
          "{n} apples cost {c} cents in total. How many cents does one apple cost?")
_RATE = ("A machine makes {r} parts per hour. How many parts does it make in {h} hours?",
         "A pump moves {r} liters of water per minute. How many liters does it move in {h} minutes?",
         "A printer prints {r} pages per minute. How many pages does it print in {h} minutes?")
_PERCENT = ("What is {p}% of {x}?",
            "A shop sells {x} shirts and {p}% of them are blue. How many shirts are blue?",
            "A class has {x} students and {p}% of them walk to school. How many students walk to school?")
_TWO_STEP = ("A bus drives at {r} km/h for {h} hours and then {e} km more. How many km does it drive in total?",
             ("Pens cost {r} dollars each. Sara buys {h} pens and pays with {e} dollars. How much change does she "
             "get in dollars?"))


def _speed(rng: random.Random) -> tuple[str, str, int]:
    i, t, v = rng.randrange(len(_SPEED)), rng.randint(2, 5), rng.randrange(10, 100, 10)
    return f"speed:{i}:{v * t}:{t}", _SPEED[i].format(d=v * t, t=t), v


def _price(rng: random.Random) -> tuple[str, str, int]:
    i, n, each = rng.randrange(len(_PRICE)), rng.randint(2, 6), rng.randint(2, 12)
    return f"price:{i}:{n}:{n * each}", _PRICE[i].format(n=n, c=n * each), each


def _rate(rng: random.Random) -> tuple[str, str, int]:
    i, r, h = rng.randrange(len(_RATE)), rng.randint(2, 12), rng.randint(2, 6)
    return f"rate:{i}:{r}:{h}", _RATE[i].format(r=r, h=h), r * h


def _percent(rng: random.Random) -> tuple[str, str, int]:
    i, p = rng.randrange(len(_PERCENT)), rng.choice((10, 25, 50))
    x = rng.randint(1, 10) * {10: 20, 25: 8, 50: 10}[p]  # 10 % of 20..200, 25 % of 8..80, 50 % of 10..100
    return f"percent:{i}:{p}:{x}", _PERCENT[i].format(p=p, x=x), p * x // 100


def _two_step(rng: random.Random) -> tuple[str, str, int]:
    i, h = rng.randrange(len(_TWO_STEP)), rng.randint(2, 4)
    if i == 0:
        r, e = rng.randrange(10, 70, 10), rng.randrange(5, 55, 5)
        return f"two:{i}:{r}:{h}:{e}", _TWO_STEP[i].format(r=r, h=h, e=e), r * h + e
    r = rng.randint(2, 9)
    e = (r * h // 10 + 1 + rng.randint(0, 2)) * 10  # a round note that covers the pens
    return f"two:{i}:{r}:{h}:{e}", _TWO_STEP[i].format(r=r, h=h, e=e), e - r * h


_MAKERS = {"speed": _speed, "price": _price, "rate": _rate, "percent": _percent, "two_step": _two_step}

_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)


def final_part(response: str) -> str:
    """The part of `response` that states its final answer (see the module docstring)."""
    text = response.replace("\u2212", "-").strip()
    boxed = _boxed_all(text)
    if boxed:
        return " ".join(boxed)
    marks = list(_ANSWER_IS.finditer(text))
    if marks:
        return text[marks[-1].end():].split("\n")[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last.rsplit("=", 1)[-1]


def _boxed_all(text: str) -> list[str]:
    out, start = [], 0
    while (i := text.find("\\boxed{", start)) >= 0:
        depth, j = 1, i + len("\\boxed{")
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out.append(text[i + len("\\boxed{"): j - 1] if depth == 0 else text[i + len("\\boxed{"):])
        start = j
    return out


def word_answer(response: str):
    """The final answer of `response` as an exact number (a Fraction), or None when its final part holds no
    number or several different ones (a hedge)."""
    if not isinstance(response, str):
        return None
    part = final_part(response[-4000:])
    values = {v for v in (to_fraction(m) for m in _NUMBER_RE.findall(part.replace("$", " "))) if v is not None}
    return values.pop() if len(values) == 1 else None


class WordTask:
    """Word problems of `kinds` (see the module docstring)."""

    name = "builtin:word"
    max_new_tokens = 128
    system_prompt = ("Solve the problem briefly. Example: A car drives 100 km in 2 hours. What is its speed in km/h? "
                     "100 / 2 = 50. The answer is 50.")

    def __init__(self, kinds: tuple[str, ...] = KINDS):
        unknown = [k for k in kinds if k not in _MAKERS]
        if unknown or not kinds:
            raise ValueError(f"unknown word-problem kinds {unknown}; use some of {', '.join(KINDS)}")
        self.kinds = tuple(kinds)

    def _make(self, rng: random.Random, kind: str | None = None) -> tuple[str, Problem]:
        kind = kind or rng.choice(self.kinds)
        key, prompt, answer = _MAKERS[kind](rng)
        return key, Problem(id=f"word-{key}", prompt=prompt, answer=str(answer))

    def train_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return sample_split(self._make, n, rng, heldout=False, salt="builtin:word", fraction=_HELDOUT_FRACTION)

    def heldout(self, n: int) -> list[Problem]:
        """Up to `n` distinct held-out problems, the kinds in turn (every bucket measured alike). The numbers are
        small (what a 135M model can compute), so each kind has a few dozen held-out problems: a larger `n` gets
        every one there is (84 in all)."""
        return heldout_by_kind(self._make, list(self.kinds), n, random.Random(_HELDOUT_SEED), salt="builtin:word",
                               fraction=_HELDOUT_FRACTION)

    def bucket(self, problem: Problem) -> str:
        return problem.id.removeprefix("word-").split(":")[0].replace("two", "two_step")

    def reward(self, response: str, answer: str) -> float:
        got = word_answer(response)
        return 1.0 if got is not None and got == to_fraction(str(answer)) else 0.0

    def reference_solution(self, problem: Problem) -> str:
        return f"The answer is {problem.answer}."

    def __repr__(self) -> str:
        return f"WordTask(kinds={self.kinds})"


class SpeedTask(WordTask):
    """`builtin:word-speed`: the speed kind alone (the seed's smoke question's family)."""

    name = "builtin:word-speed"

    def __init__(self):
        super().__init__(kinds=("speed",))
