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
    """Raised by `AbortSignal.throw_if_aborted()` when the reason is not itself an exception.

    Args:
        message: Human-readable text; when omitted, `str(reason)`, or `"aborted"` without a reason.
        reason: The reason the signal was aborted with.

    Attributes:
        reason: The abort reason, or None.
    """

    codes = frozenset({"ABORTED"})

    def __init__(self, message: str | None = None, *, reason: object = None) -> None:
        if message is None:
            message = "aborted" if reason is None else str(reason)
        super().__init__(message)
        self.reason = reason


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _AbortState:
    """The state of one abort, shared by its two sides: the controller writes it (`abort`), the
    signal reads it. The one shared never-aborting signal has a state that refuses every abort."""

    __slots__ = ("aborted", "callbacks", "lock", "loop", "never", "reason", "thread", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, *, never: bool = False) -> None:
        self.aborted = False
        self.reason: object = None
        self.callbacks: list[_Callback] = []
        self.waiters: list[asyncio.Future[object]] = []
        self.loop = loop
        self.thread = threading.get_ident()
        self.lock = threading.Lock()
        self.never = never

    def abort(self, reason: object) -> None:
        """Abort once (the first reason wins) and settle callbacks and waiters on the owning loop."""
        with self.lock:
            if self.aborted or self.never:
                return
            self.aborted = True
            self.reason = reason
            callbacks, self.callbacks = self.callbacks, []
            waiters, self.waiters = self.waiters, []
        loop = self.loop
        on_owner = loop is None or _running_loop() is loop or threading.get_ident() == self.thread
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


class AbortSignal:
    """Read side of an abort: state, reason, callbacks and awaiting.

    Get one from an `AbortController` (or the static constructors below); a signal built directly
    never aborts.
    """

    def __init__(self, *, _state: _AbortState | None = None) -> None:
        self._state = _state if _state is not None else _AbortState(_running_loop())

    @property
    def aborted(self) -> bool:
        """True once the controller aborted."""
        return self._state.aborted

    @property
    def reason(self) -> object | None:
        """The abort reason; `None` until aborted."""
        state = self._state
        return state.reason if state.aborted else None

    def throw_if_aborted(self) -> None:
        """Raise the reason (an exception) or `AbortError(reason=reason)` when aborted."""
        state = self._state
        if not state.aborted:
            return
        if isinstance(state.reason, BaseException):
            raise state.reason
        raise AbortError(reason=state.reason)

    def add_callback(self, fn: Callable[[object], None]) -> Callable[[], None]:
        """Run `fn(reason)` once on abort (immediately if already aborted); returns a remover."""
        state = self._state
        with state.lock:
            if not state.aborted:
                if state.never:
                    return _noop
                # A fresh cell per registration, so the remover takes out exactly this one even
                # when the same function (or an equal bound method) is registered twice.
                entry = _Callback(fn)
                state.callbacks.append(entry)

                def remove() -> None:
                    with state.lock:
                        for index, item in enumerate(state.callbacks):
                            if item is entry:
                                del state.callbacks[index]
                                break

                return remove
        _run_callback(fn, state.reason)
        return _noop

    async def wait(self) -> object:
        """Resolve with the reason once aborted. Cancelling a waiter never affects the signal."""
        state = self._state
        if state.aborted:
            return state.reason
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        if state.never:
            # The shared never-aborting signal keeps no waiter list (it is shared across loops).
            return await future
        with state.lock:
            # Re-checked under the lock (through the property, which the type checker does not
            # narrow): another thread may have aborted since the fast path.
            if self.aborted:
                return state.reason
            state.waiters.append(future)
        try:
            return await future
        finally:
            with state.lock:
                if future in state.waiters:
                    state.waiters.remove(future)

    def __await__(self) -> Generator[Any, None, object]:
        return self.wait().__await__()

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
    """Write side of an abort: owns the abort state its `signal` reads."""

    def __init__(self) -> None:
        self._state = _AbortState(_running_loop())
        self.signal = AbortSignal(_state=self._state)

    def abort(self, reason: object = None) -> None:
        """Abort the signal; idempotent, the first reason wins (default `AbortError("aborted")`)."""
        self._state.abort(AbortError("aborted") if reason is None else reason)


_NEVER: Final = AbortSignal(_state=_AbortState(None, never=True))
"""The one shared never-aborting signal (immutable in effect: it refuses aborts and registrations)."""


# Shown under the name users import (docs/architecture.md#public-names).
AbortController.__module__ = "dsh"
AbortError.__module__ = "dsh"
AbortSignal.__module__ = "dsh"
