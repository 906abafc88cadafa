"""coordinator.storage against SQLite always and PostgreSQL when it answers.

PostgreSQL: each test gets a fresh database ``ongrid_test_<uuid>`` created through the server in
``ONGRID_TEST_POSTGRES_URL`` (default: postgres on 127.0.0.1:5432, database ``test``) and dropped
afterwards; when that server is not reachable the PostgreSQL variants are skipped with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from postgres import fresh_database
from races import race
from sqlalchemy import Engine, func, insert, inspect, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from coordinator.storage import TARGET_METADATA
from coordinator.storage.chats import ChatStore
from coordinator.storage.engine import (
    DatabaseUnavailable,
    alembic_config,
    check,
    database_url,
    head_revision,
    locked_connection,
    make_engine,
    open_read_only,
    schema_revision,
    upgrade,
)
from coordinator.storage.personas import (
    AgentRow,
    PersonaBusy,
    PersonaExists,
    ReadOnlyUserStore,
    SqlUserStore,
)
from registry.defaults import build_registry
from registry.errors import NotFoundError, PersonaError, ReadOnlyError, UserError
from registry.parser import dump_persona, load_persona_file, parse_persona
from registry.persona import Persona, Source
from registry.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "personas" / "valid"
TABLES = {
    "agents",
    "chat_sessions",
    "chat_messages",
    "approval_audit",
    "marketplaces",
    "installed_plugins",
    "notification_deliveries",
    "notification_feeds",
    "schedules",
    "schedule_runs",
}


def _persona(name: str = "disk_checker", body: str = "# Disk checker\n", **fields) -> Persona:
    fields.setdefault("description", "Check disks.")
    return Persona(name=name, when_to_use="When a disk fills up.", body=body, **fields)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A URL of an empty database of each backend."""
    if request.param == "sqlite":
        yield make_url(f"sqlite:///{tmp_path / 'ongrid.db'}")
        return
    admin, reason = request.getfixturevalue("postgres_admin")
    if admin is None:
        pytest.skip(reason)
    with fresh_database(admin, "ongrid_test") as url:
        yield make_url(url)


@pytest.fixture
def engine(db_url: URL) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def migrated(engine: Engine) -> Engine:
    upgrade(engine)
    return engine


@pytest.fixture
def store(migrated: Engine) -> SqlUserStore:
    return SqlUserStore(migrated)


@pytest.fixture
def chats(migrated: Engine) -> ChatStore:
    return ChatStore(migrated)


def _head() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _version(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# -- migrations --------------------------------------------------------------------------------


def test_upgrade_creates_the_tables_and_a_second_run_is_a_no_op(engine: Engine) -> None:
    assert not TABLES & set(inspect(engine).get_table_names())
    upgrade(engine)
    assert set(inspect(engine).get_table_names()) >= TABLES
    assert _version(engine) == _head() == "0007"
    SqlUserStore(engine).upsert(_persona())
    upgrade(engine)
    assert _version(engine) == "0007"
    assert [p.name for p in SqlUserStore(engine).list()] == ["disk_checker"]


def test_upgrade_takes_a_url_and_concurrent_runs_wait_for_each_other(db_url: URL) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade(db_url.render_as_string(hide_password=False))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    engine = make_engine(db_url)
    try:
        assert _version(engine) == _head()
    finally:
        engine.dispose()


def test_the_migrations_match_the_models(migrated: Engine) -> None:
    with migrated.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, TARGET_METADATA) == []  # type: ignore[arg-type]


def test_downgrade_to_base_and_up_again(migrated: Engine) -> None:
    with locked_connection(migrated) as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    assert not TABLES & set(inspect(migrated).get_table_names())
    upgrade(migrated)
    assert set(inspect(migrated).get_table_names()) >= TABLES


def test_sqlite_connections_use_wal_a_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        engine.dispose()


