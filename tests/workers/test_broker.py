"""The broker transport: kombu's Redis transport, one client per channel, against real Redis."""

from __future__ import annotations

import threading

import redis
from kombu import Connection, Exchange, Queue

from registry.settings import Settings
from workers._kombu_redis import Channel
from workers.celery_app import make_celery


def test_a_redis_broker_uses_one_client_per_channel_and_still_delivers(
    r: redis.Redis, spawn_redis_url: str
) -> None:
    """Messages published through one channel arrive, in order, under the stack's key prefix;
    the channel built one Redis client for all of them."""
    settings = Settings(redis_url=spawn_redis_url, cluster="blue")
    app = make_celery(settings)
    built = 0
    create = redis.Redis.__init__

    here = threading.get_ident()  # clients other threads of the process make are not ours

    def counting(self: redis.Redis, *args: object, **kwargs: object) -> None:
        nonlocal built
        built += threading.get_ident() == here
        create(self, *args, **kwargs)  # type: ignore[arg-type]

    queue = Queue("broker-test", Exchange("broker-test"), routing_key="broker-test")
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        producer = connection.Producer(channel)
        redis.Redis.__init__ = counting  # type: ignore[method-assign]
        try:
            for i in range(20):
                producer.publish(
                    {"i": i}, exchange=queue.exchange, routing_key="broker-test", declare=[queue]
                )
        finally:
            redis.Redis.__init__ = create  # type: ignore[method-assign]
    assert built <= 1
    assert r.llen("ongrid:blue:broker-test") == 20
    with Connection(
        spawn_redis_url, transport_options={"global_keyprefix": "ongrid:blue:"}
    ) as plain:
        received = [plain.SimpleQueue(queue).get(timeout=5) for _ in range(20)]
        assert [m.payload["i"] for m in received] == list(range(20))


def test_other_brokers_keep_kombus_transport() -> None:
    from workers.celery_app import _broker_transport

    assert _broker_transport("redis://h:6379/0") == _broker_transport("rediss://h/0")
    assert _broker_transport("sentinel://h:26379") is None
    assert _broker_transport("memory://") is None
