"""A loopback stand-in for the Hugging Face Hub serving each registered benchmark's source in its format.

    hub = FakeHub()          # a real HTTP server on 127.0.0.1 (a thread); point HF_ENDPOINT at hub.url
    hub.requests             # [(method, path)] it answered, to show that a second fetch asks nothing
    hub.set_file("math500", "test.jsonl", raw=b"...")    # a malformed or changed source
    hub.close()

It answers what `huggingface_hub.hf_hub_download` asks (read from the installed library): HEAD, then GET, on
`/datasets/{repo}/resolve/{revision}/{file}`, with `X-Repo-Commit`, `ETag` (plus `X-Linked-Etag` /
`X-Linked-Size` for the LFS-stored Parquet files, as the Hub sends) and `Content-Length`. A 404 carries the
Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) unless `plain_404` is set (a mirror).
`SOURCES` holds small synthetic rows in each repo's columns; `EXPECTED` what they convert to.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

from vapo_engine.tasks import BENCHMARKS

try:
    import pyarrow  # noqa: F401
    HAS_PYARROW = True
except ImportError:
    HAS_PYARROW = False

_GSM = [{"question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
         "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72.\n#### 72"},
        {"question": "A shop sells 1,000 pens a day for 1.234 days...",
         "answer": "1000*1.234=1234\n#### 1,234"}]
SOURCES: dict[str, dict[str, list[dict]]] = {
    "aime_2024": {"data/train-00000-of-00001.parquet": [
        {"id": 60, "problem": "Every morning Aya walks 9 km...", "solution": "... \\boxed{204}",
         "answer": "204", "url": "https://example.invalid/2024_I_1", "year": "2024"},
        {"id": 61, "problem": "Let ABC be a triangle...", "solution": "...", "answer": "113", "url": "u",
         "year": "2024"}]},
    "aime_2025": {"aime2025-I.jsonl": [{"question": "Find the sum of all bases b > 9...", "answer": "70"},
                                       {"question": "On triangle ABC...", "answer": "588"}],
                  "aime2025-II.jsonl": [{"question": "Six points lie on a line...", "answer": "468"}]},
    "math500": {"test.jsonl": [
        {"problem": "Convert (0,3) to polar coordinates.", "solution": "...",
         "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
         "unique_id": "test/precalculus/807.json"},
        {"problem": "Compute 2+2.", "solution": "4", "answer": "4", "subject": "Algebra", "level": 1,
         "unique_id": "test/algebra/1.json"}]},
    "gsm8k": {"main/test-00000-of-00001.parquet": _GSM},
    "gsm8k_train": {"main/train-00000-of-00001.parquet": _GSM[:1]},
}
EXPECTED = {
    "aime_2024": [("60", "Every morning Aya walks 9 km...", "204"),
                  ("61", "Let ABC be a triangle...", "113")],
    "aime_2025": [("aime_2025-1", "Find the sum of all bases b > 9...", "70"),
                  ("aime_2025-2", "On triangle ABC...", "588"),
                  ("aime_2025-3", "Six points lie on a line...", "468")],
    "math500": [("test/precalculus/807.json", "Convert (0,3) to polar coordinates.",
                 "\\left( 3, \\frac{\\pi}{2} \\right)"), ("test/algebra/1.json", "Compute 2+2.", "4")],
    "gsm8k": [("gsm8k-1", _GSM[0]["question"], "72"), ("gsm8k-2", _GSM[1]["question"], "1234")],
    "gsm8k_train": [("gsm8k_train-1", _GSM[0]["question"], "72")],
}


def encode(filename: str, rows: list[dict]) -> bytes:
    """A file in the repo's real format: JSON lines, or a Parquet table (placeholder bytes sans pyarrow)."""
    if not filename.endswith(".parquet"):
        return "".join(json.dumps(r) + "\n" for r in rows).encode()
    if not HAS_PYARROW:
        return b"PAR1 (pyarrow is not installed here)"
    import pyarrow as pa
    import pyarrow.parquet as pq
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


class FakeHub:
    """The Hub as `hf_hub_download` sees it, serving `files[(repo_id, revision, filename)]`."""

    def __init__(self) -> None:
        self.files = {(b.repo_id, b.revision, f): encode(f, rows)
                      for name, b in BENCHMARKS.items() for f, rows in SOURCES[name].items()}
        self.requests: list[tuple[str, str]] = []
        self.plain_404 = False
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def set_file(self, name: str, filename: str, rows: list | None = None, raw: bytes | None = None) -> None:
        b = BENCHMARKS[name]
        content = raw if raw is not None else encode(filename, rows or [])
        self.files[(b.repo_id, b.revision, filename)] = content

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append((h.command, h.path))
        m = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", unquote(h.path.split("?")[0]))
        repo, rev, name = m.groups() if m else ("", "", "")
        data = self.files.get((repo, rev, name))
        if data is None:
            return self._not_found(h, repo, rev)
        h.send_response(200)
        h.send_header("X-Repo-Commit", rev)
        if name.endswith(".parquet"):
            h.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _not_found(self, h: BaseHTTPRequestHandler, repo: str, rev: str) -> None:
        code = ("RepoNotFound" if not any(k[0] == repo for k in self.files) else
                "RevisionNotFound" if not any(k[:2] == (repo, rev) for k in self.files) else "EntryNotFound")
        h.send_response(404)
        if not self.plain_404:
            h.send_header("X-Error-Code", code)
            if code == "EntryNotFound":
                h.send_header("X-Repo-Commit", rev)
        h.send_header("Content-Length", "0")
        h.end_headers()
