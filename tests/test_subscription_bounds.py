"""`resources/subscribe` is bounded (server/subscriptions.py, docs/security.md "Bounds"). The reproduction: 300
subscriptions to 3.5 MB URIs pinned 1.0 GiB of the server, and stayed after the session was deleted. Now a URI must
be one the server notifies, of a run that exists, short; a connection holds at most 64, the server 4096; a
connection's subscriptions end with it. In memory, with the SDK's client in the 2025-11-25 form."""
from __future__ import annotations

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.mcp_helpers import slot_held

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:resources/subscribe is removed")]


def _runs(n: int) -> list[str]:
    """`n` registered runs (directories and records, nothing started)."""
    from tools.paths import files, manager_for
    mgr, _ = manager_for(files())
    ids = []
    for i in range(n):
        run_dir = mgr.root / "bounds" / f"sub{i}"
        run_dir.mkdir(parents=True)
        mgr.registry.add(f"sub{i}", "bounds", [], run_dir)
        ids.append(f"sub{i}")
    return ids


async def _refused(c, uri: str) -> str:
    with pytest.raises(MCPError) as e:
        await c.session.subscribe_resource(uri)
    assert e.value.error.code == -32602
    return e.value.error.message


async def test_subscriptions_are_checked_counted_and_end_with_the_connection(proj):
    from server.app import build_server
    server = build_server()
    with slot_held(proj / "logs"):
        ids = _runs(17)
        async with Client(server, mode="legacy") as c:
            assert "too long" in await _refused(c, "vapo://runs/" + "x" * 3_500_000)
            assert "cannot subscribe" in await _refused(c, "file:///etc/passwd")
            assert "cannot subscribe" in await _refused(c, f"vapo://runs/{ids[0]}/config/../x")
            assert "unknown run id 'nope'" in await _refused(c, "vapo://runs/nope/log")
            assert "wrong form" in await _refused(c, "vapo://runs/..")
            await c.session.subscribe_resource("vapo://runs")
            uris = [f"vapo://runs/{r}{part}" for r in ids for part in ("", "/metrics", "/log", "/plot.png")]
            for uri in uris[:63]:
                await c.session.subscribe_resource(uri)
            await c.session.subscribe_resource(uris[0])  # again: no second entry
            assert server.run_watch.held == 64
            assert "holds 64 subscriptions" in await _refused(c, uris[63])
            await c.session.unsubscribe_resource(uris[0])
            await c.session.subscribe_resource(uris[63])
        assert server.run_watch.held == 0 and not server.run_watch.subscribed  # ended with the connection


async def test_a_listen_stream_is_checked_like_a_subscription(proj):
    from server.app import build_server
    with slot_held(proj / "logs"):
        run_id = _runs(1)[0]
        async with Client(build_server()) as c:
            assert c.session.protocol_version == "2026-07-28"
            for uris, needle in ((["vapo://runs/" + "y" * 5000], "too long"), (["vapo://runs/nope"], "unknown run id"),
                                 ([f"vapo://runs/{run_id}"] * 65, "at most 64")):
                with pytest.raises(MCPError) as e:
                    async with c.listen(resource_subscriptions=uris):
                        pass
                assert needle in e.value.error.message
            async with c.listen(resource_subscriptions=[f"vapo://runs/{run_id}/log"]):
                pass
