"""Every use of the MCP SDK's internals goes through server/sdk.py, and that module fails loudly, naming the installed
SDK version, when one of them changes (an upgrade must not silently drop a bound such as the subscription limits or
the tasks capability). pyproject.toml pins the range the adapter was written for."""
from __future__ import annotations

import re
from importlib.metadata import version

import pytest

from tests.conftest import ROOT

INTERNALS = re.compile(r"_lowlevel_server|\._connection\b|get_capabilities\s*=|(?<!sdk\.)add_request_handler\(|"
                       r"(?<!sdk\.)get_request_handler\(|\._dispatcher|\._stamp|\._prompt_manager|\._resource_manager|"
                       r"\._tool_manager")


def test_the_sdks_internals_are_where_the_adapter_expects_them():
    from server import sdk
    from server.app import build_server
    sdk.check(build_server())  # raises SDKChanged("mcp X.Y.Z (this adapter: mcp 2.3) no longer has …") otherwise


def test_a_changed_internal_is_reported_with_the_installed_version():
    from server import sdk
    with pytest.raises(sdk.SDKChanged) as e:
        sdk.lowlevel(object())  # an MCPServer without the low-level server it used to have
    assert f"mcp {version('mcp')}" in str(e.value) and "server/sdk.py" in str(e.value)


def test_only_the_adapter_reaches_into_the_sdk():
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "server").rglob("*.py") if p.name != "sdk.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if INTERNALS.search(line)]
    assert not offenders, offenders


def test_the_pinned_range_is_the_one_the_adapter_was_written_for():
    from server import sdk
    pinned = re.search(r'"mcp>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned and sdk.TESTED == f"mcp {pinned.group(1)}"
    installed = tuple(int(x) for x in version("mcp").split(".")[:2])
    assert tuple(int(x) for x in pinned.group(1).split(".")) <= installed < tuple(
        int(x) for x in pinned.group(2).split(".")), f"mcp {version('mcp')} is outside the pinned range"
