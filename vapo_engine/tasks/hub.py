"""Fetch a registered benchmark (`benchmarks.BENCHMARKS`) from the Hugging Face Hub into
`<data_dir>/<name>.jsonl`.

    fetch_benchmark("aime_2024", "data")  # data/aime_2024.jsonl (30 problems), or a TaskError with the fix

Each source file goes through `huggingface_hub.hf_hub_download` (repo_type="dataset", the pinned commit, the
usual Hugging Face cache, `HF_ENDPOINT` for a mirror, `HF_HUB_OFFLINE=1` for cache-only, `HF_TOKEN` as usual),
is read (JSONL, a JSON list, or Parquet through pyarrow when it is installed), converted row by row to
`{"id", "problem", "answer"}`, written to a temporary file next to the target, checked with `load_jsonl` and
moved into place with `os.replace` (a crash never leaves half a file under the real name). Every failure -
offline, unreachable endpoint, HTTP 404 or another status, pyarrow missing, a malformed source - is a
`TaskError` naming the file to place and the commands that make it; nothing here prints a traceback.

Before a download the endpoint (or the proxy the environment routes it through) must accept a TCP connection
within `REACH_TIMEOUT_S` (`reachability.py`): with no network a fetch fails at once - unless the file is in
the Hugging Face cache already, which is then used - instead of after huggingface_hub's ~20 s of retries.

`huggingface_hub` is imported inside the functions only: importing the tasks package (the MCP tools do) must
stay light, and nothing is ever fetched at import time.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .base import TaskError
from .benchmarks import BENCHMARKS, Benchmark, benchmark_names, fix_hint
from .jsonl import load_jsonl
from .reachability import unreachable

_TRUE = {"1", "ON", "YES", "TRUE"}
_DETAIL_CHARS = 300
_STATUS_HINTS = {401: ": the endpoint wants a token (set HF_TOKEN or run `hf auth login`)",
                 403: ": the token may not read this dataset (a gated or private repo)",
                 429: ": rate limited, try again in a minute",
                 500: ": the endpoint is failing, try again later"}


def fetch_benchmark(name: str, data_dir: str | Path, *, force: bool = False) -> Path:
    """Make sure `<data_dir>/<name>.jsonl` exists for a registered name; download and convert it when missing
    (or always, with `force`). Returns the absolute path. Raises `TaskError` with the fix."""
    bench = BENCHMARKS.get(name)
    if bench is None:
        raise TaskError(f"{name!r} is not a registered benchmark. Fix: use one of "
                        f"{', '.join(benchmark_names())}.")
    target = (Path(data_dir).expanduser() / f"{name}.jsonl").absolute()
    if target.is_file() and not force:
        return target
    records: list[dict] = []
    for filename in bench.files:
        source = _download(bench, filename, target, force=force)
        label = f"{bench.repo_id}/{filename}"  # the snapshot path shows the commit, which reads as a token
        rows = _read_rows(bench, source, target, label)
        records += _convert(bench, rows, label, target, start=len(records))
    _write_atomic(target, records)
    return target


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in _TRUE


def hub_settings() -> tuple[str | None, bool, str | None]:
    """(endpoint, offline, cache_dir) read now, not at `huggingface_hub`'s import: `HF_ENDPOINT`,
    `HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE`, `HF_HUB_CACHE` (else `HF_HOME`/hub, else the library's)."""
    from huggingface_hub import constants

    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None
    offline = (_env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
               or bool(getattr(constants, "HF_HUB_OFFLINE", False)))
    home = os.environ.get("HF_HOME", "").strip()
    cache = os.environ.get("HF_HUB_CACHE", "").strip() or (str(Path(home).expanduser() / "hub") if home
                                                            else None)
    return endpoint, offline, cache


def _download(bench: Benchmark, filename: str, target: Path, *, force: bool) -> Path:
    """The cached local path of one source file (downloaded again with `force`, unless offline); every
    download failure becomes a `TaskError`."""
    from huggingface_hub import constants, hf_hub_download

    endpoint, offline, cache = hub_settings()
    # no connection to the endpoint: the cached file if there is one (not with --force), else fail now
    down = None if offline else unreachable(endpoint or constants.ENDPOINT)
    try:
        if down and force:
            raise OSError(down)
        with _quiet_hub():
            return Path(hf_hub_download(bench.repo_id, filename, repo_type="dataset", revision=bench.revision,
                                        endpoint=endpoint, cache_dir=cache, local_files_only=offline or bool(down),
                                        force_download=force and not offline))
    except Exception as e:  # noqa: BLE001 - any failure to get the file leaves the user the same three ways out
        if down:  # the library was not asked to go online: the reason is the endpoint, named now
            why = _not_reached(bench, filename, endpoint or constants.ENDPOINT, f" ({down})")
        else:
            why = _why(e, bench, filename, endpoint or constants.ENDPOINT, offline)
        raise TaskError(f"{target}: {why} {fix_hint(bench, target)}.") from None


@contextmanager
def _quiet_hub():
    """huggingface_hub's own warnings off (its "Retrying in 1s [Retry 1/5]" lines for an unreachable Hub): the
    failure comes back as one TaskError with the fix instead."""
    import logging
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_log.setLevel(level)


def _why(e: Exception, bench: Benchmark, filename: str, endpoint: str, offline: bool) -> str:
    """One sentence on why `filename` of `bench` could not be downloaded (the exception classified)."""
    from huggingface_hub import errors

    what = f"benchmark {bench.name!r} is not downloaded yet and its source {bench.repo_id}/{filename}"
    if offline or isinstance(e, errors.OfflineModeIsEnabled):
        return (f"{what} is not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE=1 or "
                "TRANSFORMERS_OFFLINE=1).")
    if isinstance(e, errors.LocalEntryNotFoundError) and isinstance(e.__cause__, errors.HfHubHTTPError):
        e = e.__cause__  # an HTTP answer without the Hub's error code (a mirror's plain 404, a 5xx)
    if isinstance(e, errors.LocalEntryNotFoundError):  # the library's word for "no connection, not cached"
        return _not_reached(bench, filename, endpoint)
    status = getattr(getattr(e, "response", None), "status_code", None)
    remote_entry = getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError)
    missing = {errors.RepositoryNotFoundError: "the dataset repository",
               errors.RevisionNotFoundError: f"revision {bench.short_revision}", remote_entry: "the file"}
    for kind, thing in missing.items():
        if isinstance(e, kind):
            return (f"{what} was not found on {endpoint} (HTTP {status or 404}: {thing} does not exist "
                    "there; if HF_ENDPOINT points at a mirror, it may not mirror this dataset).")
    if status == 404:
        return (f"{what} was not found on {endpoint} (HTTP 404; if HF_ENDPOINT points at a mirror, it may "
                "not mirror this dataset).")
    if status is not None:
        hint = _STATUS_HINTS.get(min(500, status), "")
        return f"{what} could not be downloaded from {endpoint} (HTTP {status}{hint})."
    return f"{what} could not be downloaded from {endpoint} ({type(e).__name__}: {_detail(e)})."


