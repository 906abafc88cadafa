"""Alembic environment: one schema, the ``agents`` table and the chat tables.

:func:`coordinator.storage.engine.upgrade` hands a locked connection in through
``config.attributes``; without one (e.g. ``command.revision(..., autogenerate=True)``) an
engine is built from the config's ``sqlalchemy.url``. SQLite gets batch
mode, since it cannot ``ALTER`` most things.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from coordinator.storage import TARGET_METADATA
from coordinator.storage.engine import locked_connection, make_engine


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=TARGET_METADATA,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_offline() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("offline migrations need sqlalchemy.url: alembic_config(url)")
    context.configure(
        url=url,
        target_metadata=TARGET_METADATA,
        render_as_batch=url.startswith("sqlite"),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection: pass one in config.attributes or set sqlalchemy.url")
    engine = make_engine(url)
    try:
        with locked_connection(engine) as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
