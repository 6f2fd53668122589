"""Who may touch which files, and what a tool call may not change: the security model of the tools (docs/design.md §7).

Three callers reach the tools, and they are trusted differently:

- **The CLI** (`vapo-mcp train`, `vapo-mcp diagnose`, ...) is the local user at a terminal: any file the user
  can read, any config override (including where a multi-node run listens).
- **A stdio MCP client** is the local user's coding agent: it may name any file the user can read, but a tool
  call may not change where a run listens or how many nodes join (`distributed.nnodes`, `node_rank`,
  `rdzv_endpoint` come from config.toml or the CLI only), because a rendezvous that accepts a peer is a way in;
  nor where rollouts are sampled (`rollout.urls`, `rollout.token_env`) or where a metric sink sends the run
  (`logging.mlflow_tracking_uri`: the tracker gets the metrics and the environment's tracker credentials), nor
  which tool servers a run starts or calls (`rollout.tools`: a stdio server is a program the trainer runs).
- **An HTTP MCP client with the bearer token** is a remote agent that may be prompt-injected. On top of the
  stdio rules, every path it names — `diagnose_error(log_path, code_path)`, a `preset` .toml, the path-valued
  config keys (every field typed PathText: vapo_engine/config/path_fields.py — `model.local_path`,
  `model.value_path`, `critic.model_path`, `data.data_dir`, `rollout.weights_dir`, a JSONL `data.train` /
  `eval.benchmark`) whether set by an override or by a preset file — must resolve (after symlinks) inside the
  allowed roots: the project (the folder of config.toml), `runtime.log_dir`, config.toml's own `data.data_dir`,
  and the folders given with `vapo-mcp serve --http --allow-path DIR`. A path outside gets one fixed refusal
  that is the same for existing and missing files, files and folders, and symlinks that point out, so the
  answer reveals nothing about what exists outside. Relative paths are taken from the project folder.

Peers without the token get nothing (server/http.py). No secret reaches any caller (redaction elsewhere).

The MCP server (server.app) applies its `Policy` to each tool call through a context variable
(`applied`), which follows the call into worker threads; code outside a tool call (the CLI) runs under the
`cli` policy. `vapo-mcp serve --http` builds the server with the `http` policy and its `--allow-path` folders.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from vapo_engine.config import ConfigError, TrainConfig, load_config, load_settings, preset_names
from vapo_engine.config.path_fields import TASK_SPECS, freeze_paths, get_path, path_fields
from vapo_engine.config.secrets import redact_tokens
from vapo_engine.jobs.threads import usable_cores
from vapo_engine.providers import scrub
from vapo_engine.runs import runs_root
from vapo_engine.tasks import BUILTIN_PREFIX

from .paths import Files, ToolInputError

TRANSPORTS = ("cli", "stdio", "http")
LISTENER_KEYS = ("nnodes", "node_rank", "rdzv_endpoint")
ROLLOUT_PEER_KEYS = ("urls", "token_env")
"""[rollout] keys only config.toml or the CLI may set (the replicas receive the token)."""
TOOL_KEYS = ("tools",)
"""[rollout] keys only config.toml or the CLI may set: the MCP tool servers a run starts (programs) or calls."""
SINK_DESTINATION_KEYS = ("mlflow_tracking_uri",)
"""[logging] keys only config.toml or the CLI may set: where a metric sink sends the run (its metrics, its config
and the tracker credentials of the environment, MLFLOW_TRACKING_TOKEN / _USERNAME / _PASSWORD)."""


class PathNotAllowed(ToolInputError):
    """A remote caller named a path outside the allowed roots; the message never says whether it exists."""


@dataclass(frozen=True)
class Policy:
    """What the current caller may do; see the module docstring."""

    transport: str
    allow_paths: tuple[Path, ...] = ()

    def __post_init__(self):
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {self.transport!r}")

    @property
    def confines_paths(self) -> bool:
        return self.transport == "http"

    @property
    def is_tool_call(self) -> bool:
        return self.transport != "cli"


CLI = Policy("cli")
_CURRENT: ContextVar[Policy | None] = ContextVar("vapo_mcp_access_policy", default=None)


def current() -> Policy:
    """The policy of the running call: the MCP server's inside a tool call, else the CLI's."""
    return _CURRENT.get() or CLI


@contextmanager
def applied(policy: Policy):
    """Run the block (and the threads it starts through anyio, which copy the context) under `policy`."""
    token = _CURRENT.set(policy)
    try:
        yield policy
    finally:
        _CURRENT.reset(token)


def allowed_roots(f: Files, policy: Policy) -> list[Path]:
    """The project folder, runtime.log_dir, config.toml's own data.data_dir and the --allow-path folders,
    resolved. Read from the server's files only, never from a tool's overrides or preset. A file that does not
    load adds no root (fewer roots, never more), so diagnose_error still reads logs in the project."""
    project = f.config.resolve().parent
    roots = [project]
    try:
        roots.append(runs_root(load_settings(f.settings), f.settings))
    except ConfigError:
        pass
    try:
        roots.append(Path(freeze_paths(load_config(f.config), project).data.data_dir))
    except ConfigError:
        pass
    roots += list(policy.allow_paths)
    out: list[Path] = []
    for r in roots:
        r = _resolve(r) or r
        if r not in out:
            out.append(r)
    return out


ROOTS_BY_ROLE = ("the project folder (where config.toml is), runtime.log_dir, config.toml's data.data_dir and the "
                 "server's --allow-path folders")
"""How a refusal names the roots: by role, never by their absolute paths on the server."""


def refusal(given: object) -> PathNotAllowed:
    """The one message for every refused path (same text whether or not it exists, and whatever the roots are)."""
    shown = redact_tokens(scrub(str(given)[:400]))  # echoed, so scrubbed like any text (a key as a path)
    shown = shown if len(shown) <= 200 else shown[:200] + "…"
    return PathNotAllowed(f"path {shown!r} is outside the allowed roots ({ROOTS_BY_ROLE}); use a path under "
                          "one of them, or restart the server with --allow-path DIR to allow it")


def confine(path: str | Path, f: Files, policy: Policy | None = None, *, roots: list[Path] | None = None,
            shown: object = None) -> Path:
    """The path to use for `path`: unchanged for local callers; for remote ones, resolved (symlinks followed,
    relative paths from the project folder) and inside the allowed roots, else `PathNotAllowed` naming
    `shown` (default: `path` as given)."""
    policy = policy or current()
    if not policy.confines_paths:
        return Path(path)
    roots = roots if roots is not None else allowed_roots(f, policy)
    resolved = _resolve(Path(str(path)), f.config.resolve().parent)
    if resolved is None or not _inside(resolved, roots):
        raise refusal(path if shown is None else shown)
    return resolved


def confine_files(files: list[Path], roots: list[Path], shown: object) -> None:
    """Every file a folder scan would read must itself resolve inside the roots (a symlink inside the
    project may point anywhere); otherwise the whole scan is refused with the fixed message for `shown`."""
    for p in files:
        r = _resolve(p)
        if r is None or not _inside(r, roots):
            raise refusal(shown)


def _inside(p: Path, roots: list[Path]) -> bool:
    return any(p.is_relative_to(r) for r in roots)


def _resolve(p: Path, base: Path | None = None) -> Path | None:
    """`p` with ~ expanded, relative to `base`, symlinks followed; None when it cannot be resolved (an unknown
    ~user, an embedded NUL, a symlink loop, an unreadable component)."""
    try:
        if "\0" in str(p):
            return None
        p = p.expanduser()
        return (base / p if base is not None and not p.is_absolute() else p).resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def preset_for(f: Files, preset: str | None, policy: Policy | None = None) -> str | None:
    """The preset to load: a built-in name as is; for remote callers a `.toml` path is confined (and
    resolved) before anything reads it. Other strings never touch the disk (the loader says 'unknown')."""
    policy = policy or current()
    if not preset or not policy.confines_paths or preset in preset_names() or Path(preset).suffix != ".toml":
        return preset
    return str(confine(preset, f, policy))


def check_config(f: Files, cfg: TrainConfig, policy: Policy | None = None) -> None:
    """Refuse what a tool call may not put in a run (whatever set it: an override or a preset file): a
    listener, rollout replicas or metric-sink destination that differ from config.toml's own, and — for remote callers — a path outside the roots."""
    policy = policy or current()
    if policy.is_tool_call:
        _check_listener(f, cfg)
        _check_rollout_peers(f, cfg)
        _check_tool_servers(f, cfg)
        _check_sink_destinations(f, cfg)
    if policy.confines_paths:
        _check_paths(f, cfg, policy)


