"""serve-model's `/rollout/load_weights` reads weight files the one safe way (vapo_engine/serving/rollout_service.py,
vapo_engine/datafiles.py). Reproductions as found, each on a real serve-model (in-thread uvicorn on 127.0.0.1):

- a FIFO named `model.safetensors` under --weight-root froze the whole server, /health too (the reader blocked
  in an open that held the interpreter);
- a `model.safetensors` symlink to a file outside --weight-root was loaded;
- a malformed `model.safetensors` gave 500.
Each is now a 400 naming the file, at once, and /health answers meanwhile.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx

from tests.serving_helpers import serving

TOKEN = "weights-test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _load(s, folder) -> httpx.Response:
    return httpx.post(s.root + "/rollout/load_weights", json={"path": str(folder), "version": 3}, headers=AUTH,
                      timeout=60)


def test_fifo_symlink_and_malformed_weight_files_are_400_at_once(tmp_path, model_dir):
    root = tmp_path / "root"
    fifo_dir, link_dir, junk_dir = root / "fifo", root / "link", root / "junk"
    for d in (fifo_dir, link_dir, junk_dir):
        d.mkdir(parents=True)
    fifo = fifo_dir / "model.safetensors"
    os.mkfifo(fifo)
    (link_dir / "model.safetensors").symlink_to(next(model_dir.glob("*.safetensors")))  # outside the root
    (junk_dir / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}" + os.urandom(64))
    # a writer that opens the FIFO after 8 s, so a server that blocked on it comes back (and the test can fail)
    writer = (f"import os, time; time.sleep(8); fd = os.open({str(fifo)!r}, os.O_WRONLY); os.write(fd, b'x' * 16); "
              "os.close(fd)")
    unblock = subprocess.Popen([sys.executable, "-c", writer])
    try:
        with serving(model_dir, token=TOKEN, weight_root=root) as s:
            health: list[float] = []

            def probe():
                for _ in range(6):
                    t0 = time.monotonic()
                    httpx.get(s.root + "/health", timeout=30)
                    health.append(time.monotonic() - t0)
                    time.sleep(0.3)
            prober = threading.Thread(target=probe)
            prober.start()
            t0 = time.monotonic()
            r = _load(s, fifo_dir)
            took = time.monotonic() - t0
            prober.join(60)
            assert r.status_code == 400 and "model.safetensors" in r.text and "not a regular file" in r.text, r.text
            assert took < 3 and max(health) < 2, (took, health)
            r = _load(s, link_dir)
            assert r.status_code == 400 and "symbolic link" in r.json()["error"]["message"], r.text
            r = _load(s, junk_dir)
            assert r.status_code == 400 and "not a valid safetensors file" in r.json()["error"]["message"], r.text
            info = httpx.get(s.root + "/rollout/info", headers=AUTH, timeout=30).json()
            assert info["weight_version"] == 0  # nothing was loaded
    finally:
        unblock.kill()
        unblock.wait(timeout=10)
