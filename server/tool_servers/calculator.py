"""`vapo-mcp tool-server calculator`: one MCP tool, `calculate(expression)`, exact arithmetic for a policy that
cannot multiply reliably in its head.

The expression is parsed with `ast` and evaluated by walking the tree: numbers (int or float), + − * / // % **,
unary ± and parentheses; nothing else (no names, calls, attributes, subscripts, comparisons), never `eval`.
Sizes are bounded so no call can take long or grow large: at most 200 characters and 64 tree nodes, integers of at
most 10**30 in magnitude along the way, exponents at most 64 (and the result bounded), no division by zero.
Results: an integer as its digits; a non-integral value with up to 10 significant digits. A bad expression is a
tool error whose text says what is wrong (the policy sees it as an observation).
"""
from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 200
MAX_NODES = 64
MAX_ABS = 10 ** 30
MAX_EXPONENT = 64

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """An expression the calculator refuses; the message says why."""


def calculate(expression: str) -> str:
    """The value of an arithmetic `expression` as text (see the module docstring); CalcError when refused."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("empty expression: give numbers and + - * / // % ** ( ), e.g. 37*24")
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError(f"not an arithmetic expression: {expression[:60]!r}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError(f"expression has more than {MAX_NODES} parts")
    return _format(_value(tree.body))


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or (left == 0 and right < 0)):
            raise CalcError(f"exponent out of range (at most {MAX_EXPONENT}, and 0 has no negative powers)")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalcError("division by zero")
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and abs(left) > 1 and right > 0 \
                and right * math.log10(abs(left)) > 30:
            raise CalcError("result too large (more than 30 digits)")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except (OverflowError, ZeroDivisionError, ValueError):
            raise CalcError("result out of range") from None
    raise CalcError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def _bounded(x):
    if isinstance(x, complex) or (isinstance(x, float) and not math.isfinite(x)) or abs(x) > MAX_ABS:
        raise CalcError("result out of range (more than 30 digits)")
    return x


def _format(x: float) -> str:
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return str(x) if isinstance(x, int) else f"{x:.10g}"


def build():
    """The MCP server (stdio or any transport the SDK's `run` takes)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("vapo-calculator", instructions="Exact arithmetic: calculate('37*24') -> '888'.")

    @server.tool(name="calculate", structured_output=False)
    def calculate_tool(expression: str) -> str:
        """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses (e.g. 37*24)."""
        try:
            return calculate(expression)
        except CalcError as e:
            raise ToolError(str(e)) from None
    return server
