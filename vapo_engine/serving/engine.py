"""Bounded batching: concurrent chat requests share one `model.generate` call (one forward pass per step).

Requests go into a queue; one worker thread (generation never runs on the event loop) takes the oldest,
waits up to `window_s` for more, and runs every waiting request with the same sampling settings (greedy, or
one temperature/top_p pair) as one left-padded batch of at most `max_batch` rows (a request with `n` choices
is `n` rows); the others wait for the next call. Requests that arrive while a batch runs are collected for the
next one without a further wait.

Streaming is real: a `StoppingCriteria` sees each step's new token of every row, turns it into text
(`rows.RowText`) and sends the deltas to the request's event queue at once; it also ends rows early (their own
`max_tokens`, a stop string, a client that went away), and the batch stops when every row has ended. Each batch
is one call of the in-process Hugging Face rollout backend (`vapo_engine.rollout.backends.hf.run`) with the
sampling settings of the run's rollouts: KV cache, EOS from tokenizer and model, top_k = 0 so only temperature /
top_p shape the distribution.

Events sent to a request (`Job.send`, thread-safe): ("delta", index, text), ("finish", index, reason),
("done", completion_tokens), ("error", message).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from vapo_engine.rollout.backends import SamplingParams
from vapo_engine.rollout.backends.hf import run

from .model import ServedModel
from .rows import RowText

log = logging.getLogger("vapo_engine.serving")
GENERATION_FAILED = "the model failed to generate an answer; the server log says why"


@dataclass(eq=False)
class Job:
    """One chat request in the engine: its prompt, sampling settings and where its events go."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stops: tuple[str, ...] = ()
    emit: Callable[[tuple], None] = lambda event: None
    cancelled: bool = False
    submitted: float = field(default_factory=time.monotonic)

    @property
    def key(self) -> tuple:
        """Requests with the same key can share a generate call."""
        return ("greedy",) if self.temperature == 0 else ("sample", self.temperature, self.top_p)

    def send(self, event: tuple) -> None:
        try:
            self.emit(event)
        except RuntimeError:  # the request's event loop is gone (server shutting down)
            self.cancelled = True


class _Rows(StoppingCriteria):
    """Per step: feed each row its new token, stream the text, and say which rows are finished."""

    def __init__(self, rows: list[tuple[Job, int, RowText]]):
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        done = []
        for (job, index, row), token in zip(self.rows, input_ids[:, -1].tolist()):
            if not row.done:
                if job.cancelled:
                    row.finish("cancelled")
                else:
                    _deliver(job, index, row, row.add(token))
            done.append(row.done)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _deliver(job: Job, index: int, row: RowText, delta: str) -> None:
    if delta:
        job.send(("delta", index, delta))
    if row.done and row.finish_reason != "cancelled":
        job.send(("finish", index, row.finish_reason))


class Engine:
    """The batching queue and its worker thread over one `ServedModel`."""

    def __init__(self, served: ServedModel, *, max_batch: int = 16, window_s: float = 0.02):
        self.m, self.max_batch, self.window = served, max(1, int(max_batch)), max(0.0, float(window_s))
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._waiting: list[Job] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.stats = {"requests": 0, "generate_calls": 0, "rows": 0, "largest_batch": 0}

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="vapo-serve-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def submit(self, job: Job) -> None:
        with self._lock:
            self.stats["requests"] += 1
        self._queue.put(job)

    def snapshot(self) -> dict:
        with self._lock:
            return {**self.stats, "queued": self._queue.qsize() + len(self._waiting), "max_batch": self.max_batch,
                    "window_ms": round(self.window * 1000, 3)}

    # --- the worker thread -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                for job in self._waiting:
                    job.send(("error", "the server is shutting down; send the request again"))
                return
            if batch:
                self._run(batch)

    def _next_batch(self) -> list[Job] | None:
        """The next batch (same sampling key, ≤ max_batch rows, oldest first); None once stopped."""
        if not self._waiting:
            job = self._queue.get()
            if job is None:
                return None
            self._waiting.append(job)
            deadline = time.monotonic() + self.window
        else:
            deadline = time.monotonic()  # these already waited through a whole batch
        if not self._drain(deadline):
            return None
        self._waiting = [j for j in self._waiting if not j.cancelled]
        if not self._waiting:
            return []
        key, batch, rest, rows = self._waiting[0].key, [], [], 0
        for job in self._waiting:
            if job.key == key and rows + job.n <= self.max_batch:
                batch.append(job)
                rows += job.n
            else:
                rest.append(job)
        self._waiting = rest
        return batch

    def _drain(self, deadline: float) -> bool:
        """Move queued requests to the waiting list, waiting until `deadline` while the batch is not full.
        False when the stop sentinel arrived."""
        while True:
            full = sum(j.n for j in self._waiting) >= self.max_batch
            timeout = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=timeout) if timeout > 0 and not full else self._queue.get_nowait()
            except queue.Empty:
                return True
            if job is None:
                return False
            self._waiting.append(job)

    def _run(self, jobs: list[Job]) -> None:
        rows = [(job, i, RowText(self.m.decode, self.m.eos_ids, job.max_tokens, job.stops))
                for job in jobs for i in range(job.n)]
        try:
            self._generate(rows)
        except Exception:  # one failed batch must not stop the server; its requests get a 500
            log.exception("generation failed for a batch of %d row(s)", len(rows))
            for job in jobs:
                job.send(("error", GENERATION_FAILED))
            return
        for job, index, row in rows:
            if not row.done:  # the batch ended (model length limit) before this row's own limit
                _deliver(job, index, row, row.finish("length"))
        for job in jobs:
            job.send(("done", sum(r.generated for j, _, r in rows if j is job)))
        with self._lock:
            self.stats["generate_calls"] += 1
            self.stats["rows"] += len(rows)
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(rows))

    @torch.inference_mode()
    def _generate(self, rows: list[tuple[Job, int, RowText]]) -> None:
        m, first = self.m, rows[0][0]
        params = SamplingParams(max_new_tokens=max(job.max_tokens for job, _, _ in rows),
                                stop_token_ids=tuple(m.eos_ids), pad_token_id=m.pad_id,
                                temperature=first.temperature, top_p=first.top_p)
        with m.compute:
            run(m.model, [job.prompt_ids for job, _, _ in rows], params,
                stopping_criteria=StoppingCriteriaList([_Rows(rows)]))
