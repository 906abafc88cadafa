"""The API's error shape for Redis failures: an exhausted connection pool is not an outage."""

from __future__ import annotations

import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from coordinator.api.errors import install_error_handlers


def _app_raising(exc: Exception) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    def boom() -> None:
        raise exc

    return TestClient(app)


def test_a_busy_pool_is_a_503_to_retry_not_redis_down() -> None:
    # What redis-py's BlockingConnectionPool raises when no connection came free in time.
    response = _app_raising(redis.ConnectionError("No connection available.")).get("/boom")

    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    error = response.json()["error"]
    assert error["code"] == "redis_busy"
    assert "unreachable" not in error["message"]


def test_an_unreachable_redis_is_named_as_such() -> None:
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    response = _app_raising(refused).get("/boom")

    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "redis_unavailable"
    assert error["message"].startswith("Redis is unreachable: Error 111")
