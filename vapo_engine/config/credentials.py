"""Credential-shaped text, found in time linear in the input: the finders behind `redact_tokens`, `scrub` and
`strip_url_credentials` (docs/design.md §7: scrubbing, like every parser of untrusted text, is linear and bounded).

A regex such as `sk-(?:[a-z0-9]+-)*[a-z0-9]{12,}` is retried at each of the 350,000 starts of `"sk-"*350000`,
and each try scans to the end before it fails: minutes for 1 MB (docs/security.md "What holds for every caller"). Here a search only looks for
where a match *starts* (a pattern that decides that within `reach` characters), and the match's extent is
then read once with a possessive run; whatever a match needs to know about the rest of its run (a key's last
long segment, a digit in a value, the `@` after a password) is decided from that one read, never by retrying
the next start. Searches go one window of `SCAN_WINDOW` characters at a time (`scan`): a call into the regex
engine holds the GIL, so a server scrubbing a megabyte in a worker thread still answers /health at once.

| finder                | finds                                                                       |
|-----------------------|-----------------------------------------------------------------------------|
| `known_prefix_spans`  | `sk-…`/`sk_…`/`ak-…`/`r8_…`/`glpat-…` up to the last segment of 12+ letters and digits; `hf_…`, `AIza…`, `ghp_…`, `github_pat_…`, `xoxb-…`, `AKIA…` |
| `named_value_spans`   | the value of `api_key=…`, `"password": "…"`, `x-api-key: …` (8+ characters, one a digit) |
| `bearer_value_spans`  | the credential after `Bearer `                                              |
| `url_userinfo_spans`  | `user:pass` of `scheme://user:pass@host`                                    |
| `bare_userinfo_spans` | `user:pass` of `user:pass@host` at the start of a word (a network host)     |

Spans are `(start, end)`, ordered and non-overlapping. Whitespace runs inside a match (around `:`/`=` after a
credential name, after `Bearer`, in `API key   provided`) count up to `MAX_GAP` characters.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator

Span = tuple[int, int]
MAX_SCAN_CHARS = 2_000_000
"""The most text one call scrubs (2 M characters, a second or two at worst); beyond it, text is dropped."""
SCAN_WINDOW = 16_384
"""Characters one regex search may scan at most (plus the pattern's reach): bounds how long it holds the GIL."""
MAX_GAP = 64

_CHAIN_START = re.compile(r"(?<![A-Za-z0-9])(?:sk|gsk|xai|pk|rk|ak|csk|nvapi|glpat|r8)[-_][A-Za-z0-9]")
_CHAIN = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")
"""The chain of letter/digit segments after a key prefix (read once, from the start's end)."""
_LONG_SEGMENT = re.compile(r"[A-Za-z0-9]{12}")
_FIXED = re.compile(r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_\-]{30,}|gh[pousr]_[A-Za-z0-9]{20,}|"
                    r"github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})")

CREDENTIAL_NAMES = (rf"(?:x-)?(?:api[ _-]?key|api[_-]?token|apikey)(?:\s{{1,{MAX_GAP}}}provided)?|"
                    r"access[_-]?(?:key|token)(?:[_-]?id)?|secret(?:[_-]?(?:access[_-]?)?key)?|private[_-]?key|"
                    r"client[_-]?secret|key|password|passwd|pwd|(?:auth|refresh|id|session|bearer)[_-]?token|"
                    r"token|authorization|credentials?")
_GAP = rf"\s{{0,{MAX_GAP}}}"
_NAME_SEP = re.compile(rf"(?<![a-z0-9_])(?:{CREDENTIAL_NAMES})(?![a-z0-9_])[\"']?{_GAP}[:=]{_GAP}[\"']?"
                       rf"(?:(?:basic|bearer|token|apikey|key)\s{{1,{MAX_GAP}}})?")
"""A credential name and its separator, matched on the text lower-cased (ASCII letters only)."""
_NAME_REACH = 100 + 4 * MAX_GAP
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_VALUE_RUN = re.compile(r"[A-Za-z0-9_\-.~+/%=]+")
_DIGIT = re.compile(r"[0-9]")
MIN_VALUE = 8
"""A named credential value: 8+ characters of `_VALUE_RUN`, at least one a digit (`os.environ` stays readable)."""

_BEARER = re.compile(rf"(?i)bearer\s{{1,{MAX_GAP}}}([^\s\"',;}}]{{6,}})")