def test_an_in_memory_sqlite_database_is_shared_by_threads() -> None:
    engine = make_engine("sqlite://")
    try:
        upgrade(engine)
        seen: list[set[str]] = []
        thread = threading.Thread(
            target=lambda: seen.append(set(inspect(engine).get_table_names()))
        )
        thread.start()
        thread.join()
        assert seen[0] >= TABLES
    finally:
        engine.dispose()


# -- settings, readiness -----------------------------------------------------------------------


def test_database_url_defaults_to_a_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data" / "nested"
    url = make_url(database_url(Settings(data_dir=data_dir)))
    assert url.drivername == "sqlite+pysqlite"
    assert url.database == str(data_dir.resolve() / "ongrid.db")
    assert data_dir.is_dir()


def test_database_url_pins_psycopg_for_postgres_urls() -> None:
    for given in ("postgres://u:p%40ss@db:5432/ongrid", "postgresql://u:p%40ss@db:5432/ongrid"):
        url = make_url(database_url(Settings(database_url=given)))
        assert (url.drivername, url.password, url.host) == ("postgresql+psycopg", "p@ss", "db")
    explicit = "postgresql+psycopg://u@db/ongrid"
    assert database_url(Settings(database_url=explicit)) == explicit


def test_check_passes_on_a_live_database(engine: Engine) -> None:
    check(engine)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////nonexistent-ongrid-dir/sub/ongrid.db",
        "postgresql+psycopg://postgres:secret@127.0.0.1:1/ongrid",
    ],
)
def test_check_raises_when_the_database_is_unreachable(url: str) -> None:
    engine = make_engine(url)
    try:
        with pytest.raises(DatabaseUnavailable, match="is unreachable") as info:
            check(engine)
        assert "secret" not in str(info.value)
    finally:
        engine.dispose()


# -- SqlUserStore ------------------------------------------------------------------------------


def test_upsert_list_get_and_delete(store: SqlUserStore) -> None:
    assert store.list() == [] and store.get("disk_checker") is None
    store.upsert(_persona(), user="alice")
    store.upsert(_persona("b_first", description="First."))
    assert [p.name for p in store.list()] == ["b_first", "disk_checker"]
    assert all(p.source is Source.USER and p.path is None for p in store.list())

    first = store.get("disk_checker")
    assert first is not None
    assert (first.revision, first.created_by, first.updated_by) == (1, "alice", "alice")
    assert first.created_at.tzinfo is UTC and first.created_at == first.updated_at

    store.upsert(_persona(description="Check disks, v2."), user="bob")
    second = store.get("disk_checker")
    assert second is not None
    assert (second.revision, second.created_by, second.updated_by) == (2, "alice", "bob")
    assert second.persona.description == "Check disks, v2."
    assert second.created_at == first.created_at < second.updated_at

    assert store.delete("disk_checker") is True
    assert store.delete("disk_checker") is False
    assert store.get("disk_checker") is None
    assert [p.name for p in store.list()] == ["b_first"]


def test_round_trip_keeps_the_body_byte_for_byte_and_unknown_fields(store: SqlUserStore) -> None:
    from_file = load_persona_file(FIXTURES / "unknown_keys.md").persona
    crlf_body = "# Ünïcode\r\n\r\nTrailing spaces  \r\n\ttab\r\nno newline at the end"
    odd = _persona(
        "crlf_persona",
        body=crlf_body,
        initial_prompt="Look at {{.device_id}}.\n",
        metadata={"os": ["linux"], "custom": {"k": [1, 2]}},
        unknown_fields={"effort": "high"},
    )
    for persona in (from_file, odd):
        store.upsert(persona)
    loaded = {p.name: p for p in store.list()}
    for persona in (from_file, odd):
        back = loaded[persona.name]
        assert back.body == persona.body
        assert back.unknown_fields == persona.unknown_fields
        assert dump_persona(back) == dump_persona(persona)
        assert back.model_dump(exclude={"source", "path"}) == persona.model_dump(
            exclude={"source", "path"}
        )
    assert loaded["crlf_persona"].body.encode() == crlf_body.encode()
    assert loaded["capacity_planner"].unknown_fields["hooks"]["PreToolUse"][0]["matcher"] == "Bash"


