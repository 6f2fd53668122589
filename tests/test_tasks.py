"""Built-in tasks, answer checking and the JSONL loader (torch-free, fast)."""
from __future__ import annotations

import json
import random

import pytest

from vapo_engine.tasks import (
    AdditionTask,
    JsonlTask,
    MultistepTask,
    Problem,
    Task,
    TaskError,
    answers_match,
    builtin_task_names,
    get_task,
)
from vapo_engine.tasks.answers import extract_builtin_answer, extract_final_answer, last_boxed
from vapo_engine.tasks.arithmetic import carry_chain, eval_steps

BUILTINS = ["builtin:addition", "builtin:multistep"]


@pytest.mark.parametrize("spec", BUILTINS)
def test_builtin_task_is_deterministic_and_protocol_conformant(spec, tmp_path):
    task = get_task(spec, tmp_path)
    assert isinstance(task, Task) and task.name == spec
    assert task.train_batch(50, random.Random(7)) == task.train_batch(50, random.Random(7))
    assert task.train_batch(50, random.Random(7)) != task.train_batch(50, random.Random(8))
    assert task.heldout(100) == get_task(spec, tmp_path).heldout(100)
    assert task.heldout(30) == task.heldout(100)[:30]
    assert len({p.id for p in task.heldout(200)}) == 200


@pytest.mark.parametrize("spec", BUILTINS)
def test_train_and_heldout_never_overlap(spec):
    task = get_task(spec)
    held = {p.prompt for p in task.heldout(300)}
    rng = random.Random(0)
    for _ in range(20):
        assert not held & {p.prompt for p in task.train_batch(500, rng)}


def test_addition_split_treats_commuted_operands_as_the_same_problem():
    task = AdditionTask()
    held = {frozenset(p.prompt[:-1].split("+")) for p in task.heldout(300)}
    train = {frozenset(p.prompt[:-1].split("+")) for p in task.train_batch(5000, random.Random(1))}
    assert not held & train


@pytest.mark.parametrize("spec", BUILTINS)
def test_reference_solutions_are_correct_short_and_rewarded(spec):
    task = get_task(spec)
    for p in task.train_batch(500, random.Random(3)) + task.heldout(100):
        ref = task.reference_solution(p)
        assert task.reward(ref, p.answer) == 1.0
        assert len(ref) + 1 <= task.max_new_tokens  # + EOS
        a, op, b = p.prompt[:-1].partition("+") if spec.endswith("addition") else (p.prompt[:-1], "", "")
        assert int(p.answer) == (int(a) + int(b) if op else eval(a))  # only the first op may be '*'
        assert set(ref) <= set("0123456789+-*=,;")


def test_addition_format_example():
    task = AdditionTask()
    p = Problem(id="x", prompt="0047+0385=", answer="432")
    assert task.reference_solution(p) == "7+5+0=2,4+8+1=3,0+3+1=4,0+0+0=0;432"
    assert AdditionTask(fixed_steps=False).reference_solution(p) == "7+5+0=2,4+8+1=3,0+3+1=4;432"
    assert carry_chain(9999, 9999) == "9+9+0=8,9+9+1=9,9+9+1=9,9+9+1=9"
    assert task.reference_solution(Problem("y", "9999+9999=", "19998")).endswith(";19998")
    assert max(len(task.reference_solution(p)) for p in task.train_batch(2000, random.Random(0))) <= 39
    for p in task.train_batch(200, random.Random(5)):
        a, b = p.prompt[:-1].split("+")
        assert len(a) == len(b) == 4 and int(a) + int(b) == int(p.answer) and int(a) >= 10 and int(b) >= 10


def test_multistep_evaluates_left_to_right_and_has_longer_responses():
    steps, value = eval_steps("23*7+45-18=")
    assert steps == ["23*7=161", "161+45=206", "206-18=188"] and value == 188
    def lengths(task):
        return [len(task.reference_solution(p)) for p in task.train_batch(500, random.Random(0))]
    add, multi = lengths(AdditionTask()), lengths(MultistepTask())
    assert sum(multi) / len(multi) > sum(add) / len(add) and max(multi) > max(add) + 10
    assert max(multi) - min(multi) >= 25  # lengths vary widely: length-adaptive GAE has something to adapt to
    with pytest.raises(ValueError):
        eval_steps("2+=")