_URL_AT = re.compile(r"://((?:[^/\s?#@]*@)+)")
"""`://` and the authority up to its last `@` (no `@`: no match)."""
_SPACE = re.compile(r"\s")
_SCHEME_RUN = re.compile(r"[A-Za-z0-9+.\-]*")
_INNER_SCHEME = re.compile(r"(?<=[+.\-])[A-Za-z]")
_WORD = re.compile(r"\w")

_AT_REVERSED = re.compile(r"@(?<=[A-Za-z0-9.\-]@)(?:(?=[^\s/@'\"]*(?:[\s'\"]|\Z))|(?=[^\s/@'\"(<=]*[(<=]))")
"""On the reversed text: an `@` before a host whose password run starts a word or holds `(`, `<` or `=`."""
_RUN_END = re.compile(r"[\s/'\"]")
_PASSWORD_RUN = re.compile(r"[^\s/@'\"]*")
_USER = re.compile(r"[A-Za-z0-9._~%!$&*+,;\-]+")
_INNER_START = re.compile(r"[(<=]")
_HOST_RUN = re.compile(r"[A-Za-z0-9.\-]*")


def scan(pattern: re.Pattern, text: str, pos: int = 0, stop: int | None = None, *, reach: int,
         cut: re.Pattern | None = None) -> Iterator[re.Match]:
    """`pattern.finditer(text, pos, stop)`, one window at a time. Whether a match starts at s must be decided by
    text[s:s+reach] (a longer match is read again without the window's end); or, with `cut`, no match (nor
    what it looks ahead at) contains a character of `cut`, and windows end just after one (a window may then
    be longer, so such a pattern should start with a literal, which the regex engine finds fast)."""
    stop = len(text) if stop is None else stop
    cut_end = -1  # just after the first `cut` character at or after the last window's end (searched once)
    while pos < stop:
        end = min(stop, pos + SCAN_WINDOW)
        if cut is not None and end < stop:
            if cut_end < end:
                c = cut.search(text, end - 1, stop)
                cut_end = c.end() if c else stop
            end = cut_end
        limit = end if cut is not None else min(stop, end + reach)
        m = pattern.search(text, pos, limit)
        if m is None or m.start() >= end:
            pos = end
            continue
        if m.end() == limit < stop:
            m = pattern.match(text, m.start(), stop)
        yield m
        pos = max(m.end(), m.start() + 1)


def known_prefix_spans(text: str) -> list[Span]:
    """Credentials recognisable by their prefix: a chain `sk-a-b-…` ends at its last segment of 12+ letters
    and digits (none: not a key, and neither is any chain inside it); the fixed-shape ones as they are."""
    chains, rev, pos = [], None, 0
    for m in scan(_CHAIN_START, text, reach=8):
        if m.start() < pos:
            continue
        pos = _CHAIN.match(text, m.end() - 1).end()
        rev = text[::-1] if rev is None else rev  # the first 12 letters/digits read backwards end the last long segment
        last = next(scan(_LONG_SEGMENT, rev, len(text) - pos, len(text) - m.end() + 1, reach=12), None)
        if last is not None:
            chains.append((m.start(), len(text) - last.start()))
    return merge(chains, [m.span() for m in scan(_FIXED, text, reach=48)])


def has_known_prefix(text: str) -> bool:
    return len(text) >= 15 and bool(known_prefix_spans(text))


def named_value_spans(text: str) -> list[Span]:
    """Values after a credential name (`api_key=`, `"token": "`, `x-api-key: `, `API key provided: `)."""
    low = text.translate(_ASCII_LOWER)  # same length; lets the name pattern be a plain (fast) one
    out: list[Span] = []
    dead = (-1, -1)  # a value run that failed (no digit, or short): every later start inside it fails too
    done = 0
    for m in scan(_NAME_SEP, low, reach=_NAME_REACH):
        p = m.end()
        if m.start() < done or dead[0] <= p < dead[1]:
            continue
        v = _VALUE_RUN.match(text, p)
        e = v.end() if v else p
        if e - p >= MIN_VALUE and next(scan(_DIGIT, text, p, e, reach=1), None):
            out.append((p, e))
            done = e
        else:
            dead = (p, e)
    return out


