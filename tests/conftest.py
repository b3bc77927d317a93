"""Shared pytest fixtures for the whole suite (fixtures only; helpers live in `tests/helpers.py`)."""

from __future__ import annotations

import importlib
import ipaddress
import itertools
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.testing.fake_openai import FakeOpenAIServer
from dsh.testing.postgres import ThrowawaySchemas
from dsh.testing.sqlite_writer import SqliteLoopGuard
from dsh.testing.stored_logs import StepClock


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
    with SqliteLoopGuard(only_from=_DSH_SOURCE) as guard:
        yield
    guard.assert_clean()


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
