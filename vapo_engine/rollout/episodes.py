"""Episodes: how the policy's response to a prompt is made (rollout.episode; docs/design.md §3.14).

- `single_turn` (the default): one response, sampled by the run's rollout backend (`generate.sample`).
- `tool_calls`: the policy may call tools (an MCP server's, `mcp_tools.McpTools`, or any `ToolBox`). Each turn
  the backend samples every unfinished episode of the batch from its context so far; a turn that writes a call
  (`tool_formats`) is cut at the call's end tag, the call runs, and its result is appended as tokens with loss
  mask 0; the policy writes on. An episode ends at a final answer (a turn without a call: EOS), after
  `max_turns` turns (a call in the last turn is not run), or at the token budget (`max_new_tokens` for the whole
  response: policy tokens and results; a result is cut to fit). Every failure of a tool is the policy's
  observation, never an error of the run.

The result is a `Generation` whose response is the whole episode (`response_mask`: its extent) with
`loss_mask` (1 = the policy wrote it), the policy's text alone in `texts` (what the verifier scores: a tool's
output cannot answer for the policy), and per-row counts (`turns`, `tool_calls`, `tool_errors`). Old
log-probs are the trainer's own (no `policy_outputs`); the sampler's log-probs, when asked for, are 0 at inserted
tokens. `EPISODES` registers the episodes: adding one is one file (a class with `sample` and `close`) and its
line here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from vapo_engine.prompts import PromptFormat
from vapo_engine.registry import Registry

from .backends.base import Generation, left_pad
from .generate import sample, sampling_params
from .tool_formats import cut_after, pick_format


class ToolBox(Protocol):
    """What an episode needs of its tools (`mcp_tools.McpTools`, or a test's own)."""

    def specs(self) -> list[dict]: ...

    def call(self, name: str, arguments: dict): ...  # -> an object with .text and .ok

    def close(self) -> None: ...


class SingleTurn:
    """One response per prompt (the rollout backend's own output)."""

    name = "single_turn"

    def __init__(self, tools_cfg=None, tools: ToolBox | None = None, where: str = ""):
        del tools_cfg, tools, where

    def sample(self, models, prompts: list[str], **how) -> Generation:
        return sample(models, prompts, **how)

    def describe(self) -> str:
        return "single turn"

    def close(self) -> None:
        pass


@dataclass
class _Row:
    context: list[int]
    ids: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    turns: int = 0
    calls: int = 0
    errors: int = 0
    done: bool = False
    finished: bool = False

    def add(self, ids: list[int], learns: bool, log_probs: list[float] | None = None) -> None:
        self.context += ids
        self.ids += ids
        self.loss += [1.0 if learns else 0.0] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)


