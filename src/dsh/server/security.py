"""Security of `dsh serve`: the token file, the bearer check, the Host check and the bind rules.

Layer: server (no fastapi import: the CLI and tests use these helpers too). The design is in
docs/server.md#authentication:

* The token is `secrets.token_urlsafe(32)`, kept in `$DSH_HOME/serve-token`. It is created with
  `O_CREAT|O_EXCL|O_NOFOLLOW` and mode 0600, so two servers starting at once cannot both write one
  and a planted symlink is never followed; `rotate` writes a new file beside it and renames it over
  the old one. A token file that group or others may read stops the start (`ConfigError`, exit 4).
* Requests carry `Authorization: Bearer <token>`; the comparison is `hmac.compare_digest`, so its
  time does not depend on how much of a guess was right.
* A server bound to loopback answers only `Host` headers naming the bound host, `localhost` or
  `127.0.0.1` (any port): a web page that rebinds its own DNS name to 127.0.0.1 cannot talk to it.
  A wildcard bind (`0.0.0.0`, `::`) cannot know the names clients use, so it skips the check; the
  token is the defence there.
* Binding a non-loopback address needs `allow_remote`.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dsh.errors import ConfigError

__all__ = [
    "TOKEN_FILE",
    "HostCheck",
    "ServeToken",
    "bearer_matches",
    "check_bind",
    "is_loopback",
    "load_token",
    "shared_token",
]

TOKEN_FILE: Final = "serve-token"  # noqa: S105 - a file name, not a secret
"""The token file's name inside the home folder."""

_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - names of the wildcard binds, compared only


@dataclass(frozen=True, slots=True)
class ServeToken:
    """The server's token.

    Attributes:
        value: The token itself (never log it).
        path: The file that holds it.
        fresh: True when this start created or rotated it: the only time it is printed.
    """

    value: str
    path: Path
    fresh: bool

    def __repr__(self) -> str:
        return f"ServeToken(path={str(self.path)!r}, fresh={self.fresh})"


def _write_new(path: Path, token: str) -> None:
    """Create `path` holding `token`, mode 0600; fails if anything exists there (a symlink included)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, token.encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the type
    # check below then refuses it without reading.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise ConfigError(f"cannot read the token file {path}: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"the token file {path} is not a regular file ({_kind(info.st_mode)}); "
                "remove it, or start with --rotate-token to replace it"
            )
        if info.st_mode & 0o077:
            raise ConfigError(
                f"the token file {path} is readable by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"run: chmod 600 {path}"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    token = data.decode("ascii", "replace").strip()
    if len(token) < 32 or not all(ch.isalnum() or ch in "-_" for ch in token):
        raise ConfigError(f"the token file {path} does not hold a usable token; start with --rotate-token")
    return token


def shared_token(*, file: Path | None = None, value: str | None = None) -> ServeToken:
    """The token several replicas share: read from `file` (checked like the home's token file), or `value`.

    `value` comes from the `DSH_SERVE_TOKEN` environment variable; the token is never printed.

    Raises:
        ConfigError: The file is unsafe or unusable, or the value is not a usable token (at least
            32 letters, digits, `-` or `_`).
    """
    if file is not None:
        return ServeToken(_read(file), file, fresh=False)
    token = (value or "").strip()
    if len(token) < 32 or not all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in token):
        raise ConfigError(
            "DSH_SERVE_TOKEN does not hold a usable token: at least 32 letters, digits, - or _ "
            '(python -c "import secrets; print(secrets.token_urlsafe(32))" makes one)'
        )
    return ServeToken(token, Path("$DSH_SERVE_TOKEN"), fresh=False)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a plain file"


def load_token(home: Path, *, rotate: bool = False) -> ServeToken:
    """The server token from `home`, created on first use (or replaced with `rotate`).

    Raises:
        ConfigError: The home folder cannot be created, or the token file is unsafe or unusable.
    """
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise ConfigError(f"cannot create the home folder {home}: {error.strerror}") from None
    path = home / TOKEN_FILE
    if rotate:
        token = secrets.token_urlsafe(32)
        spare = home / f".{TOKEN_FILE}.{secrets.token_hex(4)}"
        try:
            _write_new(spare, token)
            os.replace(spare, path)
        except OSError as error:
            spare.unlink(missing_ok=True)
            raise ConfigError(f"cannot write the token file {path}: {error.strerror}") from None
        return ServeToken(token, path, fresh=True)
    token = secrets.token_urlsafe(32)
    try:
        _write_new(path, token)
    except FileExistsError:
        return ServeToken(_read(path), path, fresh=False)
    except OSError as error:
        raise ConfigError(f"cannot write the token file {path}: {error.strerror}") from None
    return ServeToken(token, path, fresh=True)


def bearer_matches(header: str | None, token: str) -> bool:
    """True when `header` is `Bearer <token>` (scheme case-insensitive), compared in constant time."""
    if header is None:
        return False
    scheme, _, offered = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(offered.strip().encode("utf-8", "replace"), token.encode("utf-8"))


def _bare(host: str) -> str:
    return host.strip().strip("[]").lower().split("%", 1)[0]


def is_loopback(host: str) -> bool:
    """True for `localhost` names and loopback addresses (127.0.0.0/8, ::1)."""
    name = _bare(host)
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, allow_remote: bool) -> bool:
    """Refuse a non-loopback bind without `allow_remote`; returns True when the bind is remote.

    Raises:
        ConfigError: A non-loopback host without `allow_remote` (the CLI exits 4).
    """
    if is_loopback(host):
        return False
    if not allow_remote:
        raise ConfigError(
            f"refusing to listen on {host!r}: it is not a loopback address; pass --allow-remote to serve "
            "other machines (and put TLS in front of it)"
        )
    return True


class HostCheck:
    """Which `Host` headers a server bound to `bound_host` answers (see the module docs)."""

    def __init__(self, bound_host: str) -> None:
        bound = _bare(bound_host)
        self.enabled = bound not in _WILDCARDS
        self._allowed = frozenset({bound, "localhost", "127.0.0.1"})

    def allows(self, header: str | None) -> bool:
        """True when the request's `Host` header may be answered."""
        if not self.enabled:
            return True
        if not header:
            return False
        value = header.strip().lower()
        if value.startswith("["):
            name = value[1 : value.find("]")] if "]" in value else value
        else:
            name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
        return _bare(name) in self._allowed
