"""The SDK's `MCPServer` with answers an agent can act on, under this server's access policy.

- Tools: an unknown tool, an argument the tool does not take, or one that fails validation gets a message naming
  the argument, what is allowed and what to do (server.arguments) instead of pydantic's text or a silent drop.
- Prompts: an unknown prompt, a missing or unexpected argument is an invalid-params error (-32602) with the same
  kind of message; the SDK would answer code 0 (or -32603) and log a traceback.
- Resources: an unknown URI is an invalid-params error that names the resources, not an echo of the URI.
- stdio: a line that cannot be decoded is answered (server.sdk.run_stdio).
Every call runs under `policy`, the security model of this server's clients (tools.access). What any of these
answer is scrubbed on its way out (server.scrubbing). Imports no torch.
"""
from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import ValidationError

from tools import access

from . import arguments as arguments_text
from . import sdk

RESOURCES = ("vapo://runs, vapo://runs/{run_id} and its /metrics, /log, /plot.png and /config (resources/list and "
             "resources/templates/list describe them)")


class VapoMCPServer(MCPServer):
    """See the module docstring."""

    def __init__(self, *args, policy: access.Policy, **kwargs):
        super().__init__(*args, **kwargs)
        self.policy = policy

    async def call_tool(self, name: str, arguments: dict, context: Context | None = None):
        with access.applied(self.policy):
            return await self._checked_call(name, arguments, context)

    async def _checked_call(self, name: str, arguments: dict, context: Context | None):
        schemas = {t.name: t.input_schema for t in await self.list_tools()}
        if name not in schemas:
            raise ToolError(arguments_text.unknown_tool(name, sorted(schemas)))
        if (extra := arguments_text.unexpected_arguments(name, arguments, schemas[name])) is not None:
            raise ToolError(extra)
        try:
            return await super().call_tool(name, arguments, context)
        except UnexpectedToolError:
            raise
        except ToolError as e:
            if isinstance(e.__cause__, ValidationError):
                raise ToolError(arguments_text.describe_validation(name, e.__cause__, schemas[name])) \
                    from e.__cause__
            raise

    async def get_prompt(self, name: str, arguments: dict | None = None, context: Context | None = None):
        prompts = {p.name: p for p in await self.list_prompts()}
        if name not in prompts:
            raise MCPError(INVALID_PARAMS, arguments_text.unknown_prompt(name, sorted(prompts)))
        declared = prompts[name].arguments or []
        given = arguments or {}
        schema = {"properties": {a.name: {"description": a.description or ""} for a in declared}}
        if (extra := arguments_text.unexpected_arguments(f"prompt {name}", given, schema)) is not None:
            raise MCPError(INVALID_PARAMS, extra)
        missing = [a for a in declared if a.required and given.get(a.name) is None]
        if missing:
            raise MCPError(INVALID_PARAMS, arguments_text.missing_prompt_argument(name, missing[0].name,
                                                                                  missing[0].description))
        try:
            return await super().get_prompt(name, arguments, context)
        except ValueError as e:  # the SDK's "Error rendering prompt" around a type error of an argument
            cause = e.__cause__.__cause__ if isinstance(e.__cause__, ValueError) else e.__cause__
            if isinstance(cause, ValidationError):
                raise MCPError(INVALID_PARAMS, arguments_text.describe_validation(f"prompt {name}", cause, schema)) \
                    from None
            raise MCPError(INVALID_PARAMS, f"prompt {name} could not be filled in with these arguments; check them "
                                           "against prompts/list") from None

    async def read_resource(self, uri, context: Context | None = None):
        try:
            return await super().read_resource(uri, context)
        except ResourceNotFoundError:
            raise MCPError(INVALID_PARAMS, f"unknown resource {arguments_text.show(str(uri))}: this server has "
                                           f"{RESOURCES}") from None

    async def run_stdio_async(self) -> None:
        await sdk.run_stdio(self)