class ToolCalls:
    """Multi-turn episodes with tool calls (see the module docstring)."""

    name = "tool_calls"

    def __init__(self, tools_cfg, tools: ToolBox, where: str = "the model"):
        self.cfg, self.tools, self.where = tools_cfg, tools, where
        self._formats: dict[int, object] = {}

    def describe(self) -> str:
        names = ", ".join(s["function"]["name"] for s in self.tools.specs())
        return f"tool calls (tools: {names}; at most {self.cfg.max_turns} turns)"

    def close(self) -> None:
        self.tools.close()

    def format_for(self, tokenizer, prompt_format: PromptFormat | None):
        key = id(tokenizer) ^ hash(prompt_format)
        if key not in self._formats:
            self._formats[key] = pick_format(self.cfg.format, tokenizer, prompt_format, self.tools.specs(),
                                             self.where)
        return self._formats[key]

    def sample(self, models, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, do_sample: bool = True, batch_size: int | None = None,
               prompt_format: PromptFormat | None = None, with_log_probs: bool = False, seed: int | None = None,
               policy_outputs: bool = False) -> Generation:
        del policy_outputs  # the trainer computes its own old log-probs of an episode
        tok = models.tokenizer
        fmt = self.format_for(tok, prompt_format)
        starts = fmt.prompt_ids(tok, prompts, prompt_format)
        rows = [_Row(list(p)) for p in starts]
        version, have_lp = None, with_log_probs
        for turn in range(self.cfg.max_turns):
            active = [r for r in rows if not r.done]
            if not active:
                break
            budget = max(max_new_tokens - len(r.ids) for r in active)
            params = sampling_params(models.policy, tok, max_new_tokens=budget, temperature=temperature,
                                     top_p=top_p, do_sample=do_sample, with_log_probs=with_log_probs,
                                     seed=None if seed is None else seed + turn)
            gen = models.backend.generate(models, [r.context for r in active], params, batch_size=batch_size)
            version = gen.weight_version if gen.weight_version is not None else version
            have_lp = have_lp and gen.log_probs is not None  # one turn without them: none for the episode
            calls = [(row, self._turn(row, gen, j, fmt, tok, max_new_tokens, last=turn == self.cfg.max_turns - 1))
                     for j, row in enumerate(active)]
            self._results([(row, call) for row, call in calls if call is not None], fmt, tok, max_new_tokens)
        return self._generation(rows, starts, tok, version, have_lp)

    def _turn(self, row: _Row, gen: Generation, j: int, fmt, tok, budget: int, last: bool):
        """Append row's sampled turn (cut at a call's end tag, or at the budget); the parsed call, or None when
        the episode ended (a final answer, the sampler's limit, the budget)."""
        n = int(gen.response_mask[j].sum().round())
        ids = gen.response_ids[j, :n].tolist()
        lps = gen.log_probs[j, :n].tolist() if gen.log_probs is not None else None
        cut = None if last else cut_after(tok, ids, fmt.end)
        ids = ids[:cut] if cut is not None else ids
        room = budget - len(row.ids)
        row.turns += 1
        row.add(ids[:room], True, lps[:len(ids[:room])] if lps is not None else None)
        row.text.append(tok.decode(ids[:room], skip_special_tokens=True))
        if cut is None or len(ids) > room:
            row.done, row.finished = True, cut is None and bool(gen.finished[j]) and len(ids) <= room
            return None
        row.calls += 1
        return fmt.parse(row.text[-1])

    def _results(self, calls: list, fmt, tok, budget: int) -> None:
        """Run one turn's calls together and append each result (an error text for a malformed call)."""
        runnable = [(row, call) for row, call in calls if call.error is None]
        many = getattr(self.tools, "call_many", None)
        pairs = [(c.name, c.arguments) for _, c in runnable]
        results = dict(zip((id(r) for r, _ in runnable),
                           many(pairs) if many else [self.tools.call(*p) for p in pairs]))
        for row, call in calls:
            result = results.get(id(row))
            row.errors += 0 if result is not None and result.ok else 1
            obs = fmt.observation(tok, result.text if result is not None else call.error)
            room = budget - len(row.ids)
            row.add(obs[:room], False)
            if len(obs) >= room:
                row.done = True

    def _generation(self, rows: list[_Row], starts, tok, version, with_log_probs: bool) -> Generation:
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        prompt_ids, prompt_mask = left_pad(starts, pad, "cpu")
        width = max(1, max(len(r.ids) for r in rows))
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        extent = torch.zeros((len(rows), width))
        loss = torch.zeros((len(rows), width))
        lps = torch.zeros((len(rows), width))
        for i, r in enumerate(rows):
            k = len(r.ids)
            ids[i, :k] = torch.tensor(r.ids, dtype=torch.long)
            extent[i, :k] = 1.0
            loss[i, :k] = torch.tensor(r.loss)
            lps[i, :k] = torch.tensor(r.log_probs)
        def count(name: str) -> torch.Tensor:
            return torch.tensor([float(getattr(r, name)) for r in rows])
        return Generation(prompt_ids, prompt_mask, ids, extent, ["".join(r.text) for r in rows],
                          torch.tensor([r.finished for r in rows]), log_probs=lps if with_log_probs else None,
                          weight_version=version, loss_mask=loss, turns=count("turns"), tool_calls=count("calls"),
                          tool_errors=count("errors"))


EPISODES = Registry("episode", field="rollout.episode", entries={
    "single_turn": SingleTurn,
    "tool_calls": ToolCalls,
})


def make_episode(rollout_cfg, tools: ToolBox | None = None, where: str = "the model"):
    """The episode `rollout_cfg.episode` names, with `tools` (needed by tool_calls)."""
    return EPISODES.lookup(rollout_cfg.episode)(rollout_cfg.tools, tools, where)


def open_episode(rollout_cfg, where: str = "the model", log=print):
    """A run's episode: `make_episode` after starting the MCP servers of [rollout.tools] (a server that cannot
    start refuses the run here, before any weights load: mcp_tools.ToolServerError)."""
    cls = EPISODES.lookup(rollout_cfg.episode)
    if cls is SingleTurn:
        return SINGLE_TURN
    tools = None
    if rollout_cfg.tools.servers:
        from .mcp_tools import McpTools
        tools = McpTools(rollout_cfg.tools, log=log).start()
    try:
        return cls(rollout_cfg.tools, tools, where)
    except BaseException:
        if tools is not None:
            tools.close()
        raise


def episode_metrics(ro) -> dict[str, float]:
    """The rollout/… numbers of a multi-turn episode batch (none for single turns), means over this rank's rows;
    rollout/verifier_timeouts whenever a verification timed out."""
    out = {"rollout/verifier_timeouts": float(ro.verifier_timeouts)} if ro.verifier_timeouts else {}
    if ro.turns is None:
        return out
    return out | {"rollout/turns": float(ro.turns.mean()), "rollout/tool_calls": float(ro.tool_calls.mean()),
                  "rollout/tool_errors": float(ro.tool_errors.mean()),
                  "rollout/tool_use": float((ro.tool_calls > 0).float().mean()),
                  "rollout/policy_tokens": float(ro.loss_mask.sum(1).mean())}


SINGLE_TURN = SingleTurn()
