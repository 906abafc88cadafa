"""The Redis server of this test process.

Every pytest process (each pytest-xdist worker, or a run without xdist) starts a server of its
own, the embedded binary on a free port, the first time a test asks for it. Concurrent test
processes, a second run of the suite, a developer's ``ongrid up`` and the machine's own Redis on
6379 therefore never see, flush or fill each other's keys. Its sixteen databases belong to this
process: a module names the one it uses with :func:`url` (a fixed number per module, as tests of
one process run one after another), and fixtures that must not meet another holder take one with
:func:`claim_database`.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from workers.embedded_redis import EmbeddedRedis
from workers.testing.backends import free_port

__all__ = ["CLAIMABLE", "claim_database", "port", "url"]

#: Databases :func:`claim_database` hands out; the numbers below 13 are named by modules.
CLAIMABLE = (13, 14, 15)

_server: EmbeddedRedis | None = None
_claimed: set[int] = set()


def _started() -> EmbeddedRedis:
    global _server
    if _server is None:
        failures = []
        for _ in range(5):  # another process may take the free port before the server binds it
            server = EmbeddedRedis(
                port=free_port(), data_dir=Path(tempfile.mkdtemp(prefix="ongrid-test-redis-"))
            )
            try:
                server.start(timeout=30.0)
            except RuntimeError as exc:
                shutil.rmtree(server.dir, ignore_errors=True)
                failures.append(str(exc))
                continue
            _server = server
            atexit.register(_stop)
            break
        else:
            raise RuntimeError(f"the tests' Redis did not start: {'; '.join(failures)}")
    return _server


def _stop() -> None:
    global _server
    if _server is not None:
        _server.stop()
        shutil.rmtree(_server.dir, ignore_errors=True)
        _server = None


def port() -> int:
    """The port of this process's server (started on first use)."""
    return _started().port


def url(db: int = 0) -> str:
    """The URL of database ``db`` of this process's server (started on first use)."""
    return f"redis://127.0.0.1:{port()}/{db}"


@contextlib.contextmanager
def claim_database() -> Iterator[str]:
    """The URL of one of :data:`CLAIMABLE` no other fixture of this process holds, until the
    context exits. Running out is a fixture bug (more than three holders at once), said so."""
    free = [number for number in CLAIMABLE if number not in _claimed]
    if not free:
        raise RuntimeError(f"every claimable Redis database ({CLAIMABLE}) is held in this process")
    number = free[0]
    _claimed.add(number)
    try:
        yield url(number)
    finally:
        _claimed.discard(number)