def _check_listener(f: Files, cfg: TrainConfig) -> None:
    own = load_config(f.config).distributed
    changed = [(k, getattr(cfg.distributed, k), getattr(own, k)) for k in LISTENER_KEYS
               if getattr(cfg.distributed, k) != getattr(own, k)]
    limit = max(own.nproc_per_node, usable_cores())
    if cfg.distributed.nproc_per_node > limit:
        raise ToolInputError(
            f"distributed.nproc_per_node = {cfg.distributed.nproc_per_node} is more processes than this machine "
            f"has cores ({usable_cores()}); a tool call may ask for at most {limit} — call again with a smaller "
            "value, or set it in config.toml / on the CLI")
    if changed:
        what = "; ".join(f"distributed.{k} = {new!r} (config.toml: {old!r})" for k, new, old in changed)
        k, new, _ = changed[0]
        raise ToolInputError(
            f"{what}: a tool call may not change where a run listens or how many nodes join. Only config.toml "
            f"or the CLI (vapo-mcp train --set distributed.{k}={new}) may set distributed.nnodes, node_rank and "
            "rdzv_endpoint; call again without those overrides (or preset values)")


def _changed_from_config(f: Files, cfg: TrainConfig, section: str, keys) -> list[str]:
    """The keys of `section` whose value in `cfg` differs from config.toml's."""
    own, mine = getattr(load_config(f.config), section), getattr(cfg, section)
    return [k for k in keys if getattr(mine, k) != getattr(own, k)]


