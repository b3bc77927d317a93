"""Cooperative cancellation: `AbortController` / `AbortSignal` (docs/architecture.md#cancellation)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from dsh.abort import AbortController, AbortError, AbortSignal
from dsh.errors import DshError

_GUARD = 5.0  # seconds; only guards against a hang, never measures anything


def _parked_waiter(signal: AbortSignal) -> tuple[asyncio.Task[object], asyncio.Event]:
    """A task awaiting `signal`; the event is set just before it parks (no yield in between)."""
    parked = asyncio.Event()

    async def wait() -> object:
        parked.set()
        return await signal.wait()

    return asyncio.create_task(wait()), parked


def test_reason_is_none_before_abort_and_first_reason_wins() -> None:
    """reason is None before abort; a second abort keeps the first reason."""
    controller = AbortController()
    signal = controller.signal
    assert signal.aborted is False
    assert signal.reason is None
    signal.throw_if_aborted()  # no-op while not aborted
    controller.abort("first")
    controller.abort("second")
    assert signal.aborted is True
    assert signal.reason == "first"


def test_default_reason_is_an_abort_error() -> None:
    """Without a reason the signal aborts with AbortError("aborted"), a DshError with code ABORTED."""
    controller = AbortController()
    controller.abort()
    reason = controller.signal.reason
    assert isinstance(reason, AbortError)
    assert isinstance(reason, DshError)
    assert reason.code == "ABORTED"
    assert str(reason) == "aborted"


def test_throw_if_aborted_raises_exceptions_as_is_and_wraps_others() -> None:
    """An exception reason is raised itself; any other reason is wrapped in AbortError."""
    boom = RuntimeError("boom")
    with pytest.raises(RuntimeError) as caught:
        AbortSignal.aborted_with(boom).throw_if_aborted()
    assert caught.value is boom
    with pytest.raises(AbortError) as wrapped:
        AbortSignal.aborted_with("user pressed stop").throw_if_aborted()
    assert wrapped.value.reason == "user pressed stop"
    assert wrapped.value.code == "ABORTED"
    with pytest.raises(AbortError):
        AbortSignal.aborted_with().throw_if_aborted()


def test_cancelled_error_reason_is_never_converted() -> None:
    """A CancelledError reason propagates unchanged, never as an error code."""
    cancelled = asyncio.CancelledError()
    with pytest.raises(asyncio.CancelledError) as caught:
        AbortSignal.aborted_with(cancelled).throw_if_aborted()
    assert caught.value is cancelled


def test_callbacks_run_once_in_order_and_failures_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    """Callbacks run once, in order; a raising one is logged and the rest still run."""
    calls: list[tuple[str, object]] = []
    controller = AbortController()
    controller.signal.add_callback(lambda reason: calls.append(("a", reason)))

    def broken(reason: object) -> None:
        raise ValueError("callback bug")

    controller.signal.add_callback(broken)
    controller.signal.add_callback(lambda reason: calls.append(("c", reason)))
    with caplog.at_level(logging.ERROR, logger="dsh.abort"):
        controller.abort("why")
        controller.abort("again")
    assert calls == [("a", "why"), ("c", "why")]
    assert len([r for r in caplog.records if r.name == "dsh.abort"]) == 1


def test_late_callback_runs_immediately() -> None:
    """A callback added to an aborted signal runs at once with the reason."""
    signal = AbortSignal.aborted_with("done")
    calls: list[object] = []
    remove = signal.add_callback(calls.append)
    assert calls == ["done"]
    remove()  # harmless


def test_removed_callback_does_not_run() -> None:
    """A remover takes out exactly its own registration, even when one function is registered twice."""
    calls: list[object] = []
    controller = AbortController()
    remove_first = controller.signal.add_callback(calls.append)
    controller.signal.add_callback(calls.append)
    remove_first()
    remove_first()
    controller.abort("x")
    assert calls == ["x"]


async def test_await_signal_resolves_with_the_reason() -> None:
    """`await signal` resolves with the reason, immediately when already aborted."""
    assert await AbortSignal.aborted_with("early") == "early"
    controller = AbortController()
    waiter = asyncio.create_task(controller.signal.wait())
    other = asyncio.ensure_future(controller.signal)
    controller.abort("later")
    assert await asyncio.wait_for(waiter, _GUARD) == "later"
    assert await asyncio.wait_for(other, _GUARD) == "later"


async def test_abort_on_the_owning_loop_runs_callbacks_synchronously() -> None:
    """abort() on the owning loop's thread runs callbacks before it returns."""
    controller = AbortController()
    calls: list[object] = []
    controller.signal.add_callback(calls.append)
    controller.abort("now")
    assert calls == ["now"]


