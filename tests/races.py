"""Run the same work in several threads released at the same instant."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["race"]

T = TypeVar("T")


def race(count: int, work: Callable[[int], T]) -> list[T | BaseException]:
    """``work(i)`` in ``count`` threads released at once: each one's result or exception."""
    barrier = threading.Barrier(count)
    results: list[T | BaseException] = [RuntimeError("never ran")] * count

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on what each got
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