def test_a_row_that_no_longer_loads_is_skipped_and_reported(
    migrated: Engine, store: SqlUserStore
) -> None:
    store.upsert(_persona())
    renamed = dump_persona(_persona("other_name"))
    with migrated.begin() as conn:
        conn.execute(
            insert(AgentRow),
            [
                {"name": "garbage", "markdown": "no frontmatter at all"},
                {"name": "future_format", "markdown": "---\nname: future_format\n---\n"},
                {"name": "renamed", "markdown": renamed},
            ],
        )
    assert [p.name for p in store.list()] == ["disk_checker"]
    problems = dict(store.problems())
    assert set(problems) == {"garbage", "future_format", "renamed"}
    assert "no frontmatter" in problems["garbage"]
    assert "description: required field is missing" in problems["future_format"]
    assert "'other_name', but the row is 'renamed'" in problems["renamed"]
    with pytest.raises(PersonaError):
        store.get("garbage")

    # Saving a persona under that name repairs the row; deleting removes it.
    store.upsert(_persona("garbage", description="Fixed."))
    assert store.delete("future_format") and store.delete("renamed")
    assert [p.name for p in store.list()] == ["disk_checker", "garbage"]
    assert store.problems() == []


def test_a_registry_over_the_database_shows_user_personas_that_shadow_disk_ones(
    tmp_path: Path, migrated: Engine
) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "disk_checker.md").write_text(dump_persona(_persona(description="From disk.")))
    settings = Settings(agents_dir=agents, marketplace_root=tmp_path / "marketplace")
    registry = build_registry(settings, SqlUserStore(migrated))
    assert registry.get("disk_checker").source is Source.DISK

    registry.replace(_persona(description="From the database."))
    registry.replace(_persona("only_in_db", description="Mine."))
    for reg in (registry, build_registry(settings, SqlUserStore(migrated))):  # another process
        snap = reg.snapshot()
        assert snap.get("disk_checker").source is Source.USER
        assert snap.get("disk_checker").description == "From the database."
        assert snap.shadowed["disk_checker"] is Source.DISK
        assert snap.get("only_in_db").source is Source.USER
        assert snap.get("generalist").source is Source.BUILTIN

    registry.delete("disk_checker")
    assert registry.get("disk_checker").source is Source.DISK
    assert registry.get("disk_checker").description == "From disk."


def test_the_registry_warns_about_a_broken_row_and_can_delete_it(
    tmp_path: Path, migrated: Engine
) -> None:
    with migrated.begin() as conn:
        conn.execute(insert(AgentRow), [{"name": "garbage", "markdown": "no frontmatter"}])
    settings = Settings(agents_dir=tmp_path / "none", marketplace_root=tmp_path / "m")
    registry = build_registry(settings, SqlUserStore(migrated))
    [warning] = [w for w in registry.warnings() if w.path.startswith("database:")]
    assert warning.path == "database:agents/garbage" and "no frontmatter" in warning.reason
    registry.delete("garbage")
    assert not [w for w in registry.warnings() if w.path.startswith("database:")]


def test_concurrent_upserts_of_one_persona_count_every_revision(store: SqlUserStore) -> None:
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(user: str) -> None:
        try:
            barrier.wait()
            for i in range(50):
                store.upsert(_persona(description=f"{user} #{i}"), user=user)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(u,)) for u in ("alice", "bob")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stored = store.get("disk_checker")
    assert stored is not None and stored.revision == 100
    assert stored.persona.description in {"alice #49", "bob #49"}


def test_create_inserts_once_and_refuses_a_stored_name(store: SqlUserStore) -> None:
    store.create(_persona(), user="alice")
    with pytest.raises(PersonaExists, match="'disk_checker' already exists.*PATCH") as info:
        store.create(_persona(description="Another."), user="bob")
    assert info.value.name == "disk_checker"
    stored = store.get("disk_checker")
    assert stored is not None
    assert (stored.revision, stored.created_by, stored.persona.description) == (
        1,
        "alice",
        "Check disks.",
    )
    with pytest.raises(UserError, match="longer than 255"):
        store.create(_persona("x" * 256))


