"""Built-in MCP tool servers that a run's policy can call (`vapo-mcp tool-server NAME`, stdio): the tools a
multi-turn episode gives the policy (`[rollout.tools]` in config.toml, docs/training.md#tools). Each is one module
here with a `build() -> MCPServer`; `TOOL_SERVERS` names them.

Adding one: a module `server/tool_servers/<name>.py` with `build()` (one file) and its line below (one line).
Any other MCP server works too (a stdio command or a streamable-HTTP URL in `[rollout.tools]`); these are the ones
that ship. Torch-free.
"""
from __future__ import annotations

from vapo_engine.registry import Registry

TOOL_SERVERS = Registry("tool server", entries={
    "calculator": "server.tool_servers.calculator",
})
"""Name → the module whose `build()` makes the server."""
