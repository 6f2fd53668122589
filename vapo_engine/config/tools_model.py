"""config.toml [rollout.tools]: the MCP tool servers a multi-turn episode (`rollout.episode = "tool_calls"`) gives
the policy, and the bounds of its episodes (docs/training.md#tools, docs/design.md §3.14).

Each server is a stdio command (started by the trainer, its own process) or a streamable-HTTP URL. These settings
start programs on this machine, so they come from config.toml or the CLI only: a tool call of this MCP server
(start_training, ablate) may not change them (tools/access.py). Torch-free.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import Section
from .errors import FieldProblem

TOOL_SERVER_NAME = r"^[a-z][a-z0-9_-]{0,39}$"


class ToolServerConfig(Section):
    """One MCP server of [[rollout.tools.servers]]: `name`, and `command` (stdio) or `url` (streamable HTTP)."""

    name: str = Field(pattern=TOOL_SERVER_NAME)
    """A short name for logs and errors (e.g. "calc")."""
    command: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(None, min_length=1,
                                                                                       max_length=64)
    """The program and its arguments, e.g. ["vapo-mcp", "tool-server", "calculator"] (the built-in calculator). A
    program without a path is looked up on PATH; "vapo-mcp" is this installation's own command when PATH lacks it.
    It gets the MCP SDK's minimal environment (HOME, PATH, ...), never the server's token or API key."""
    url: str | None = Field(None, pattern=r"^https?://[^\s/?#@]+(/[^\s?#]*)?$", max_length=500)
    """The server's streamable-HTTP endpoint, e.g. "http://127.0.0.1:8900/mcp"."""

    def where(self) -> str:
        """How the server is reached, for messages: its command line or its URL."""
        return " ".join(self.command) if self.command else str(self.url)

    def program(self) -> str | None:
        """The stdio command's program as it will be run: a path, a name found on PATH, or "vapo-mcp" as this
        installation's own command when PATH lacks it; None when it cannot be found (or for a URL)."""
        if not self.command:
            return None
        name = self.command[0]
        if shutil.which(name):
            return shutil.which(name)
        own = Path(sys.executable).parent / "vapo-mcp"
        return str(own) if name == "vapo-mcp" and own.is_file() else None


class ToolsConfig(Section):
    """[rollout.tools]: tool servers and the bounds of a tool-calling episode."""

    servers: list[ToolServerConfig] = Field(default_factory=list, max_length=16)
    """The MCP servers whose tools the policy may call (every tool each lists); empty = none. Written in
    config.toml as [[rollout.tools.servers]] tables, or on the CLI as
    --set 'rollout.tools.servers=[{name="calc", command=["vapo-mcp", "tool-server", "calculator"]}]'."""
    max_turns: int = Field(4, ge=1, le=64)
    """Most policy turns in one episode: after each tool call the policy writes again, so at most max_turns − 1
    calls; a call written in the last turn is not run. The whole episode (policy tokens and tool results) is
    bounded by model.max_tokens, the token budget."""
    call_timeout_s: float = Field(10.0, gt=0, le=600)
    """Seconds one tool call may take; past it the policy sees a timeout error as the result (and a server that
    then does not answer a tools/list request within 5 s is restarted)."""
    start_timeout_s: float = Field(60.0, gt=0, le=600)
    """Seconds a server may take to start and list its tools; a server that cannot refuses the run at start."""
    max_result_chars: int = Field(1000, ge=16, le=100_000)
    """A tool result longer than this is cut to it (with a note saying how much was cut) before it is tokenized."""
    max_restarts: int = Field(5, ge=0, le=1000)
    """How often a server that crashed or hung is restarted during a run; after that its calls answer
    'unavailable' (the run goes on)."""
    format: Literal["auto", "tags", "chat"] = "auto"
    """How the policy writes a call and sees a result: chat = the chat template's tool format (the tools' schemas
    rendered by the template, calls as <tool_call>{"name": ..., "arguments": {...}}</tool_call>, results as the
    template's tool message: Qwen2.5 / Hermes-style templates); tags = plain text, <call>NAME ARGS</call> then
    <result>TEXT</result> (ARGS: a JSON object, or text for the tool's one string parameter), for plain models
    and the built-in model; auto = chat when the prompts use a chat template whose rendering shows the tools,
    else tags."""

    @model_validator(mode="after")
    def _one_transport(self) -> ToolsConfig:
        for i, srv in enumerate(self.servers):
            if (srv.command is None) == (srv.url is None):
                raise FieldProblem("rollout.tools.servers", f"servers[{i}] ({srv.name!r}) needs exactly one of "
                                   "command (stdio) and url (streamable HTTP)", "give it command = [\"program\", "
                                   "\"arg\", ...] or url = \"http://host:port/mcp\"")
        return self
