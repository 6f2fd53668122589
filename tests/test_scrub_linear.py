"""The scrubber cannot be stalled (docs/security.md "What holds for every caller"): on adversarial text — every start of a
credential-shaped pattern a near miss — its CPU grows linearly (a megabyte costs at most 8× a quarter of it; the
quadratic patterns it replaced cost 16×, 4 s for 24 kB of "sk-" and about 20 minutes for 200 kB) and a megabyte
stays within a budget no quadratic pattern meets on any host (5 s; 0.4–0.9 s measured on a quiet 2-core host,
so a fixed "under a second" failed on a slow or busy one), no call into the regex engine scans much more
than a window (it holds the GIL), input beyond the size bound is dropped, never passed on unscrubbed, and
what is redacted is what the former patterns redacted."""
from __future__ import annotations

import re
import time

import pytest

from vapo_engine.config import credentials
from vapo_engine.config.secrets import looks_like_secret, redact_tokens, strip_url_credentials
from vapo_engine.providers.redaction import safe_text, scrub

KEY = "sk-proj-9Qx7Lm2Pz8Rt4Vw6Yb3NcK5JaaBBcc"
MB = 1_000_000
ISSUE_VARIANTS = ["sk-", "sk_", "ak-", "r8_", "glpat-", "key=", "password="]
"""The issue's reproduction ("sk-"*350000) and each variant it names."""
OTHER_NEAR_MISSES = ["a.", "=a:", "a:b@", "https://a@", "bearer ", "api_key: "]
"""Near misses of the URL-credential, bare `user:pass@`, bearer and credential-name patterns."""


def _cpu(fn, *args) -> float:
    t = time.thread_time()
    fn(*args)
    return time.thread_time() - t


