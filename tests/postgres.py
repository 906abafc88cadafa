"""The PostgreSQL server the tests use when one answers (``ONGRID_TEST_POSTGRES_URL``).

The ``postgres_admin`` fixture (``conftest.py``) hands tests an autocommit engine on it, or None
and why it is not reachable, so each test can skip saying why.
"""

from __future__ import annotations

import os

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["PG_ADMIN_URL", "connect_admin"]

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
