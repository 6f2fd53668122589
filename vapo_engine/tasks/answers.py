"""Final-answer extraction and checking: exact for the built-in format, robust for JSONL (AIME-style) sets.

Built-in tasks end their response with `;<answer>` and are checked by exact string match. For user data
the checker takes the last `\\boxed{...}` (else the last number) from the response, tries a fast exact path
(normalised strings, then exact rational comparison of integers with thousands separators, decimals and
fractions), and only then falls back to `math_verify` (symbolic equivalence). Nothing here ever raises on
model output, however strange. This file does not know about tasks, prompts or rewards beyond 0/1 matching.
"""
from __future__ import annotations

import re
import threading
from fractions import Fraction

BUILTIN_ANSWER_MARK = ";"
"""Built-in responses end with `;<final answer>`; the answer is what follows the last mark."""

_MAX_CHECK_CHARS = 4000
"""Only the tail of a long response is handed to math_verify (its parser is slow on huge inputs)."""

_NUMBER_RE = re.compile(
    r"-?\d{1,3}(?:(?:,|\\,| |\u2009|\u202f)\d{3})+(?:\.\d+)?"  # 1,234,567 / 1\,234 / 1 234 groups
    r"|-?\d+(?:\.\d+)?(?:/\d+)?"  # 42, -3.5, 7/8
    r"|-?\.\d+"  # .5
)
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")
_GROUPED_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_builtin_answer(response: str) -> str | None:
    """The text after the last `;` in a built-in response, stripped; None when there is no mark."""
    if not isinstance(response, str) or BUILTIN_ANSWER_MARK not in response:
        return None
    return response.rsplit(BUILTIN_ANSWER_MARK, 1)[1].strip()


def builtin_answer_correct(response: str, answer: str) -> bool:
    """Exact check for built-in tasks: the final `;<answer>` must equal the gold answer string."""
    got = extract_builtin_answer(response)
    return got is not None and got == str(answer).strip()


def last_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, or None."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number-looking token in `text` (integers with separators, decimals, a/b), or None."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1] if matches else None


def extract_final_answer(text: str) -> str | None:
    """The candidate final answer: the last boxed expression, else the last number, else None."""
    if not isinstance(text, str):
        return None
    text = text.replace("\u2212", "-")  # unicode minus
    boxed = last_boxed(text)
    return boxed if boxed is not None else last_number(text)


def _strip_wrappers(s: str) -> str:
    s = s.replace("\u2212", "-").strip().strip("$").strip()
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    for junk in ("\\!", "\\,", "\u2009", "\u202f"):
        s = s.replace(junk, "")
    s = s.replace("{,}", ",")
    s = s.replace("\\left", "").replace("\\right", "")
    return s.rstrip(".").strip()


def normalize_answer(s: str) -> str:
    """Canonical string form: wrappers and spaces removed, thousands commas dropped."""
    s = _strip_wrappers(str(s)).replace(" ", "")
    if _GROUPED_RE.match(s):
        s = s.replace(",", "")
    return s


def to_fraction(s: str) -> Fraction | None:
    """Exact value of an integer / decimal / `a/b` / `\\frac{a}{b}` string, or None if it is not one."""
    s = normalize_answer(s)
    if not s or len(s) > 200:
        return None
    m = _FRAC_RE.match(s)
    try:
        if m:
            sign = -1 if m.group(1) else 1
            return sign * Fraction(int(m.group(2)), int(m.group(3)))
        if re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)(/\d+)?", s):
            num, _, den = s.partition("/")
            return Fraction(num) / (Fraction(den) if den else 1)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def fast_match(candidate: str, gold: str) -> bool | None:
    """True/False when decidable without math_verify (both numbers or identical strings), else None."""
    c, g = normalize_answer(candidate), normalize_answer(gold)
    if c == g and c:
        return True
    fc, fg = to_fraction(c), to_fraction(g)
    if fc is not None and fg is not None:
        return fc == fg
    return None


def _math_verify_match(response: str, gold: str) -> bool:
    """Symbolic check with math_verify; any error or timeout counts as wrong."""
    try:
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException
    except ImportError:  # pragma: no cover - math-verify is a declared dependency
        return False
    # math_verify's timeout uses signal.alarm, which only works on the main thread.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse(gold if "$" in gold or "\\" in gold else f"${gold}$", parsing_timeout=limit)
        pred_parsed = parse(response[-_MAX_CHECK_CHARS:], parsing_timeout=limit)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=limit))
    except (Exception, TimeoutException):  # noqa: BLE001 - model output must never crash the reward
        return False


def answers_match(response: str, gold: str) -> bool:
    """Robust check for user (JSONL) sets: boxed / last number, exact fast path, then math_verify."""
    if not isinstance(response, str) or gold is None:
        return False
    gold = str(gold)
    candidate = extract_final_answer(response)
    if candidate is not None:
        decided = fast_match(candidate, gold)
        if decided is not None:
            return decided
    return _math_verify_match(response, gold)
