"""Writer threads: a small set of daemon threads that run blocking appends and report on the event loop.

Layer: persistence (private). An append + flush is dominated by the `fsync`, and next by the thread
hop around it. `asyncio.to_thread` pays for generality there — a `concurrent.futures.Future` with
its own condition variable, a second, chained asyncio future, an executor work item, and whichever
idle pool thread wakes up. A writer thread takes `(fn, args, loop, done)` from its own queue, runs
`fn(*args)` and hands the outcome to `done(error)` through `loop.call_soon_threadsafe`: one queue
put to wake it, one callback to come back (docs/architecture.md#from-append-to-the-acknowledgement).

Work is sticky by key (a session id): one key's jobs always run on the same thread, in submission
order, which also keeps that thread's caches and per-thread state (the zstd compressor) warm;
different keys spread over `size` threads. Threads start on first use and stop at `close()`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from asyncio import AbstractEventLoop
from collections.abc import Callable
from typing import Any, Final

__all__ = ["WriterThreads"]

Done = Callable[[BaseException | None], object]

_STOP: Final = None


class WriterThreads:
    """Daemon threads that run blocking calls for keys, each key on one thread.

    Args:
        name: Thread name prefix (`<name>-<index>`).
        size: How many threads at most.
    """

    def __init__(self, name: str, size: int) -> None:
        self._name = name
        self._queues: list[queue.SimpleQueue[Any] | None] = [None] * size
        self._threads: list[threading.Thread] = []
        self._mutex = threading.Lock()
        self._closed = False

    def submit(
        self, key: str, fn: Callable[..., object], args: tuple[Any, ...], loop: AbstractEventLoop, done: Done
    ) -> None:
        """Queue `fn(*args)` on the key's thread; `done(error)` runs on `loop` afterwards (None: it returned).

        Raises:
            RuntimeError: The threads were closed.
        """
        if self._closed:
            raise RuntimeError("the writer threads are closed")  # a stopped thread would never answer
        index = hash(key) % len(self._queues)
        jobs = self._queues[index]
        if jobs is None:
            jobs = self._start(index)
        jobs.put((fn, args, loop, done))

    def _start(self, index: int) -> queue.SimpleQueue[Any]:
        with self._mutex:
            if self._closed:
                raise RuntimeError("the writer threads are closed")
            jobs = self._queues[index]
            if jobs is None:
                jobs = queue.SimpleQueue()
                thread = threading.Thread(target=_serve, args=(jobs,), name=f"{self._name}-{index}", daemon=True)
                thread.start()
                self._threads.append(thread)
                self._queues[index] = jobs
        return jobs

    def close(self) -> None:
        """Stop every thread after the jobs already queued (blocking: call it off the event loop)."""
        with self._mutex:
            self._closed = True
            started = [jobs for jobs in self._queues if jobs is not None]
            threads = list(self._threads)
        for jobs in started:
            jobs.put(_STOP)
        for thread in threads:
            thread.join()


def _serve(jobs: queue.SimpleQueue[Any]) -> None:
    while True:
        job = jobs.get()
        if job is _STOP:
            return
        _run(*job)
        del job  # hold no batch while idle


def _run(fn: Callable[..., object], args: tuple[Any, ...], loop: AbstractEventLoop, done: Done) -> None:
    error: BaseException | None = None
    try:
        fn(*args)
    except BaseException as failure:  # reported to `done`, never raised in this thread
        error = failure
    # RuntimeError: the loop is closed, so nobody waits for this outcome any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(done, error)
