"""The one error contract of the project: which exceptions are the caller's to fix.

Every exception that derives from `UserError` carries a message that names what is wrong (the file, field,
argument or run) and what to do about it. Front-ends treat them alike: the CLI prints the message and exits 2
(no traceback); the MCP server raises `ToolError(message)`. Anything else is a bug and stays a crash.
Torch-free and dependency-free, so every layer can import it.
"""
from __future__ import annotations


class UserError(ValueError):
    """A mistake the caller can fix; the message says how."""


class StorageError(UserError):
    """The run directory, the log dir or the run registry cannot be read or written (permissions, full disk,
    a damaged file); the message names the path and the fix."""


def is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, UserError)

