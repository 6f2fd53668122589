"""The doctor's check of [rollout.tools] (docs/design.md §3.14): every MCP tool server a tool-calling run would start must be
startable — a stdio program found (on PATH, a path, or this installation's vapo-mcp), an HTTP server's port
open — so start_training refuses at the call, not in the worker's log. Nothing is started here."""
from __future__ import annotations

from .findings import Finding, error, info
from .network import tcp_problem, url_endpoint


def tool_findings(cfg) -> list[Finding]:
    """One finding per tool server of a tool_calls run (none for single-turn runs)."""
    if cfg.rollout.episode != "tool_calls":
        return []
    out = []
    for i, srv in enumerate(cfg.rollout.tools.servers):
        key = f"rollout.tools.servers[{i}] ({srv.name})"
        if srv.command:
            program = srv.program()
            out.append(info("tools", f"{key}: {srv.where()!r} runs {program}", server=srv.name) if program else
                       error("tools", f"{key}: {srv.command[0]!r} is not an executable file and not on PATH",
                             "install it, give its full path in command, or remove the server", server=srv.name))
            continue
        host, port = url_endpoint(str(srv.url))
        problem = tcp_problem(host, port)
        out.append(error("tools", f"{key}: {problem}", "start the server, or fix url", server=srv.name) if problem
                   else info("tools", f"{key}: {srv.url} accepts connections", server=srv.name))
    return out