def test_builtin_reward_is_exact_and_never_raises():
    task = AdditionTask()
    assert task.reward("7+5+0=2;432", "432") == 1.0
    assert task.reward("anything;432 ", "432") == 1.0
    assert task.reward("7+5+0=2;0432", "432") == 0.0
    assert task.reward("432", "432") == 0.0  # no answer mark
    assert task.reward(";433", "432") == 0.0
    for junk in ["", ";", ";;;", "\x00\n", "é" * 1000, None]:
        assert task.reward(junk, "432") == 0.0
    assert extract_builtin_answer("1;2;3") == "3"


@pytest.mark.parametrize("response,gold,expected", [
    ("so the answer is \\boxed{\\frac{1}{2}}", "1/2", True),
    ("\\boxed{\\dfrac{7}{8}}", "0.875", True),
    ("I get 7/8", "\\frac{7}{8}", True),
    ("the total is 1,234,567 dollars", "1234567", True),
    ("answer: 1 234", "1234", True),
    ("$1\\,000$", "1000", True),
    ("3.50", "3.5", True),
    ("\u22125", "-5", True),
    ("The speed is 80 km/h.", "80", True),
    ("\\boxed{12} and later 13", "12", True),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", True),
    ("\\boxed{2^{10}}", "1024", True),
    ("\\boxed{81}", "80", False),
    ("no numbers here", "80", False),
    ("}}}{\\boxed{", "1", False),
    ("\\boxed{", "1", False),
    ("", "0", False),
    ("9" * 5000, "9", False),
    ("\\frac{1}{0}", "1", False),
])
def test_robust_checker(response, gold, expected):
    assert answers_match(response, gold) is expected