def _not_reached(bench: Benchmark, filename: str, endpoint: str, detail: str = "") -> str:
    return (f"benchmark {bench.name!r} is not downloaded yet and its source {bench.repo_id}/{filename} could not "
            f"be downloaded: {endpoint} could not be reached{detail} and the file is not in the Hugging Face "
            "cache (check the network, a proxy, or HF_ENDPOINT).")


def _detail(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "..."


def _malformed(label: str, bench: Benchmark, target: Path, detail: str) -> TaskError:
    return TaskError(
        f"{label}: the downloaded source of benchmark {bench.name!r} "
        f"({bench.repo_id}@{bench.short_revision}) is malformed: {detail}. Fix: download it again with "
        f"`{bench.fetch_command(target.parent)} --force`; "
        f'or write {target} yourself (one JSON object per line: {{"problem": "...", "answer": "..."}}, '
        'optional "id").')


def _read_rows(bench: Benchmark, source: Path, target: Path, label: str) -> list:
    """The rows of a downloaded `.parquet` (pyarrow), `.json` (a list) or `.jsonl` file, as Python objects."""
    if source.suffix == ".parquet":
        return _read_parquet(bench, source, target, label)
    try:
        text = source.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise _malformed(label, bench, target, f"cannot read it as UTF-8 text ({_detail(e)})") from None
    if source.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise _malformed(label, bench, target, f"invalid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(rows, list):
            raise _malformed(label, bench, target, f"expected a JSON list of rows, got {type(rows).__name__}")
        return rows
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise _malformed(label, bench, target, f"line {lineno} is not valid JSON ({e.msg})") from None
    return rows


def _read_parquet(bench: Benchmark, source: Path, target: Path, label: str) -> list:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(
            f"{target}: the source of benchmark {bench.name!r} ({label}) is a Parquet file and reading it "
            "needs pyarrow, which is not installed. Fix: `pip install pyarrow` and run again; or "
            f"{fix_hint(bench, target).removeprefix('Fix: ')}.") from None
    try:
        return pq.read_table(source).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid / OSError family for a corrupt file
        raise _malformed(label, bench, target, f"not a readable Parquet file ({_detail(e)})") from None


def _text(value: object) -> str | None:
    """A field as text: strings and numbers (not bools); None when missing or empty."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(value)
    return value if isinstance(value, str) and value.strip() else None


def _convert(bench: Benchmark, rows: list, label: str, target: Path, *, start: int) -> list[dict]:
    """Rows of the source format -> `{"id", "problem", "answer"}` records (answers normalised)."""
    if not rows:
        raise _malformed(label, bench, target, "it has no rows")
    out = []
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise _malformed(label, bench, target, f"row {i} is a {type(row).__name__}, not an object")
        problem, raw = _text(row.get(bench.problem_field)), _text(row.get(bench.answer_field))
        answer = bench.answer(raw) if raw is not None else None
        if problem is None or answer is None:
            field = bench.problem_field if problem is None else bench.answer_field
            state = ("missing or empty" if problem is None or raw is None
                     else f"not a usable answer ({raw[-60:]!r})")
            raise _malformed(label, bench, target, f"row {i}: field {field!r} is {state}")
        rid = _text(row.get(bench.id_field)) if bench.id_field else None
        out.append({"id": rid or f"{bench.name}-{start + i}", "problem": problem, "answer": answer})
    return out


def _write_atomic(target: Path, records: list[dict]) -> None:
    """Write `records` as JSONL next to `target`, check the file as the loader will read it, then rename."""
    unwritable = f"Fix: make {target.parent} writable, or point data.data_dir at a writable folder"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise TaskError(f"{target}: cannot write the benchmark file ({_detail(e)}). {unwritable}.") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            f.flush()
            os.fsync(f.fileno())
        load_jsonl(tmp)
        os.replace(tmp, target)
    except OSError as e:
        raise TaskError(f"{target}: cannot write the benchmark file ({_detail(e)}). {unwritable}.") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
