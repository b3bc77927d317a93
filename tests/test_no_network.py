"""The suite-wide network guard: only loopback and Unix sockets may connect, and no name leaves the host.

Layer: tests. The guard itself is the session fixture `_no_network` in tests/conftest.py. Sockets
here are non-blocking, so even a broken guard could not make a test wait on a real network.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("family", "address"),
    [(socket.AF_INET, ("10.0.0.1", 80)), (socket.AF_INET6, ("2001:db8::1", 443, 0, 0))],
)
def test_non_loopback_connect_is_refused(family: socket.AddressFamily, address: tuple[object, ...]) -> None:
    """`connect` and `connect_ex` to a non-loopback address fail at once with the guard's OSError."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        with pytest.raises(OSError, match="network access is disabled"):
            sock.connect(address)
        with pytest.raises(OSError, match="network access is disabled"):
            sock.connect_ex(address)
        with pytest.raises(OSError):
            sock.getpeername()  # never connected


async def test_asyncio_connections_are_refused_too() -> None:
    """asyncio's connections go through the same guard, so an event-loop client fails fast as well."""
    with pytest.raises(OSError, match="network access is disabled"):
        await asyncio.open_connection("10.0.0.1", 80)


def test_non_loopback_names_are_not_resolved() -> None:
    """Resolving a public host name fails without a DNS query; loopback names and IP literals still resolve."""
    with pytest.raises(socket.gaierror, match="name resolution is disabled"):
        socket.getaddrinfo("api.deepseek.com", 443)
    assert socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    assert socket.getaddrinfo("10.0.0.1", 80, type=socket.SOCK_STREAM)


def test_loopback_and_unix_sockets_stay_allowed(tmp_path: Path) -> None:
    """Connections to 127.0.0.1 and to a Unix socket work as usual."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
        assert client.getpeername() == server.getsockname()
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(path)
        server.listen()
        client.connect(path)
        assert client.getpeername() == path