def test_checker_helpers_and_garbage():
    assert last_boxed("a \\boxed{x{y}z} b \\boxed{2}") == "2"
    assert last_boxed("\\boxed{x{y}z}") == "x{y}z"
    assert extract_final_answer("abc") is None
    assert extract_final_answer(None) is None
    assert answers_match(None, "1") is False
    assert answers_match("1", None) is False
    rng = random.Random(0)
    alphabet = "\\{}$^_0123456789/.,-+ boxedfrac()"
    for _ in range(200):
        answers_match("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))), "12")


# ------------------------------------------------------------------------------------------------ JSONL


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_task_loads_samples_and_checks(tmp_path):
    rows = [{"problem": f"What is {i}*2?", "answer": i * 2} for i in range(10)]
    rows[3]["id"] = "custom"
    lines = [json.dumps(r) for r in rows]
    _write(tmp_path / "toy.jsonl", [*lines[:5], "", *lines[5:]])
    task = get_task("toy", tmp_path)
    assert isinstance(task, JsonlTask) and task.name == "toy" and len(task) == 10
    assert [p.prompt for p in task.heldout(3)] == [r["problem"] for r in rows[:3]]
    assert task.heldout(50) == task.problems
    assert task.problems[3].id == "custom" and task.problems[0].id == "toy-1"
    assert task.problems[4].answer == "8"
    assert task.train_batch(5, random.Random(1)) == task.train_batch(5, random.Random(1))
    assert len(task.train_batch(25, random.Random(1))) == 25
    assert task.reward("... so \\boxed{8}", "8") == 1.0 and task.reward("7", "8") == 0.0
    assert get_task(str(tmp_path / "toy.jsonl"), "/nonexistent").problems == task.problems
    assert get_task("toy.jsonl", tmp_path).problems == task.problems
    with pytest.raises(TaskError, match="no reference solutions"):
        task.reference_solution(task.problems[0])


def test_missing_file_says_where_to_put_it(tmp_path):
    with pytest.raises(TaskError) as e:
        get_task("my_set", tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "my_set.jsonl") in msg and "<data_dir>/<name>.jsonl" in msg
    assert "nothing is downloaded" in msg and "builtin:addition" in msg and "aime_2024" in msg
    with pytest.raises(TaskError) as e:  # a registered benchmark is fetched, but tests run offline (conftest)
        get_task("aime_2024", tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "aime_2024.jsonl") in msg and "vapo-mcp data fetch aime_2024" in msg
    with pytest.raises(TaskError, match="did you mean 'builtin:addition'"):
        get_task("addition", tmp_path)
    with pytest.raises(TaskError, match="missing.jsonl"):
        get_task(str(tmp_path / "missing.jsonl"), tmp_path)


@pytest.mark.parametrize("lines,line_no,fragment", [
    (['{"problem": "a", "answer": 1}', '{"problem": "b", "answer": }'], 2, "invalid JSON"),
    (['{"problem": "a", "answer": 1}', "", '{"answer": 2}'], 3, "'problem' is missing"),
    (['{"problem": "a"}'], 1, "'answer' is missing"),
    (['{"problem": "  ", "answer": 1}'], 1, "'problem' is empty"),
    (['{"problem": "a", "answer": ""}'], 1, "'answer' is empty"),
    (['{"problem": "a", "answer": true}'], 1, "'answer' is empty"),
    (['["problem", "answer"]'], 1, "expected a JSON object"),
])
def test_jsonl_errors_name_file_line_and_fix(tmp_path, lines, line_no, fragment):
    path = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(TaskError) as e:
        get_task("bad", tmp_path)
    msg = str(e.value)
    assert f"{path}:{line_no}:" in msg and fragment in msg and "Fix:" in msg
    assert isinstance(e.value, ValueError)


def test_empty_jsonl_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n \n")
    with pytest.raises(TaskError, match=r"empty\.jsonl: the file has no problems\. Fix:"):
        get_task("empty", tmp_path)


def test_unknown_builtin_lists_valid_names(tmp_path):
    with pytest.raises(TaskError) as e:
        get_task("builtin:nope", tmp_path)
    assert all(name in str(e.value) for name in builtin_task_names())
    with pytest.raises(TaskError):
        get_task("  ", tmp_path)


# ---------------------------------------------------------------------------------------- builtin:chain


def test_chain_reference_solutions_are_correct_and_lengths_vary_tenfold():
    import random

    from vapo_engine.tasks import get_task
    task = get_task("builtin:chain")
    probs = task.train_batch(300, random.Random(1))
    lengths = []
    for p in probs:
        sol = task.solve(p.prompt)
        assert task.reward(sol, p.answer) == 1.0 and task.reward(sol[:-1] + "x", p.answer) == 0.0
        lines = sol.split("\n")[:-1]
        assert len(lines) == task.steps_of(p.prompt) and all(len(x) == 9 for x in lines)  # fixed-width lines
        lengths.append(len(sol) + 1)  # + EOS, one token per character with the built-in tokenizer
    assert min(lengths) <= 15 and max(lengths) >= 140 and max(lengths) / min(lengths) >= 10
    assert max(lengths) <= task.max_new_tokens


def test_chain_heldout_covers_every_step_count_and_never_meets_training():
    import random

    from vapo_engine.tasks import get_task
    task = get_task("builtin:chain")
    held = task.heldout(60)
    assert len({p.prompt for p in held}) == 60
    counts = [task.steps_of(p.prompt) for p in held]
    assert {c: counts.count(c) for c in set(counts)} == {c: 5 if c <= 4 else 4 for c in range(1, 15)}
    assert {task.bucket(p) for p in held} == {"short", "mid", "long"}
    train = {p.prompt for p in task.train_batch(3000, random.Random(2))}
    assert not train & {p.prompt for p in held}


def test_chain_warm_start_draw_is_mostly_short_and_steps_are_locally_checkable():
    import random

    from vapo_engine.tasks import get_task
    task = get_task("builtin:chain")
    draw = task.sft_batch(600, random.Random(3))
    share = sum(task.bucket(p) == "short" for p in draw) / len(draw)
    assert 0.5 < share < 0.7 and any(task.bucket(p) == "long" for p in draw)
    p = draw[0]
    sol = task.solve(p.prompt)
    assert task.on_path(p.prompt, sol[:12]) and not task.on_path(p.prompt, sol[:2] + ("0" if sol[2] != "0" else "1"))
