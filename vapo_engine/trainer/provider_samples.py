"""Provider samples into positive replay (docs/design.md §8; VAPO §4.3 "Group-Sampling" with an API model).

For every rollout step, rank 0 sends the step's prompts (with the task's format instruction as the system
message) to the configured channel through `vapo_engine.providers.ProviderWorker` — a background thread with a
bounded queue, so a slow, rate-limited or failing provider never stalls a step. Finished answers are checked by
the task's checker; correct ones are tokenized with the policy's tokenizer exactly like a rollout (the prompt
in the run's prompt format — `vapo_engine.prompts.encode_prompts`, plain or the chat template — then the answer
and EOS) and returned for the replay buffer, where they only ever feed the
positive-example NLL (off-policy positives need no importance ratio). Answers longer than the token cap are
counted, not replayed.

Budget and cost: at most `max_requests` prompts per run; every complete answer set is cached in the run
directory (`provider_cache.jsonl`), so a resumed run takes cached answers instead of paying again; tokens are
counted. When the provider is down (401/403, 404 after the fallback, quota), training simply goes on with local
samples and `provider.json` in the run directory says why, with the channel's fix (run_status and
diagnose_error(run_id) read it).

`NullProviderSamples` is what a run without `[provider_rollouts]` (and every rank but 0) gets.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from functools import partial
from pathlib import Path

from vapo_engine.config import TrainConfig, load_settings, resolve_channel
from vapo_engine.datafiles import open_append, read_text
from vapo_engine.jobs.threads import SETTINGS_ENV
from vapo_engine.prompts import PromptFormat, encode_prompts
from vapo_engine.providers.redaction import scrub_obj
from vapo_engine.rundir import PROVIDER_CACHE as CACHE
from vapo_engine.rundir import PROVIDER_JSON as STATE
from vapo_engine.rundir import RunDir
from vapo_engine.tasks import Problem
from vapo_engine.tasks.verifiers import make_judge


class NullProviderSamples:
    """No provider: every call is a no-op."""

    def submit(self, problems) -> None:
        pass

    def collect(self) -> list[tuple[list[int], list[int]]]:
        return []

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def provider_samples(cfg: TrainConfig, run_dir: Path, tokenizer, task, *, is_main: bool, log=print,
                     prompt_format: PromptFormat | None = None):
    """The run's provider sampler, or the null one (disabled, not rank 0, or the channel cannot be built).
    `prompt_format` is the rollouts' (None = plain): replayed prompt ids must be the rollout's."""
    if not cfg.provider_rollouts.enabled or not is_main:
        return NullProviderSamples()
    try:
        return ProviderSamples(cfg, Path(run_dir), tokenizer, task, log=log, prompt_format=prompt_format)
    except Exception as e:  # noqa: BLE001 - provider samples are optional: a setup failure must not end training
        RunDir(run_dir).write_json(STATE, {"down": {"reason": f"provider samples not started: {e}",
                                                    "fix": "check the channel with vapo-mcp check"}})
        log(f"provider samples off: {e}")
        return NullProviderSamples()


class ProviderSamples:
    def __init__(self, cfg: TrainConfig, run_dir: Path, tokenizer, task, log=print,
                 prompt_format: PromptFormat | None = None):
        from vapo_engine.diagnostics import explain_provider_down
        from vapo_engine.providers import ConcurrencyPolicy, ProviderWorker
        p = cfg.provider_rollouts
        self.rd, self.tok, self.task, self.log = RunDir(run_dir), tokenizer, task, log
        self.judge = make_judge(cfg.data.verifier, task, cfg.data.verifier_timeout_s)  # what the run scores with
        self.prompt_format = prompt_format
        self.n = p.samples_per_prompt or cfg.vapo.group_size
        self.max_requests, self.cap = p.max_requests, p.max_tokens or cfg.model.max_tokens
        chat = {"temperature": cfg.model.temperature if p.temperature is None else p.temperature,
                "max_tokens": self.cap}
        channel = _channel(cfg)
        self.worker = ProviderWorker(channel, model=p.model, concurrency=ConcurrencyPolicy(start=p.concurrency),
                                     max_pending=p.max_pending, chat_kw=chat,
                                     explain=partial(explain_provider_down, channel=channel)).start()
        self.key_of = (lambda prompt: hashlib.sha256(json.dumps([self.worker.model, prompt, self.n, chat])
                                                     .encode()).hexdigest()[:32])
        self.cache = _read_cache(self.rd.file(CACHE))
        # a resumed run: the prompts answered before count against the budget (max_requests is per run)
        self.sent, self.partial, self.ready = len(self.cache), {}, []
        self.counts = {"positives": 0, "checked": 0, "correct": 0, "too_long": 0, "cache_hits": 0}
        self.down_said = False
        old = self.rd.read_json(STATE)
        if old and "down" in old:  # a resumed run asks again: the previous attempt's verdict no longer holds
            self.rd.write_json(STATE, {k: v for k, v in old.items() if k != "down"})

    def submit(self, problems) -> None:
        """Ask for answers to `problems` (cached ones are taken from the cache; the budget is respected)."""
        from vapo_engine.providers import ProviderRequest
        todo = []
        for prob in problems:
            key = self.key_of(prob.prompt)
            if key in self.cache:
                self.counts["cache_hits"] += 1
                self.ready += [(prob.prompt, prob.answer, c) for c in self.cache.pop(key)]
            elif self.sent + len(todo) < self.max_requests:
                messages = [{"role": "user", "content": prob.prompt}]
                if getattr(self.task, "system_prompt", None):
                    messages.insert(0, {"role": "system", "content": self.task.system_prompt})
                todo.append(ProviderRequest(id=key, messages=messages, n=self.n,
                                            meta={"prompt": prob.prompt, "answer": prob.answer}))
        self.sent += self.worker.submit(todo) if todo else 0

    def collect(self) -> list[tuple[list[int], list[int]]]:
        """Correct provider answers finished since the last call, as (prompt ids, response ids) pairs."""
        self._absorb()
        pairs = [p for p in (self._pair(*item) for item in self.ready) if p is not None]
        self.ready = []
        self.counts["positives"] += len(pairs)
        self._report_down()
        return pairs

    def _absorb(self) -> None:
        """Move finished samples into `ready`; cache every complete answer set."""
        for s in self.worker.drain():
            got = self.partial.setdefault(s.request_id, [])
            got.append(s)
            if len(got) == self.n:  # a complete answer set: cache it (what a resumed run reuses)
                del self.partial[s.request_id]
                contents = [x.content for x in got if x.ok]
                if contents:  # nothing answered (provider down, timeouts): not cached, may be asked again
                    _append_cache(self.rd.file(CACHE), s.request_id, contents)
                self.ready += [(s.meta["prompt"], s.meta["answer"], c) for c in contents]

    def _pair(self, prompt: str, answer: str, content: str) -> tuple[list[int], list[int]] | None:
        self.counts["checked"] += 1
        if not self.judge([content], [Problem("provider", prompt, answer)])[0].correct:
            return None
        self.counts["correct"] += 1
        resp = self.tok(content, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        if len(resp) > self.cap:
            self.counts["too_long"] += 1
            return None
        return encode_prompts(self.tok, [prompt], self.prompt_format)[0], resp

    def _report_down(self) -> None:
        down = self.worker.down
        if down is not None and not self.down_said:
            self.down_said = True
            self._write_state(down=down.model_dump(mode="json"))
            self.log(f"provider samples stopped: {down.line()}; training continues on local samples")

    def _write_state(self, **fields) -> None:
        """provider.json: `down` (why the provider is no longer used, once it is) and `final` (the run's provider
        totals when the worker stopped, including answers that landed after the last logged step)."""
        key = self.worker.channel.secrets()
        state = self.rd.read_json(STATE) or {}
        self.rd.write_json(STATE, scrub_obj({**state, **fields}, key))

    def metrics(self) -> dict[str, float]:
        c = self.counts
        out = {k: float(v) for k, v in self.worker.stats().metrics().items() if isinstance(v, (int, float, bool))}
        out |= {"provider/positives_added": float(c["positives"]), "provider/too_long": float(c["too_long"]),
                "provider/correct": float(c["correct"]),
                "provider/cache_hits": float(c["cache_hits"]), "provider/sent": float(self.sent)}
        if c["checked"]:
            out["provider/accuracy"] = c["correct"] / c["checked"]
        return out

    def close(self, wait_s: float = 3.0) -> None:
        """Stop the worker; answers still in flight get `wait_s` to arrive and be cached (they are paid for)."""
        end = time.monotonic() + wait_s
        while self.worker.pending and self.worker.down is None and time.monotonic() < end:
            time.sleep(0.05)
        self._absorb()
        for item in self.ready:  # too late to replay; checked so the final totals count every answer
            self._pair(*item)
        self.ready = []
        self._report_down()
        self.worker.stop(timeout=2.0)
        self._write_state(final=self.metrics())


def _channel(cfg: TrainConfig):
    """The channel exactly as the tools resolve it: the settings.json of the server that started this attempt
    (`SETTINGS_ENV` in the environment), the environment and the .env next to it. Nothing of it comes from the
    run directory, which is data: a path recorded there could send the key to any base URL (docs/security.md)."""
    path = os.environ.get(SETTINGS_ENV)
    if not path:
        raise ValueError(f"the worker was started without {SETTINGS_ENV} (the server's settings.json); start the "
                         "run with vapo-mcp (start_training / vapo-mcp train, resume_run / vapo-mcp runs resume)")
    channel, _ = resolve_channel(load_settings(path), cfg, dotenv_path=Path(path).parent / ".env")
    return channel


def _read_cache(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    try:
        for line in read_text(path).splitlines():
            try:
                rec = json.loads(line)
                out.setdefault(rec["key"], []).extend(rec["contents"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line
    except OSError:
        pass
    return out


def _append_cache(path: Path, key: str, contents: list[str]) -> None:
    with open_append(path) as f:  # never through a planted symlink (vapo_engine.datafiles)
        f.write(json.dumps({"key": key, "contents": contents}) + "\n")
