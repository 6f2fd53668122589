"""`vapo_engine.serving.rows.RowText`: an answer growing token by token — stop strings (also split across
tokens, never partly emitted), EOS, the token budget, held-back partial characters. Torch-free, with a
character "tokenizer" (token id = code point) and one whose tokens decode to half a character."""
from __future__ import annotations

from vapo_engine.serving.rows import RowText, partial_stop_len

EOS = 0


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def feed(row: RowText, ids: list[int]) -> list[str]:
    out = []
    for i in ids:
        out.append(row.add(i))
        if row.done:
            break
    return out


def test_partial_stop_len():
    assert partial_stop_len("abc;", [";;"]) == 1 and partial_stop_len("abc", ["END"]) == 0
    assert partial_stop_len("xxEN", ["END", "N"]) == 2 and partial_stop_len("E", ["END"]) == 1


def test_eos_finishes_with_stop_and_counts_the_token():
    row = RowText(decode, [EOS], max_tokens=10)
    assert feed(row, chars("12;4") + [EOS, 55]) == ["1", "2", ";", "4", ""]
    assert (row.text, row.finish_reason, row.generated) == ("12;4", "stop", 5)
    assert row.add(60) == "" and row.generated == 5  # done rows ignore later (padding) tokens


def test_budget_finishes_with_length():
    row = RowText(decode, [EOS], max_tokens=3)
    feed(row, chars("abcdef"))
    assert (row.text, row.finish_reason, row.generated) == ("abc", "length", 3)


def test_stop_string_split_across_tokens_is_never_emitted():
    row = RowText(decode, [EOS], max_tokens=50, stops=["END"])
    deltas = feed(row, chars("ab ENx END tail"))
    assert "".join(deltas) == row.text == "ab ENx " and row.finish_reason == "stop"
    assert deltas[:5] == ["a", "b", " ", "", ""]  # "E", "N" held back until "x" shows they are not a stop
    assert deltas[5] == "ENx"


def test_held_back_text_is_released_at_the_end():
    row = RowText(decode, [EOS], max_tokens=4, stops=["END"])
    feed(row, chars("abEN"))
    assert (row.text, row.finish_reason) == ("abEN", "length")
    row = RowText(decode, [EOS], max_tokens=9, stops=["END"])
    feed(row, chars("abE") + [EOS])
    assert (row.text, row.finish_reason) == ("abE", "stop")


def test_half_characters_wait_for_the_rest():
    def bytes_decode(ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", "replace")
    row = RowText(bytes_decode, [999], max_tokens=10)
    deltas = feed(row, list("aé".encode()) + [999])
    assert deltas == ["a", "", "é", ""] and row.text == "aé"


def test_the_light_serving_modules_do_not_import_torch():
    """The CLI and the tools import these at module level (vapo_engine/serving/__init__.py)."""
    import subprocess
    import sys
    code = ("import sys\n"
            "import vapo_engine.serving.protocol, vapo_engine.serving.security, vapo_engine.serving.source\n"
            "import vapo_engine.serving.options, vapo_engine.serving.rows, vapo_engine.serving.app\n"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
