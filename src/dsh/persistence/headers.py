"""Reading stored header records: the session layer's rules plus what the TypeScript harness accepts.

Layer: persistence. Every read path (the listing, the read pipeline) parses a stored header record
through `read_stored_header`, so a header lists and reads the same way everywhere. A new session's
header follows the session layer's creation rules (`SessionHeader.from_stored`), but a log the
TypeScript harness wrote may carry a header that harness reads and this build would not create: a
`cwd` that is not an absolute POSIX path (a Windows path such as `C:\\work`, a relative one, an empty
one). Such a session is listed and read exactly as the harness lists it; `upstream_only_reason`
names what differs, and `dsh doctor` reports it as a warning (docs/storage-format.md#header-record).
Everything else a header must satisfy is unchanged: a header that is invalid for both is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from dsh.json import is_json
from dsh.session.header import SessionHeader

__all__ = ["read_stored_header", "upstream_only_reason"]

_STAND_IN_CWD: Final = "/"
"""Checked in place of an upstream-only cwd, so every other rule still applies to the record."""


def _upstream_only_cwd(cwd: object) -> bool:
    """A cwd the TypeScript harness reads but this build would not create: any other valid string."""
    return type(cwd) is str and not cwd.startswith("/") and is_json(cwd)


def read_stored_header(record: Mapping[str, object]) -> tuple[SessionHeader, int]:
    """Parse a stored header record into `(header, inherited_event_count)`.

    The session layer's rules apply (version first), except that a `cwd` string which is not an
    absolute POSIX path is accepted and kept verbatim, because the TypeScript harness reads it.

    Raises:
        StoredHeaderError: The record is not a header either reader accepts.
    """
    cwd = record.get("cwd")
    if not _upstream_only_cwd(cwd):
        return SessionHeader.from_stored(record)
    checked = dict(record)
    checked["cwd"] = _STAND_IN_CWD
    header, cut = SessionHeader.from_stored(checked)
    return replace(header, cwd=cwd), cut  # type: ignore[arg-type]  # a str, checked above


def upstream_only_reason(header: SessionHeader) -> str | None:
    """Why this build would not create `header` although the TypeScript harness reads it, or None."""
    if _upstream_only_cwd(header.cwd):
        return (
            f"cwd {header.cwd!r} is not an absolute POSIX path (the TypeScript harness lists it, and reads its "
            "log only on a platform where it is absolute)"
        )
    return None