async def test_abort_from_another_thread_wakes_the_waiter_on_the_owning_loop() -> None:
    """An abort from another thread wakes an awaiting task and runs callbacks on the loop's thread."""
    loop_thread = threading.get_ident()
    controller = AbortController()
    callback_threads: list[int] = []
    controller.signal.add_callback(lambda reason: callback_threads.append(threading.get_ident()))
    waiter = asyncio.create_task(controller.signal.wait())
    aborter = threading.Thread(target=controller.abort, args=("from a thread",))
    aborter.start()
    try:
        assert await asyncio.wait_for(waiter, _GUARD) == "from a thread"
    finally:
        aborter.join(_GUARD)
    assert callback_threads == [loop_thread]
    assert controller.signal.reason == "from a thread"


def test_abort_after_the_owning_loop_closed_still_runs_callbacks() -> None:
    """A cross-thread abort whose owning loop is closed runs the callbacks in the aborting thread."""
    holder: dict[str, AbortController] = {}

    async def make() -> None:
        holder["controller"] = AbortController()

    asyncio.run(make())
    controller = holder["controller"]
    calls: list[object] = []
    controller.signal.add_callback(calls.append)
    aborter = threading.Thread(target=controller.abort, args=("late",))
    aborter.start()
    aborter.join(_GUARD)
    assert calls == ["late"]
    assert controller.signal.aborted


async def test_cancelling_a_waiter_leaves_the_signal_alone_and_no_task_behind() -> None:
    """Cancelling a waiter never aborts the signal and leaves no task running."""
    controller = AbortController()
    before = asyncio.all_tasks()
    waiter, parked = _parked_waiter(controller.signal)
    await asyncio.wait_for(parked.wait(), _GUARD)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert controller.signal.aborted is False
    assert asyncio.all_tasks() == before
    controller.abort("still works")
    assert await controller.signal == "still works"


async def test_timeout_aborts_with_timeout_error() -> None:
    """timeout(0.05) aborts with a TimeoutError reason (awaited, not timed)."""
    signal = AbortSignal.timeout(0.05)
    assert signal.aborted is False
    reason = await asyncio.wait_for(signal.wait(), _GUARD)
    assert isinstance(reason, TimeoutError)
    assert signal.aborted is True
    with pytest.raises(TimeoutError):
        signal.throw_if_aborted()


async def test_any_takes_the_first_reason() -> None:
    """any() aborts with the first input's reason and ignores later ones."""
    a, b = AbortController(), AbortController()
    combined = AbortSignal.any(a.signal, b.signal)
    assert combined.aborted is False
    b.abort("b first")
    a.abort("a second")
    assert combined.reason == "b first"
    assert await combined == "b first"


def test_any_of_an_already_aborted_input() -> None:
    """any() of inputs one of which is already aborted is aborted with that reason at once."""
    live = AbortController()
    combined = AbortSignal.any(live.signal, AbortSignal.aborted_with("already"))
    assert combined.reason == "already"
    assert AbortSignal.any().aborted is False


def test_none_signal_never_aborts() -> None:
    """AbortSignal.none() is one shared signal that never aborts and keeps no callbacks."""
    never = AbortSignal.none()
    assert never is AbortSignal.none()
    calls: list[object] = []
    remove = never.add_callback(calls.append)
    never._state.abort("forced")  # even the internal path refuses
    remove()
    assert never.aborted is False
    assert never.reason is None
    assert calls == []


async def test_waiting_on_the_none_signal_can_be_cancelled() -> None:
    """Awaiting the never-aborting signal blocks until cancelled and leaves nothing behind."""
    waiter, parked = _parked_waiter(AbortSignal.none())
    await asyncio.wait_for(parked.wait(), _GUARD)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


def test_aborted_with_defaults() -> None:
    """aborted_with() without a reason carries an AbortError."""
    signal = AbortSignal.aborted_with()
    assert signal.aborted
    assert isinstance(signal.reason, AbortError)


def test_abort_error_keeps_its_reason() -> None:
    """AbortError(reason=...) exposes the reason and, without a message, uses it as its message."""
    error = AbortError(reason={"why": "user"})
    reason: Any = error.reason
    assert reason == {"why": "user"}
    assert error.code == "ABORTED"
    assert error.message == str({"why": "user"})
    assert AbortError().message == "aborted"


def test_abort_error_takes_its_message_first() -> None:
    """AbortError follows the message-first convention: the message, then the reason as a keyword."""
    error = AbortError("user pressed stop", reason=42)
    assert (error.message, error.reason, error.code) == ("user pressed stop", 42, "ABORTED")
