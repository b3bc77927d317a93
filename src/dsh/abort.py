"""Cooperative cancellation of one operation: `AbortController` and `AbortSignal`.

Layer: base. A signal is distinct from asyncio task cancellation: aborting a signal asks an
operation to stop and report it in its own stable form (persistence `OPERATION_CANCELLED`, query
`SESSION_QUERY_ABORTED`, listing `CANCELLED`), while `asyncio.CancelledError` always propagates
unchanged. A signal belongs to the event loop that was running when its controller was created;
`abort()` may be called from another thread, and then callbacks and waiters run on the owning loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Generator
from typing import Any, Final

from dsh.errors import DshError

__all__ = ["AbortController", "AbortError", "AbortSignal"]

_log = logging.getLogger(__name__)


class AbortError(DshError):
    """Raised by `AbortSignal.throw_if_aborted()` when the reason is not itself an exception."""

    codes = frozenset({"ABORTED"})

    def __init__(self, reason: object = None, message: str | None = None) -> None:
        super().__init__(message or (str(reason) if reason is not None else "aborted"))
        self.reason = reason


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AbortSignal:
    """Read side of an abort: state, reason, callbacks and awaiting."""

    def __init__(self, *, _loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._aborted = False
        self._reason: object = None
        self._callbacks: list[_Callback] = []
        self._waiters: list[asyncio.Future[object]] = []
        self._loop = _loop if _loop is not None else _running_loop()
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._never = False

    @property
    def aborted(self) -> bool:
        """True once the controller aborted."""
        return self._aborted

    @property
    def reason(self) -> object | None:
        """The abort reason; `None` until aborted."""
        return self._reason if self._aborted else None

    def throw_if_aborted(self) -> None:
        """Raise the reason (an exception) or `AbortError(reason)` when aborted."""
        if not self._aborted:
            return
        if isinstance(self._reason, BaseException):
            raise self._reason
        raise AbortError(self._reason)

    def add_callback(self, fn: Callable[[object], None]) -> Callable[[], None]:
        """Run `fn(reason)` once on abort (immediately if already aborted); returns a remover."""
        with self._lock:
            if not self._aborted:
                if self._never:
                    return _noop
                # A fresh cell per registration, so the remover takes out exactly this one even
                # when the same function (or an equal bound method) is registered twice.
                entry = _Callback(fn)
                self._callbacks.append(entry)

                def remove() -> None:
                    with self._lock:
                        for index, item in enumerate(self._callbacks):
                            if item is entry:
                                del self._callbacks[index]
                                break

                return remove
        _run_callback(fn, self._reason)
        return _noop

    async def wait(self) -> object:
        """Resolve with the reason once aborted. Cancelling a waiter never affects the signal."""
        if self._aborted:
            return self._reason
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        if self._never:
            # The shared never-aborting signal keeps no waiter list (it is shared across loops).
            return await future
        with self._lock:
            # Re-checked under the lock: another thread may have aborted since the fast path.
            if self.aborted:
                return self._reason
            self._waiters.append(future)
        try:
            return await future
        finally:
            with self._lock:
                if future in self._waiters:
                    self._waiters.remove(future)

    def __await__(self) -> Generator[Any, None, object]:
        return self.wait().__await__()

    def _abort(self, reason: object) -> None:
        with self._lock:
            if self._aborted or self._never:
                return
            self._aborted = True
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
            waiters, self._waiters = self._waiters, []
        loop = self._loop
        on_owner = loop is None or _running_loop() is loop or threading.get_ident() == self._thread
        if not on_owner:
            assert loop is not None
            try:
                loop.call_soon_threadsafe(_settle, callbacks, waiters, reason)
                return
            except RuntimeError:
                # The owning loop is closed: nothing will ever run there again, so the callbacks
                # run here rather than never (waiters of a closed loop cannot be woken anyway).
                pass
        _settle(callbacks, waiters, reason)

    @staticmethod
    def none() -> AbortSignal:
        """A shared signal that never aborts."""
        return _NEVER

    @staticmethod
    def aborted_with(reason: object = None) -> AbortSignal:
        """A signal that is already aborted with `reason` (default: an `AbortError`)."""
        controller = AbortController()
        controller.abort(reason)
        return controller.signal

    @staticmethod
    def timeout(seconds: float) -> AbortSignal:
        """A signal that aborts with a `TimeoutError` after `seconds` on the running loop."""
        controller = AbortController()
        loop = asyncio.get_running_loop()
        handle = loop.call_later(seconds, controller.abort, TimeoutError(f"signal timed out after {seconds} s"))
        controller.signal.add_callback(lambda _reason: handle.cancel())
        return controller.signal

    @staticmethod
    def any(*signals: AbortSignal) -> AbortSignal:
        """A signal that aborts with the reason of the first input to abort."""
        controller = AbortController()
        for signal in signals:
            if signal.aborted:
                controller.abort(signal.reason)
                return controller.signal
        removers = [signal.add_callback(controller.abort) for signal in signals]

        def cleanup(_reason: object) -> None:
            for remove in removers:
                remove()

        controller.signal.add_callback(cleanup)
        return controller.signal


def _noop() -> None:
    return None


class _Callback:
    """One registration: identity distinguishes two registrations of the same function."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[object], None]) -> None:
        self.fn = fn


def _run_callback(fn: Callable[[object], None], reason: object) -> None:
    try:
        fn(reason)
    except Exception:
        _log.exception("abort callback raised")


def _settle(callbacks: list[_Callback], waiters: list[asyncio.Future[object]], reason: object) -> None:
    for entry in callbacks:
        _run_callback(entry.fn, reason)
    running = _running_loop()
    for future in waiters:
        owner = future.get_loop()
        if owner is running:
            _resolve(future, reason)
            continue
        try:
            owner.call_soon_threadsafe(_resolve, future, reason)
        except RuntimeError:
            # A waiter of a closed loop: that loop will never resume it.
            _log.debug("abort: a waiter's loop is closed; it cannot be woken")


def _resolve(future: asyncio.Future[object], reason: object) -> None:
    if not future.done():
        future.set_result(reason)


class AbortController:
    """Write side of an abort: owns one `AbortSignal`."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: object = None) -> None:
        """Abort the signal; idempotent, the first reason wins (default `AbortError("aborted")`)."""
        self.signal._abort(AbortError() if reason is None else reason)


def _never_signal() -> AbortSignal:
    signal = AbortSignal(_loop=None)
    signal._never = True
    return signal


_NEVER: Final = _never_signal()
"""The one shared never-aborting signal (immutable in effect: it refuses aborts and registrations)."""
