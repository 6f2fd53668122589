"""Turn the errors an agent can act on into `ToolError` (with the fix); everything else stays a crash.

Which errors are the caller's to fix is defined once, in `vapo_engine.errors` (`UserError` and its subclasses:
ConfigError, TaskError, RunError, ToolInputError, StorageError, …); the CLI uses the same test
(server.cli.common.report_error). A plain ValueError or OSError is a bug or an unexpected condition: the SDK
logs it and the agent sees only that the tool failed, never internal text.
"""
from __future__ import annotations

import functools

from mcp.server.mcpserver.exceptions import ToolError

from tools.paths import known_secrets
from vapo_engine.errors import is_user_error
from vapo_engine.providers.redaction import public_message


def agent_errors(fn):
    """Decorator for async tool functions: user errors become `ToolError(message)`, scrubbed of anything
    credential-shaped (a message may quote the caller's input, and the SDK logs the text)."""
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except ToolError:
            raise
        except Exception as e:
            if is_user_error(e):
                raise ToolError(public_message(e, known_secrets())) from None
            raise
    return wrapper
