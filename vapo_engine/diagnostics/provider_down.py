"""Why a training run stopped using the provider, in the knowledge base's words.

`ProviderWorker` (vapo_engine.providers) decides *that* the provider is down (401, 403, 404 after the fallback,
quota exhausted, …); this module says *why* and *what to do*, by the same route `check_channel` takes: an
`Evidence` built from the channel (key shape, base URL, proxy) and the live error, ranked by `diagnose()`. It lives
here, not in providers, because diagnostics imports providers; the worker receives it as its `explain` hook:

    worker = ProviderWorker(channel, explain=partial(explain_provider_down, channel=channel))
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from vapo_engine.config import Channel
from vapo_engine.providers import ProviderDown, ProviderError, plain_down

from .engine import diagnose
from .evidence import Evidence
from .gather import channel_facts, error_facts


def explain_provider_down(exc: ProviderError, kind: str, *, channel: Channel | None = None,
                          env: Mapping[str, str] | None = None) -> ProviderDown:
    """The verdict for `exc` (already judged 'down' of `kind`) with the top finding's title and fix. The channel
    is the one the failing requests used, so its facts (a missing key, a repaired URL) are the cause here."""
    fields: dict[str, Any] = channel_facts(channel, os.environ if env is None else env) if channel else {}
    fields.update({k: v for k, v in error_facts(exc).items() if v not in (None, {}, "")})
    fields["inputs"] = ["provider samples"]
    diagnosis = diagnose(Evidence(**fields))
    if not diagnosis.findings:
        return plain_down(exc, kind)
    top = diagnosis.findings[0]
    return ProviderDown(kind=kind, reason=exc.short()[:400], status=exc.status, title=top.title, fix=top.fix,
                        rule_id=top.rule_id)