def _linear(fn, piece: str, size: int, budget: float) -> None:
    """`fn(text)` on `size` characters of `piece` repeated costs at most `budget` s of this thread's CPU and at
    most 8× what a quarter of that text costs (linear work: 4×; quadratic: 16×). The ratio is measured within one
    call, so it holds on a slow or busy host; the budget is far below what a quadratic pattern takes."""
    quarter, full = (piece * (n // len(piece) + 1) for n in (size // 4, size))
    small, big = _cpu(fn, quarter), _cpu(fn, full)
    assert big < budget, f"{big:.2f} s of CPU for {size} characters of {piece!r} (budget {budget} s)"
    assert big < 8 * max(small, 0.01), f"{big:.3f} s for {size} characters of {piece!r} against {small:.3f} s " \
                                       f"for a quarter: not linear"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("piece", ISSUE_VARIANTS + OTHER_NEAR_MISSES)
def test_a_megabyte_of_near_misses_scrubs_in_linear_time(piece):
    _linear(lambda text: scrub(text, [KEY]), piece, MB, budget=5.0)
    _linear(redact_tokens, piece, MB, budget=5.0)


def test_secrets_inside_a_megabyte_of_near_misses_are_still_found():
    pasted = "sk-abcdefghijklmnopqrstu0123"
    text = "sk-" * 200_000 + KEY + " api_key=" * 1000 + "api_key=" + "A1b2" * 4 + " https://u:pw123@h " + pasted
    out = scrub(text, [KEY])
    assert KEY not in out and "A1b2A1b2A1b2A1b2" not in out and "pw123" not in out and pasted not in out
    assert out.endswith("https://u:***@h sk-…0123 (len 28)")


def test_no_regex_call_scans_much_more_than_a_window():
    """Every search of the finders goes through `credentials.scan` (its windows bound a call); the runs read
    afterwards are plain character-class loops."""
    seen = []
    real_search = re.Pattern.search

    class Spy:
        def __init__(self, pattern):
            self.pattern = pattern

        def search(self, text, pos=0, endpos=None):
            endpos = len(text) if endpos is None else endpos
            seen.append(endpos - pos)
            return real_search(self.pattern, text, pos, endpos)

        def __getattr__(self, name):
            return getattr(self.pattern, name)

    patterns = {n: p for n, p in vars(credentials).items() if isinstance(p, re.Pattern)}
    try:
        for name, p in patterns.items():
            setattr(credentials, name, Spy(p))
        for piece in ("sk-", "x", "key=", "a:b@"):
            text = piece * (MB // len(piece))
            credentials.known_prefix_spans(text)
            credentials.named_value_spans(text)
            credentials.bearer_value_spans(text)
    finally:
        for name, p in patterns.items():
            setattr(credentials, name, p)
    assert seen and max(seen) <= credentials.SCAN_WINDOW + 512


def test_input_beyond_the_bound_is_dropped_not_passed_on():
    huge = "x" * credentials.MAX_SCAN_CHARS + KEY * 10
    out = scrub(huge, [KEY])
    assert KEY not in out and "more characters dropped unread" in out
    assert len(out) < credentials.MAX_SCAN_CHARS + 100
    assert KEY not in redact_tokens(huge)


def test_safe_text_reads_only_what_it_can_show():
    short, long = _cpu(safe_text, "sk-" * 20_000 + KEY, 300), _cpu(safe_text, "sk-" * 2_000_000 + KEY, 300)
    assert long < 0.2 and long < 10 * max(short, 0.005)  # 100× the text, about the same work (~1 ms measured)
    shown = safe_text("x" * 290 + KEY + "y" * 5000, 300, [KEY])
    assert KEY[:12] not in shown and shown.endswith("chars cut]")


@pytest.mark.parametrize("text, expected", [
    ("token: sk-abcdefghijklmnop0123", "token: sk-…0123 (len 23)"),
    ("sk-a-b-c-abcdefghijklmn-x-y", "sk-…klmn (len 23)-x-y"),
    ("sk-a-b-c-d-e-f-g", "sk-a-b-c-d-e-f-g"),
    ("key=abcdefgh-token: 12345678", "key=abcdefgh-token: …78 (len 8)"),
    ("Authorization: Bearer abc123def456ghi", "Authorization: Bearer …hi (len 15)"),
    ("see https://bob:s3cret@example.com/x", "see https://bob:***@example.com/x"),
    ("(bob:hunter2@db.local)", "(bob:***@db.local)"),
    ("https://x.com/a?b=1 https://AKIAABCDEFGHIJKLMNOP@h", "https://x.com/a?b=1 https://AKI…MNOP (len 20)@h"),
    ("xoxb-1234567890-abcdef", "xox…cdef (len 22)"),
])
def test_what_is_redacted(text, expected):
    """The outputs of the former (quadratic) patterns on these inputs."""
    assert redact_tokens(scrub(text)) == expected


def test_the_url_and_heuristic_helpers_are_unchanged_on_ordinary_text():
    assert strip_url_credentials("https://user:pa55@host:8080/v1") == "https://user:***@host:8080/v1"
    assert strip_url_credentials("mailto:me@x.org, ssh://git@host/repo") == "mailto:***@x.org, ssh://***@host/repo"
    assert looks_like_secret("sk-abcdefghijklmnop") and not looks_like_secret("experiment20240315")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("piece", ["<title>", "<h1>", "<", "\n", " \n"])
def test_other_parsers_of_untrusted_text_are_linear(piece):
    """An HTML error page with thousands of unclosed `<title>`s and a log of blank lines took seconds per
    40 kB (the lazy `<title>(.*?)</title>` and `^\\s*` retried at each start); now linear, 200 kB in about 0.5 s
    of CPU for diagnose_error on a quiet 2-core host (budget 4 s)."""
    from tools.diagnose import diagnose_error
    from vapo_engine.providers.errorbody import parse_error_body
    _linear(parse_error_body, piece, 200_000, budget=4.0)
    _linear(lambda text: diagnose_error(text=text, body=text, status=400), piece, 200_000, budget=4.0)


def test_a_deeply_nested_error_body_is_text_not_a_crash():
    from tools.diagnose import diagnose_error
    from vapo_engine.providers.errorbody import parse_error_body
    assert parse_error_body("[" * 100_000).shape == "text"
    assert diagnose_error(body="[" * 100_000, status=400).findings
