"""The engine of a worker process: one asyncio event loop on which every spawn runs.

A spawn waits on its model almost all the time. Run as a coroutine, a waiting spawn costs a few
kilobytes and no thread; a thousand of them share one loop (uvloop where it is installed), and
the worker's CPU goes to the model calls' own parsing instead of to switching threads.

Celery stays the delivery layer: its spawn task (a thread of the ``threads`` pool) hands its
spawn to :meth:`Engine.run` and blocks on a future, which holds neither the GIL nor the loop, and
acknowledges the message once the coroutine is done (``acks_late``). Blocking work, the tools
above all, runs in a bounded thread pool (:meth:`Engine.offload`) so it never stalls the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["Engine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds :meth:`Engine.stop` waits for the loop's thread to end.
_STOP_WAIT = 10.0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # an optional speed-up: the standard loop does the same work
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Engine:
    """An event loop in a thread of its own, and a bounded pool for blocking calls."""

    def __init__(self, *, offload_threads: int = 64, name: str = "ongrid-engine") -> None:
        self.loop = _new_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=offload_threads, thread_name_prefix=f"{name}-offload"
        )
        self.loop.set_default_executor(self._pool)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop from any thread; its result arrives on the future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it, from a thread that is not the loop's."""
        if threading.current_thread() is self._thread:
            coro.close()  # never to run: no "never awaited" warning
            raise RuntimeError("Engine.run called on the engine's own loop: await instead")
        return self.submit(coro).result()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop, from any thread (a no-op once the loop has closed)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the bounded pool, with the caller's context variables."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await self.loop.run_in_executor(self._pool, call)

    def stop(self) -> None:
        """Stop the loop (after what it runs has ended, see the runtime's drain) and the pool."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_STOP_WAIT)
        if self._thread.is_alive():
            log.warning("the engine's event loop did not stop within %.0f s", _STOP_WAIT)
        self._pool.shutdown(wait=False, cancel_futures=True)
