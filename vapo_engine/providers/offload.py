"""Scrubbing a large server response away from the event loop that received it (docs/security.md "What holds for every caller").

A megabyte of text takes up to a second of CPU to scrub (linear: `vapo_engine.config.credentials`). Done on
the event loop, that stalls every other request of the MCP server — /health included — for as long; done in
a thread it still can, because each regex call holds the GIL and a busy machine deschedules the thread while
it holds it. So a job on `OFFLOAD_CHARS` or more runs in a short-lived helper process,
`python -c HELPER` (→ `main`), that reads the job as JSON on stdin and writes the result as JSON on
stdout (JSON both ways: nothing is ever unpickled); at most `MAX_HELPERS` run at once, each at a lower CPU
priority than the server (`HELPER_NICE`), so on a busy machine the server's loop is scheduled first. Smaller
inputs cost less than starting a process and run inline. If a helper fails, the job runs in a thread: slower to answer,
never wrong. The key goes to the helper over its stdin pipe — this process's own key, to its own child,
never written to a file, an argument or the environment.

Jobs (`JOBS`) take and return JSON-compatible values:
  decode_body(text, secrets) → ["json", data scrubbed] | ["error", ErrorInfo as a dict] | ["not_json", null]
  scrub_pair(a, b, secrets)  → [scrub(a), scrub(b)]
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

from vapo_engine.childenv import child_env

OFFLOAD_CHARS = 64 * 1024
MAX_HELPERS = 2
HELPER_NICE = 10
log = logging.getLogger("vapo_engine.providers")
_slots: dict[int, asyncio.Semaphore] = {}


def decode_body(text: str, secrets=()) -> tuple[str, Any]:
    """A 2xx body as ("json", its data with every string scrubbed), ("error", the `ErrorInfo` of an error
    payload) or ("not_json", None)."""
    from .errorbody import is_error_payload, parse_error_body
    from .redaction import scrub_obj
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return "not_json", None
    if is_error_payload(data):
        return "error", parse_error_body(data, secrets)
    return "json", scrub_obj(data, secrets)


def _decode_body(text: str, secrets: list[str]) -> list:
    kind, value = decode_body(text, secrets)
    return [kind, value.model_dump(mode="json") if kind == "error" and value is not None else value]


def _scrub_pair(a: str, b: str, secrets: list[str]) -> list[str]:
    from .redaction import scrub
    return [scrub(a, secrets), scrub(b, secrets)]


JOBS = {"decode_body": _decode_body, "scrub_pair": _scrub_pair}


def plain(secrets) -> list[str]:
    """Secrets as the strings a job takes (`Secret`s revealed: they cross to the helper over its stdin)."""
    from vapo_engine.config import Secret
    return [s.reveal() if isinstance(s, Secret) else s for s in secrets if s]


def run_job(job: str, args: list) -> Any:
    return JOBS[job](*args)


async def off_loop(job: str, *args: Any, size: int) -> Any:
    """`JOBS[job](*args)`: inline when `size` (characters of input) is under `OFFLOAD_CHARS`, else in a helper
    process (in a thread if that fails). Secrets among `args` are passed as `plain(secrets)`."""
    if size < OFFLOAD_CHARS:
        return run_job(job, list(args))
    loop = asyncio.get_running_loop()
    slots = _slots.setdefault(id(loop), asyncio.Semaphore(MAX_HELPERS))
    async with slots:
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", HELPER, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=child_env())
            out, _ = await proc.communicate(json.dumps({"job": job, "args": list(args)}).encode())
            if proc.returncode == 0:
                return json.loads(out)
            why = f"exit code {proc.returncode}"
        except (OSError, ValueError) as e:
            why = type(e).__name__
    log.warning("scrubbing helper process failed (%s); scrubbing in a thread", why)
    return await asyncio.to_thread(run_job, job, list(args))


HELPER = (f"import os, sys\ntry:\n    os.nice({HELPER_NICE})\nexcept OSError:\n    pass\n"
          "from vapo_engine.providers.offload import main\nsys.exit(main())")
"""The helper's command: lower its priority first (its imports cost CPU too), then run `main`."""


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    sys.stdout.write(json.dumps(run_job(request["job"], request["args"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
