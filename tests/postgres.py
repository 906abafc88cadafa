"""The PostgreSQL server the tests use when one answers (``ONGRID_TEST_POSTGRES_URL``).

The ``postgres_admin`` fixture (``conftest.py``) hands tests an autocommit engine on it, or None
and why it is not reachable, so each test can skip saying why.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["PG_ADMIN_URL", "connect_admin", "fresh_database"]

PG_ADMIN_URL = os.environ.get(
    "ONGRID_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def connect_admin() -> tuple[Engine | None, str]:
    """An autocommit engine on the server that answered, or None and the reason."""
    admin = None
    try:
        admin = create_engine(
            PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with admin.connect():
            pass
    except (SQLAlchemyError, ImportError) as exc:
        if admin is not None:
            admin.dispose()
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return None, f"PostgreSQL not reachable at {PG_ADMIN_URL}: {reason}"
    return admin, ""


@contextlib.contextmanager
def fresh_database(admin: Engine, prefix: str) -> Iterator[str]:
    """The URL of a new, empty database on ``admin``'s server, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