def bearer_value_spans(text: str) -> list[Span]:
    """The value after `Bearer`, unless it is a short plain word ("a bearer token: …" in prose is not a
    credential: a token has digits or symbols, or is long)."""
    return [m.span(1) for m in scan(_BEARER, text, reach=16 + MAX_GAP) if not _prose(m.group(1))]


def _prose(value: str) -> bool:
    word = value.rstrip(":.")
    return len(word) < 16 and word.isascii() and word.isalpha()


def url_userinfo_spans(text: str) -> list[Span]:
    """The `user[:password]` part of `scheme://user[:password]@…` (up to the last `@` before the path)."""
    out, rev = [], None
    for m in scan(_URL_AT, text, reach=0, cut=_SPACE):
        if m.end() - m.start(1) < 2:
            continue
        rev = text[::-1] if rev is None else rev
        n, q = len(text), m.start()
        run_start = q - (_SCHEME_RUN.match(rev, n - q).end() - (n - q))
        if _scheme_starts(text, run_start, text[run_start:q]):
            out.append((m.start(1), m.end() - 1))
    return out


def _scheme_starts(text: str, start: int, run: str) -> bool:
    """Whether a URL scheme (a letter at a word start, then letters, digits, `+.-`) ends this run."""
    if run[:1].isalpha() and (start == 0 or not _WORD.match(text, start - 1)):
        return True
    return _INNER_SCHEME.search(run, 1) is not None


def bare_userinfo_spans(text: str) -> list[Span]:
    """`user:password` before `@host`, pasted without a scheme, at the start of a word (after a space, a quote,
    `(`, `<` or `=`), where the host is a network host (`_network_host`): `builtin:chain@v9` is a model's
    name, not a credential."""
    n, rev, out = len(text), text[::-1], []
    for m in scan(_AT_REVERSED, rev, reach=0, cut=_RUN_END):
        at = n - 1 - m.start()
        if not _network_host(text, at + 1):
            continue
        a = at - (_PASSWORD_RUN.match(rev, m.end()).end() - m.end())
        if (a == 0 or text[a - 1] not in "/@") and _userinfo_at(text, a, at):
            out.append((a, at))
            continue
        for c in _INNER_START.finditer(text, a, at):
            if _userinfo_at(text, c.end(), at):
                out.append((c.end(), at))
                break
    return out[::-1]


def _network_host(text: str, start: int) -> bool:
    """Whether the host that starts at text[start] is one a connection string names: followed by a port
    (`:5432`) or a path (`/`), `localhost`, an IPv4 address, or a dotted name whose last label has a letter
    (`db.local`, `gw.example.com`). A name with a version or a tag after `@` (`v9`, `planted-stop`, `v1.2`) is
    not. Reads the host's run once (it holds no `@`, so the runs of successive `@`s do not overlap)."""
    end = _HOST_RUN.match(text, start).end()
    host, after = text[start:end].strip("."), text[end:end + 2]
    if after[:1] == "/" or (after[:1] == ":" and after[1:2].isdigit()) or host.lower() == "localhost":
        return True
    labels = host.split(".")
    if len(labels) < 2:
        return False
    return any(c.isalpha() for c in labels[-1]) or (len(labels) == 4 and all(x.isdigit() for x in labels))


def _userinfo_at(text: str, s: int, at: int) -> bool:
    """`user:password` fills text[s:at] (a user name, a colon, a password of one character or more)."""
    u = _USER.match(text, s, at)
    return u is not None and u.end() + 1 < at and text[u.end()] == ":"


def merge(*groups: list[Span]) -> list[Span]:
    """Spans of several finders as one ordered list; overlapping ones become one span."""
    out: list[list[int]] = []
    for s, e in sorted(span for g in groups for span in g):
        if out and s < out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def replace_spans(text: str, spans: list[Span], fn: Callable[[str], str]) -> str:
    """`text` with each span replaced by `fn(the span's text)` (spans ordered and non-overlapping)."""
    if not spans:
        return text
    parts, last = [], 0
    for s, e in spans:
        parts += [text[last:s], fn(text[s:e])]
        last = e
    parts.append(text[last:])
    return "".join(parts)


def bounded(text: str) -> str:
    """At most `MAX_SCAN_CHARS` characters: the rest is dropped (with a marker), never passed on unscrubbed."""
    if len(text) <= MAX_SCAN_CHARS:
        return text
    return text[:MAX_SCAN_CHARS] + f" …[{len(text) - MAX_SCAN_CHARS} more characters dropped unread]"
