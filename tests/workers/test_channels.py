"""Two stacks on one Redis server, on different databases, do not hear each other."""

from __future__ import annotations

import redis
import redis_server

from workers.events import EventBus
from workers.reload import reload_channel


def _reload_channel(client: redis.Redis) -> str:
    """The channel a follower on ``client``'s database listens to."""
    return reload_channel(client)


def test_a_reload_on_one_database_is_not_heard_on_another() -> None:
    ours = redis.Redis.from_url(redis_server.url(6))
    theirs = redis.Redis.from_url(redis_server.url(7))
    listening = ours.pubsub(ignore_subscribe_messages=True)
    listening.subscribe(_reload_channel(ours))
    try:
        theirs.publish(_reload_channel(theirs), "41")  # the other stack's reload
        assert listening.get_message(timeout=1.0) is None
        ours.publish(_reload_channel(ours), "42")
        message = listening.get_message(timeout=5.0)
        assert message is not None and message["data"] == b"42"
    finally:
        listening.close()
        ours.close()
        theirs.close()


def test_session_channels_carry_the_database() -> None:
    ours = EventBus(redis.Redis.from_url(redis_server.url(6)))
    theirs = EventBus(redis.Redis.from_url(redis_server.url(7)))
    assert ours.keys("s1").channel == "ongrid:db6:live:s1"
    assert theirs.keys("s1").channel == "ongrid:db7:live:s1"
    assert ours.keys("s1").stream == theirs.keys("s1").stream  # keys are per database anyway
