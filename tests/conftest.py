"""Shared pytest fixtures for the whole suite (fixtures only; helpers live in `tests/helpers.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ipaddress
import itertools
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import dsh
from dsh.testing.fake_openai import FakeOpenAIServer
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.sqlite_writer import SqliteLoopGuard
from dsh.testing.stored_logs import StepClock
from tests.helpers import FULL_RUN

# Hypothesis profiles: "ci" when the `CI` variable is set (or `DSH_FULL_TESTS=1`), "dev" otherwise. Property
# tests pick their counts with `examples(N)` from tests/helpers.py, which follows the same switch (N on
# CI, a tenth locally); a profile sets what a test leaves unset. Neither profile has a deadline: a time
# limit per example fails on a loaded machine, not on a wrong property.
settings.register_profile("dev", max_examples=10, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.load_profile("ci" if FULL_RUN else "dev")


@pytest.fixture
def clock() -> StepClock:
    """A deterministic epoch-ms clock for stores under test: +1 ms per read, `clock.now` is the next value."""
    return StepClock()


@pytest.fixture
def ids() -> Callable[[], str]:
    """A deterministic id factory (`s0001`, `s0002`, ...)."""
    counter = itertools.count(1)
    return lambda: f"s{next(counter):04d}"


_DSH_SOURCE = str(Path(dsh.__file__).resolve().parent)


@pytest.fixture(autouse=True)
def _no_sqlite_on_the_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whole-suite guard: no `sqlite3` call made by library code runs on an event loop thread.

    A blocking database call on the loop would stall every other task, so the SQLite backend and the
    projection cache must do their database work on worker threads
    (docs/architecture.md#threads-and-the-event-loop). The guard watches every test, not just the
    SQLite ones, so a new code path that slips a call onto the loop fails wherever it is first run.
    Tests that make such a call on purpose (the guard's own self-tests) carry the
    `sqlite_on_loop_on_purpose` marker.
    """
    if request.node.get_closest_marker("sqlite_on_loop_on_purpose") is not None:
        yield
        return
    guard = SqliteLoopGuard(only_from=_DSH_SOURCE)
    with _armed_while_a_loop_runs(guard):
        yield
    guard.assert_clean()


@contextlib.contextmanager
def _armed_while_a_loop_runs(guard: SqliteLoopGuard) -> Iterator[None]:
    """Enter `guard` each time an event loop starts running on this thread, and leave it when it stops.

    The guard records a call only while a loop runs on its thread, so profiling outside a loop finds
    nothing and only slows the test down (a profiler sees every Python call). asyncio marks a loop
    running and stopped through `asyncio.events._set_running_loop`, which `run_forever` (under
    `asyncio.run`, `asyncio.Runner` and `run_until_complete`) looks up on each start; wrapping it arms
    the profiler exactly for the time a loop runs here. Loops on other threads are left alone, as
    the guard itself leaves them.
    """
    thread = threading.get_ident()
    real_set_running_loop = asyncio.events._set_running_loop
    armed = False

    def set_running_loop(loop: asyncio.AbstractEventLoop | None) -> None:
        nonlocal armed
        if threading.get_ident() != thread:
            real_set_running_loop(loop)
            return
        if loop is None and armed:
            guard.__exit__(None, None, None)
            armed = False
        real_set_running_loop(loop)
        if loop is not None and not armed:
            guard.__enter__()
            armed = True

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(asyncio.events, "_set_running_loop", set_running_loop)
        try:
            yield
        finally:
            if armed:
                guard.__exit__(None, None, None)


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").lower().split("%", 1)[0]
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _ip_literal(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    try:
        ipaddress.ip_address(str(host).strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


@pytest.fixture(scope="session", autouse=True)
def _no_network() -> Iterator[None]:
    """Whole-suite guard: no test reaches the network; only loopback and Unix sockets connect.

    Model clients are tested against the fake OpenAI server on 127.0.0.1, so any other address means a
    test (or a default base URL) escaped to a real endpoint. `connect`/`connect_ex` to a non-loopback
    IPv4/IPv6 address fail at once with `OSError`, and so does resolving a non-loopback host name
    (a DNS query is network traffic too, and in a sandbox it can hang instead of failing).
    """
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo
    local_names = {socket.gethostname().lower()}

    def refused(sock: socket.socket, address: Any) -> OSError | None:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        host = address[0] if isinstance(address, tuple) and address else address
        if _loopback(host):
            return None
        return OSError(f"network access is disabled in tests: connect to {address!r} refused")

    def connect(sock: socket.socket, address: Any) -> None:
        error = refused(sock, address)
        if error is not None:
            raise error
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        error = refused(sock, address)
        if error is not None:
            raise error
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode("ascii", "replace") if isinstance(host, bytes) else host
        if name and not _loopback(name) and not _ip_literal(name) and str(name).lower() not in local_names:
            raise socket.gaierror(socket.EAI_NONAME, f"name resolution is disabled in tests: {name!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(socket, "getaddrinfo", getaddrinfo)
        yield


@pytest.fixture(scope="session")
def shared_openai_server() -> Iterator[FakeOpenAIServer]:
    """One fake OpenAI-compatible server per test session: starting uvicorn costs more than most tests using it."""
    importlib.import_module("openai")
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def openai_server(shared_openai_server: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """The shared fake server, emptied before and after each test."""
    shared_openai_server.reset()
    yield shared_openai_server
    shared_openai_server.reset()


@pytest.fixture
def pg_schemas() -> Iterator[ThrowawaySchemas]:
    """Throw-away PostgreSQL schemas for one test, dropped afterwards.

    Asking for a schema skips the test when `DSH_TEST_POSTGRES_URL` is unset or its server does not
    answer, and fails it instead under CI (dsh.testing.postgres).
    """
    schemas = ThrowawaySchemas()
    yield schemas
    schemas.drop_all()
