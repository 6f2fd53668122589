"""The command line of a model server (shared by `vapo-mcp serve-model` and `python -m vapo_engine.serving`)
and the options object the server runs with. Torch-free."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

from vapo_engine.errors import UserError

from .limits import BODY_TIMEOUT_S, MAX_CONCURRENT

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass(frozen=True)
class ServeOptions:
    target: Path
    """A run directory or a Hugging Face model directory (a run id is resolved to its directory first)."""
    step: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    max_batch: int = 16
    batch_window_ms: float = 20.0
    default_max_tokens: int = 512
    device: str = "auto"
    dtype: str = "auto"
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)
    log_level: str = "info"
    weight_root: Path | None = None
    """Where POST /rollout/load_weights may read weights from (None: it loads none)."""
    max_concurrent: int = MAX_CONCURRENT
    """Requests in progress at once; one more gets 503 (limits.py)."""
    body_timeout_s: float = BODY_TIMEOUT_S
    """Seconds a client has to send its whole request body; a slower one gets 408 (limits.py)."""


def int_in(lo: int, hi: int):
    """An argparse type: an integer in lo..hi (argparse prints the message and exits 2 otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is out of range {lo}..{hi}")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser, *, target_help: str) -> None:
    p.add_argument("target", metavar="RUN_ID|DIR", help=target_help)
    p.add_argument("--step", type=int_in(0, 10**9), help="serve the checkpoint of this policy step "
                                                            "(default: the newest that verifies)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; any other needs "
                                                      "VAPO_MCP_TOKEN)")
    p.add_argument("--port", type=int_in(0, 65535), default=8000, help="port (default 8000; 0 = any free)")
    p.add_argument("--model-name", help="the model id clients send (default: the run id or the folder's "
                                        "name); set it to settings.json's models.reasoning to use every channel "
                                        "tool as is")
    p.add_argument("--max-batch", type=int_in(1, 256), default=16,
                   help="most rows (requests × n) that share one generate call (default 16)")
    p.add_argument("--batch-window-ms", type=int_in(0, 1000), default=20,
                   help="how long the first waiting request waits for others to batch with (default 20)")
    p.add_argument("--max-tokens", type=int_in(1, 1_000_000), default=512, dest="default_max_tokens",
                   help="new tokens when a request sets no max_tokens (default 512, capped by the context)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="weights dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="extra Host header name clients may use (DNS-rebinding protection); '*' = any; repeatable")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    p.add_argument("--weight-root", metavar="DIR", help="let trainers push weights (POST /rollout/load_weights) "
                                                        "from directories under DIR (rollout.weights_dir, by "
                                                        "default under the run's directory); default: none")
    p.add_argument("--max-concurrent", type=int_in(1, 100_000), default=MAX_CONCURRENT, metavar="N",
                   help="requests in progress at once (streams count until they end); one more is answered 503 "
                        f"'server busy' (default {MAX_CONCURRENT}; GET /health is never refused)")
    p.add_argument("--body-timeout", type=int_in(1, 3600), default=int(BODY_TIMEOUT_S), dest="body_timeout_s",
                   metavar="SECONDS",
                   help=f"seconds a client has to send its whole request body, else 408 (default {BODY_TIMEOUT_S:g})")


def options_from(args: argparse.Namespace, target: str | Path) -> ServeOptions:
    if args.model_name is not None and not NAME.match(args.model_name):
        raise UserError(f"--model-name {args.model_name[:60]!r}: use 1-128 letters, digits and ._:/@+- "
                        "(it is the model id clients send)")
    return ServeOptions(target=Path(target), step=args.step, host=args.host, port=args.port,
                        model_name=args.model_name, max_batch=args.max_batch, batch_window_ms=args.batch_window_ms,
                        default_max_tokens=args.default_max_tokens, device=args.device, dtype=args.dtype,
                        allowed_hosts=tuple(args.allowed_host), log_level=args.log_level,
                        weight_root=Path(args.weight_root).expanduser() if args.weight_root else None,
                        max_concurrent=args.max_concurrent, body_timeout_s=float(args.body_timeout_s))
