"""The worker's event loop: coroutines from many threads, a bounded pool for blocking calls."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from workers.engine import Engine


@pytest.fixture
def engine() -> Iterator[Engine]:
    made = Engine(offload_threads=3)
    yield made
    made.stop()


def test_many_threads_wait_on_one_loop(engine: Engine) -> None:
    """A thousand coroutines wait at once on one loop, each handed over by a thread of its own
    (as Celery's task threads do), and each thread gets its own result back."""
    gate = asyncio.Event()
    started = threading.Semaphore(0)

    async def spawn(i: int) -> int:
        started.release()
        await gate.wait()
        return i * 2

    with concurrent.futures.ThreadPoolExecutor(max_workers=1000) as threads:
        results = [threads.submit(engine.run, spawn(i)) for i in range(1000)]
        for _ in range(1000):
            assert started.acquire(timeout=60)
        engine.call_soon(gate.set)
        assert [r.result(timeout=60) for r in results] == [i * 2 for i in range(1000)]


def test_blocking_calls_are_bounded_by_the_pool(engine: Engine) -> None:
    running, peak, lock = 0, 0, threading.Lock()
    release = threading.Event()

    def blocking() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(60)
        with lock:
            running -= 1

    async def many() -> None:
        calls = [asyncio.ensure_future(engine.offload(blocking)) for _ in range(10)]
        while True:  # the pool is full: three run, seven wait for a thread
            with lock:
                if running == 3:
                    break
            await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*calls)

    engine.run(many())
    assert peak == 3


def test_run_from_the_loop_itself_is_refused(engine: Engine) -> None:
    async def nested() -> None:
        engine.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="await instead"):
        engine.run(nested())


def test_an_error_reaches_the_waiting_thread(engine: Engine) -> None:
    async def broken() -> None:
        raise ValueError("spawn blew up")

    with pytest.raises(ValueError, match="spawn blew up"):
        engine.run(broken())
