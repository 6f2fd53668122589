"""`vapo-mcp serve --http` refuses a port it cannot listen on with one line naming the port, exit 2, no
traceback: not a number, out of range (argparse), or already in use (a real process against a real socket)."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_workspace

from server.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("port", ["abc", "70000", "-1", "0"])
def test_a_bad_port_value_is_refused_by_name(capsys, port):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--http", "--port", port])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --port" in err and port in err
    assert "not a port number" in err and "1..65535" in err and "Traceback" not in err


def test_a_port_in_use_is_one_error_naming_it(tmp_path, clean_env):
    config, settings = write_workspace(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--http", "--port", str(port),
                            "--config", str(config), "--settings", str(settings)],
                           check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}: the port is already in use" in r.stderr
    assert "--port" in r.stderr and "Traceback" not in r.stderr


def test_the_listen_socket_helper_names_the_address():
    from vapo_engine.errors import UserError
    from vapo_engine.serving.listen import bind_listen_socket
    with pytest.raises(UserError, match="--port 70000: not a port number"):
        bind_listen_socket("127.0.0.1", 70000)
    with pytest.raises(UserError, match="no such address"):
        bind_listen_socket("192.0.2.1", 0)
    sock = bind_listen_socket("127.0.0.1", 0)
    sock.close()