def test_concurrent_creates_of_one_name_let_exactly_one_in(store: SqlUserStore) -> None:
    results = race(8, lambda i: store.create(_persona(description=f"Writer {i}."), f"u{i}"))
    winners = [i for i, r in enumerate(results) if r is None]
    losers = [r for r in results if r is not None]
    assert len(winners) == 1, results
    assert len(losers) == 7 and all(isinstance(r, PersonaExists) for r in losers), losers
    stored = store.get("disk_checker")
    assert stored is not None and stored.revision == 1
    assert (stored.created_by, stored.persona.description) == (
        f"u{winners[0]}",
        f"Writer {winners[0]}.",
    )


def test_concurrent_updates_of_different_fields_all_land(store: SqlUserStore) -> None:
    store.create(_persona(unknown_fields={"a": 0, "b": 0}))
    rounds = 15

    def bump(key: str):
        def change(current: Persona) -> Persona:
            fields = {**current.unknown_fields, key: current.unknown_fields[key] + 1}
            return current.model_copy(update={"unknown_fields": fields})

        return change

    def writer(i: int) -> None:
        key = "ab"[i % 2]
        for _ in range(rounds):
            store.update("disk_checker", bump(key), user=key)

    assert race(4, writer) == [None] * 4
    stored = store.get("disk_checker")
    assert stored is not None
    # Every increment of every writer is there: none read a value another then overwrote.
    assert stored.persona.unknown_fields == {"a": 2 * rounds, "b": 2 * rounds}
    assert stored.revision == 1 + 4 * rounds


def test_update_never_brings_back_a_deleted_persona_and_writes_nothing_on_error(
    store: SqlUserStore,
) -> None:
    with pytest.raises(NotFoundError, match="unknown user persona 'disk_checker'"):
        store.update("disk_checker", lambda p: p)
    store.create(_persona())

    def refuse(current: Persona) -> Persona:
        raise PersonaError([])

    with pytest.raises(PersonaError):
        store.update("disk_checker", refuse)
    with pytest.raises(PersonaError, match="name: cannot be changed"):
        store.update("disk_checker", lambda p: p.model_copy(update={"name": "other"}))
    stored = store.get("disk_checker")
    assert stored is not None and stored.revision == 1

    written = store.update(
        "disk_checker", lambda p: p.model_copy(update={"description": "v2"}), user="bob"
    )
    assert (written.revision, written.updated_by, written.persona.description) == (2, "bob", "v2")
    assert store.get("disk_checker") == written

    assert store.delete("disk_checker")
    with pytest.raises(NotFoundError):
        store.update("disk_checker", lambda p: p.model_copy(update={"description": "v3"}))
    assert store.get("disk_checker") is None


def test_an_update_waits_for_another_change_and_gives_up_after_the_lock_timeout(
    migrated: Engine,
) -> None:
    store = SqlUserStore(migrated, lock_timeout_ms=300)
    store.create(_persona())
    entered, release = threading.Event(), threading.Event()

    def slow(current: Persona) -> Persona:
        entered.set()
        assert release.wait(30), "the test never released the first update"
        return current.model_copy(update={"description": "first"})

    first = threading.Thread(target=lambda: store.update("disk_checker", slow, "alice"))
    first.start()
    try:
        assert entered.wait(30), "the first update never read the row"
        with pytest.raises(PersonaBusy, match="being changed by someone else.*0.3 s"):
            store.update("disk_checker", lambda p: p.model_copy(update={"description": "x"}))
    finally:
        release.set()
        first.join()
    stored = store.get("disk_checker")
    assert stored is not None
    assert (stored.persona.description, stored.revision, stored.updated_by) == (
        "first",
        2,
        "alice",
    )
    # The lock is gone with the first transaction: the next update goes through.
    store.update("disk_checker", lambda p: p.model_copy(update={"description": "next"}))
    assert store.get("disk_checker").revision == 3  # type: ignore[union-attr]


