"""Turn the errors an agent can act on into `ToolError` (with the fix); everything else stays a crash."""
from __future__ import annotations

import functools

from mcp.server.mcpserver.exceptions import ToolError

from tools.paths import ToolInputError
from vapo_engine.config import ConfigError
from vapo_engine.jobs import RunError
from vapo_engine.tasks import TaskError

AGENT_FIXABLE = (ConfigError, ToolInputError, RunError, TaskError, ValueError, FileNotFoundError)


def agent_errors(fn):
    """Decorator for async tool functions: agent-fixable exceptions become `ToolError(message)`."""
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except ToolError:
            raise
        except AGENT_FIXABLE as e:
            raise ToolError(str(e)) from None
    return wrapper