def _check_rollout_peers(f: Files, cfg: TrainConfig) -> None:
    """The rollout replicas get the token of `rollout.token_env`: a tool call may not point it elsewhere."""
    changed = _changed_from_config(f, cfg, "rollout", ROLLOUT_PEER_KEYS)
    if changed:
        raise ToolInputError(
            f"rollout.{changed[0]} differs from config.toml's: a tool call may not change where rollouts are "
            "sampled or which token is sent there (rollout.urls, rollout.token_env come from config.toml or the "
            "CLI only); call again without those overrides (or preset values)")


def _check_tool_servers(f: Files, cfg: TrainConfig) -> None:
    """[rollout.tools] names programs the trainer starts and servers it calls: never set by a tool call."""
    if _changed_from_config(f, cfg, "rollout", TOOL_KEYS):
        raise ToolInputError(
            "rollout.tools differs from config.toml's: a tool call may not choose the tool servers a run starts or "
            "calls (a stdio server is a program run on this machine); set [rollout.tools] in config.toml or on the "
            "CLI (vapo-mcp train --set 'rollout.tools.servers=[...]') and call again without that override (or "
            "preset value)")


def _check_sink_destinations(f: Files, cfg: TrainConfig) -> None:
    """A metric sink's destination receives the run's metrics and the tracker credentials of the environment: a
    tool call may not point it at another host."""
    changed = _changed_from_config(f, cfg, "logging", SINK_DESTINATION_KEYS)
    if changed:
        raise ToolInputError(
            f"logging.{changed[0]} differs from config.toml's: a tool call may not change where a metric sink sends "
            "the run's metrics and the tracker credentials (logging.mlflow_tracking_uri comes from config.toml or "
            f"the CLI only: vapo-mcp train --set logging.{changed[0]}=...); call again without that override (or "
            "preset value)")


def _check_paths(f: Files, cfg: TrainConfig, policy: Policy) -> None:
    """Every path field of the config (vapo_engine.config.path_fields: each field typed PathText) inside the roots;
    a task spec by the files it may read."""
    roots = allowed_roots(f, policy)
    for key in path_fields():
        value = get_path(cfg, key)
        if key in TASK_SPECS:
            for candidate in jsonl_candidates(value, Path(cfg.data.data_dir)):
                confine(candidate, f, policy, roots=roots, shown=value)
        elif value:
            confine(value, f, policy, roots=roots)


def jsonl_candidates(spec: str, data_dir: Path) -> list[Path]:
    """Every file `vapo_engine.tasks.get_task(spec, data_dir)` may read: none for `builtin:…`; a `.jsonl`
    path (absolute, or relative to the working directory or to data_dir); else `<data_dir>/<spec>.jsonl`."""
    spec = spec.strip()
    if spec.startswith(BUILTIN_PREFIX):
        return []
    if spec.endswith(".jsonl"):
        p = Path(spec).expanduser()
        return [p] if p.is_absolute() else [Path.cwd() / p, data_dir / p]
    return [data_dir / f"{spec}.jsonl"]