# -- reading without creating --------------------------------------------------------------------


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_database_url_without_create_makes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    url = make_url(database_url(Settings(data_dir=data_dir), create=False))
    assert url.database == str(data_dir.resolve() / "ongrid.db")
    assert open_read_only(Settings(data_dir=data_dir)) is None
    assert _tree(tmp_path) == []
    store = ReadOnlyUserStore.open(Settings(data_dir=data_dir))
    assert (store.list(), store.problems()) == ([], [])
    assert _tree(tmp_path) == []


def test_the_read_only_store_reads_and_cannot_write(db_url: URL, tmp_path: Path) -> None:
    writer = make_engine(db_url)
    try:
        upgrade(writer)
        SqlUserStore(writer).upsert(_persona(), user="alice")
    finally:
        writer.dispose()
    settings = Settings(database_url=db_url.render_as_string(hide_password=False))
    store = ReadOnlyUserStore.open(settings)
    try:
        assert [p.name for p in store.list()] == ["disk_checker"] and store.problems() == []
        with pytest.raises(ReadOnlyError, match="opened read-only"):
            store.upsert(_persona("other"))
        with pytest.raises(ReadOnlyError, match="opened read-only"):
            store.delete("disk_checker")
    finally:
        store.close()
    engine = open_read_only(settings)
    assert engine is not None
    try:
        with pytest.raises(SQLAlchemyError, match="read"), engine.begin() as conn:
            conn.execute(insert(AgentRow).values(name="sneaky", markdown="x"))
        assert [p.name for p in SqlUserStore(engine).list()] == ["disk_checker"]
    finally:
        engine.dispose()


def test_the_read_only_store_neither_migrates_nor_hides_an_old_schema(db_url: URL) -> None:
    url = db_url.render_as_string(hide_password=False)
    if db_url.get_backend_name() == "sqlite":
        Path(str(db_url.database)).touch()  # an empty file: a database with no schema
    settings = Settings(database_url=url)

    store = ReadOnlyUserStore.open(settings)
    engine = make_engine(url)
    try:
        assert store.list() == []
        [(name, reason)] = store.problems()
        assert name == "*" and "has no schema yet" in reason and "ongrid api" in reason
        assert not TABLES & set(inspect(engine).get_table_names())  # still nothing migrated
        upgrade(engine)
        SqlUserStore(engine).upsert(_persona())
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0000_older'"))
        [persona] = store.list()
        [(_, reason)] = store.problems()
        assert persona.name == "disk_checker"
        assert f"at schema revision 0000_older, this version expects {head_revision()}" in reason
        assert schema_revision(engine) == "0000_older"  # left as it was
    finally:
        store.close()
        engine.dispose()


def test_the_read_only_store_reports_an_unreachable_database() -> None:
    settings = Settings(database_url="postgresql+psycopg://postgres:secret@127.0.0.1:1/ongrid")
    store = ReadOnlyUserStore.open(settings)
    try:
        assert store.list() == []
        [(name, reason)] = store.problems()
    finally:
        store.close()
    assert name == "*" and "user personas could not be read from" in reason
    assert "127.0.0.1:1" in reason and "secret" not in reason


# -- chat sessions -----------------------------------------------------------------------------


def test_another_users_session_is_invisible(chats: ChatStore) -> None:
    sid = chats.create_session("alice", "Disk full on db-1")
    session = chats.get_session(sid, "alice")
    assert session is not None and (session.user, session.title) == ("alice", "Disk full on db-1")
    assert session.created_at.tzinfo is UTC
    assert chats.get_session(sid, "bob") is None
    assert chats.get_session("no-such-session", "alice") is None
    assert chats.list_sessions("bob") == []
    assert chats.delete_session(sid, "bob") is False
    assert chats.get_session(sid, "alice") is not None


