"""The per-user session count the API checks before a new chat (coordinator.api.limits):
read from a real database, reused only while it is fresh and far from the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.api.limits import SessionCounts
from coordinator.storage.chats import ChatStore
from coordinator.storage.engine import make_engine, upgrade


class CountedStore(ChatStore):
    """The real store, counting how often the sessions are counted."""

    queries = 0

    def count_sessions(self, user: str) -> int:
        self.queries += 1
        return super().count_sessions(user)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def chats(tmp_path: Path) -> CountedStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'ongrid.db'}")
    upgrade(engine)
    return CountedStore(engine)


def start(chats: ChatStore, counts: SessionCounts, user: str, n: int = 1) -> None:
    """``n`` sessions started through this process, as the chat endpoint starts them."""
    for _ in range(n):
        chats.create_session(user, "a chat")
        counts.started(user)


def test_far_from_the_bound_a_fresh_count_is_reused_and_kept_up_to_date(
    chats: CountedStore,
) -> None:
    clock = Clock()
    counts = SessionCounts(fresh_seconds=5, clock=clock)
    assert counts.kept(chats, "ann", 100) == 0 and chats.queries == 1
    start(chats, counts, "ann", 3)
    assert counts.kept(chats, "ann", 100) == 3 and chats.queries == 1
    # Another process's session is seen once the figure is stale.
    chats.create_session("ann", "from elsewhere")
    assert counts.kept(chats, "ann", 100) == 3
    clock.now += 5
    assert counts.kept(chats, "ann", 100) == 4 and chats.queries == 2
    # Users are counted apart.
    assert counts.kept(chats, "bob", 100) == 0 and chats.queries == 3


def test_near_the_bound_every_check_reads_the_database(chats: CountedStore) -> None:
    clock = Clock()
    counts = SessionCounts(fresh_seconds=5, clock=clock)
    start(chats, counts, "ann", 8)
    assert counts.kept(chats, "ann", 10) == 8
    queries = chats.queries
    assert counts.kept(chats, "ann", 10) == 8 and chats.queries == queries  # 2 below: reused
    start(chats, counts, "ann")
    # 9 is within a tenth of 10 (at least 1) of the bound: read each time, however fresh.
    assert counts.kept(chats, "ann", 10) == 9
    chats.create_session("ann", "from elsewhere")
    assert counts.kept(chats, "ann", 10) == 10
    assert chats.queries == queries + 2
    # A deleted session is seen at once as well.
    session = chats.list_sessions("ann", limit=1)[0]
    assert chats.delete_session(session.id, "ann")
    assert counts.kept(chats, "ann", 10) == 9


def test_the_bound_is_never_passed_by_one_process(chats: CountedStore) -> None:
    counts = SessionCounts(fresh_seconds=3600, clock=Clock())
    bound, made = 50, 0
    while counts.kept(chats, "ann", bound) < bound:
        start(chats, counts, "ann")
        made += 1
    assert made == bound and chats.count_sessions("ann") == bound
    # Checks far from the bound cost no query; only the last tenth of the way read each time.
    assert chats.queries <= 1 + bound // 10 + 2


def test_stale_users_are_forgotten_past_the_bound_of_users(
    chats: CountedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    counts = SessionCounts(fresh_seconds=5, clock=clock)
    monkeypatch.setattr(SessionCounts, "KEPT_USERS", 3)
    for user in ("a", "b", "c"):
        counts.kept(chats, user, 100)
    clock.now += 10
    counts.kept(chats, "d", 100)
    assert set(counts._known) == {"d"}