def test_sessions_are_listed_by_latest_activity(chats: ChatStore) -> None:
    first = chats.create_session("alice", "first")
    second = chats.create_session("alice", "second")
    assert [s.id for s in chats.list_sessions("alice")] == [second, first]
    chats.add_message(first, "user", "bump")
    assert [s.id for s in chats.list_sessions("alice")] == [first, second]
    assert [s.id for s in chats.list_sessions("alice", limit=1)] == [first]


def test_messages_come_back_in_order(chats: ChatStore) -> None:
    sid = chats.create_session("alice", "t")
    sent = [
        chats.add_message(sid, "user", "why is db-1 full?"),
        chats.add_message(sid, "assistant", "Looking.", agent="disk_checker", spawn_id="s-1"),
        chats.add_message(sid, "system", "spawn s-1 finished"),
        chats.add_message(sid, "assistant", "/var/log grew 40 GB."),
    ]
    got = chats.messages(sid)
    assert got == sent
    assert [m.role for m in got] == ["user", "assistant", "system", "assistant"]
    assert (got[1].agent, got[1].spawn_id, got[0].agent) == ("disk_checker", "s-1", None)
    assert got[0].as_dict()["created_at"].endswith("+00:00")
    assert chats.messages(chats.create_session("alice")) == []


def test_bad_messages_and_session_ids_are_refused(chats: ChatStore) -> None:
    sid = chats.create_session("alice", session_id="client-chosen_1")
    assert sid == "client-chosen_1"
    with pytest.raises(UserError, match="already exists"):
        chats.create_session("bob", session_id=sid)
    with pytest.raises(UserError, match="letters, digits"):
        chats.create_session("bob", session_id="../etc")
    with pytest.raises(ValueError, match="role must be one of"):
        chats.add_message(sid, "tool", "x")
    with pytest.raises(NotFoundError):
        chats.add_message("missing", "user", "x")


def test_a_session_starts_with_its_first_message_in_one_transaction(chats: ChatStore) -> None:
    chats.start_session("chat-1", "alice", "db-1 full", "why is db-1 full?", spawn_id="s-1")
    (session,) = chats.list_sessions("alice")
    assert (session.id, session.title, session.created_at) == (
        "chat-1",
        "db-1 full",
        session.updated_at,
    )
    (first,) = chats.messages("chat-1")
    assert (first.role, first.content, first.spawn_id) == ("user", "why is db-1 full?", "s-1")
    # A taken or malformed id is refused and changes nothing.
    with pytest.raises(UserError, match="already exists"):
        chats.start_session("chat-1", "bob", "t", "mine now")
    with pytest.raises(UserError, match="letters, digits"):
        chats.start_session("../etc", "bob", "t", "x")
    assert chats.list_sessions("bob") == [] and len(chats.messages("chat-1")) == 1


def test_deleting_a_session_deletes_its_messages(migrated: Engine, chats: ChatStore) -> None:
    doomed, kept = chats.create_session("alice"), chats.create_session("alice")
    for sid in (doomed, kept):
        chats.add_message(sid, "user", "hello")
        chats.add_message(sid, "assistant", "hi")
    assert chats.delete_session(doomed, "alice") is True
    assert chats.get_session(doomed, "alice") is None
    assert chats.messages(doomed) == []
    assert len(chats.messages(kept)) == 2
    with migrated.connect() as conn:
        remaining = conn.execute(
            select(func.count())
            .select_from(text("chat_messages"))
            .where(text("session_id = :sid").bindparams(sid=doomed))
        ).scalar()
    assert remaining == 0


def test_a_parsed_persona_is_what_the_store_keeps(store: SqlUserStore) -> None:
    text_in = (FIXTURES / "unknown_keys.md").read_text(encoding="utf-8")
    store.upsert(parse_persona(text_in).persona)
    stored = store.get("capacity_planner")
    assert stored is not None
    assert dump_persona(stored.persona) == dump_persona(parse_persona(text_in).persona)
