"""The damage table, row by row, on every store it applies to (docs/storage-format.md#damage-stays-visible).

Each test fills a store with parent `P` and two seeded children, `good` and `bad`, through a real
writing runtime, damages `bad` the way the row says, and runs `dsh agents P --json` and `dsh
doctor --json` through the real entry point (`tests/cli/entry.py`):

* header readable and valid, log damaged: `bad` is a row, from the projection cache by default
  and an `unavailable` diagnostic with `--verify` (docs/cli.md#when-damage-shows); nothing is
  unlisted, and doctor fails with an `unreadable` problem;
* a header only the TypeScript harness accepts (a Windows `cwd`): `bad` is an ordinary row, and
  doctor warns with `upstream-header` (exit 0);
* a header that is unreadable or invalid: `bad` is no row, stderr counts it, and doctor fails with
  an `unreadable` problem naming it.

JSONL meets every kind of the third row (the other kinds are in `test_unreadable_entries.py` and
`test_damaged_homes.py`); SQLite and PostgreSQL meet it as a `sessions` row the header rules refuse.
No command changes the store.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard

from dsh.persistence.jsonl import encode_header
from dsh.testing.postgres import ThrowawaySchemas
from tests.cli.entry import BACKENDS, StoreUnderTest, doctor_problems, open_store, unlisted_count, write_family
from tests.helpers import tree_snapshot
from tests.postgres.helpers import sql
from tests.postgres.hosts import dump_schema

pytestmark = pytest.mark.slow  # every test starts `dsh` processes: `make test` only

WINDOWS_CWD = "C:\\Users\\dev\\work"
NOT_JSON = '{"damaged": '


def _log(store: StoreUnderTest, project: str = "_no-cwd") -> Path:
    return store.home / "sessions" / project / "bad" / "session.jsonl.zstd"


def _split_header(log: Path) -> tuple[dict[str, Any], bytes]:
    data = log.read_bytes()
    decoder = zstandard.ZstdDecompressor().decompressobj()
    header: dict[str, Any] = json.loads(decoder.decompress(data))
    return header, decoder.unused_data


def _write_header(log: Path, header: dict[str, Any], rest: bytes) -> None:
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(encode_header(header)) + rest)


def _sql(store: StoreUnderTest, statement: str, *parameters: Any) -> None:
    """One statement on the store's database (`{s}` is the PostgreSQL schema)."""
    if store.kind == "sqlite":
        with sqlite3.connect(store.sqlite_path) as conn:
            conn.execute(statement.replace("{s}.", "").replace("%s", "?"), parameters)
        conn.close()
    else:
        assert store.url is not None
        asyncio.run(sql(store.url, statement, parameters, schema=store.schema))


# ---------------------------------------------------------------- damage, per row and store


def _log_damaged(store: StoreUnderTest) -> None:
    if store.kind == "jsonl":
        log = _log(store)
        data = bytearray(log.read_bytes())
        decoder = zstandard.ZstdDecompressor().decompressobj()
        decoder.decompress(bytes(data))
        first = len(data) - len(decoder.unused_data)
        decoder = zstandard.ZstdDecompressor().decompressobj()
        decoder.decompress(bytes(data[first:]))
        data[len(data) - len(decoder.unused_data) - 1] ^= 0xFF  # the second frame's checksum
        log.write_bytes(bytes(data))
    else:
        _sql(store, "UPDATE {s}.events SET data = %s WHERE session_id = %s AND seq = 0", NOT_JSON, "bad")


def _upstream_header(store: StoreUnderTest) -> None:
    if store.kind == "jsonl":
        source = _log(store)
        header, rest = _split_header(source)
        header["cwd"] = WINDOWS_CWD
        _write_header(_log(store, "--C-Users-dev-work--"), header, rest)
        source.unlink()
        source.parent.rmdir()
    else:
        _sql(store, "UPDATE {s}.sessions SET cwd = %s WHERE id = %s", WINDOWS_CWD, "bad")


def _negative_created_at(store: StoreUnderTest) -> None:
    if store.kind == "jsonl":
        header, rest = _split_header(_log(store))
        header["createdAt"] = -5
        _write_header(_log(store), header, rest)
    else:
        _sql(store, "UPDATE {s}.sessions SET created_at = -5 WHERE id = %s", "bad")


def _newer_version(store: StoreUnderTest) -> None:
    if store.kind == "jsonl":
        header, rest = _split_header(_log(store))
        header["version"] = 1
        _write_header(_log(store), header, rest)
    else:
        _sql(store, "UPDATE {s}.sessions SET version = 1 WHERE id = %s", "bad")


INVALID_HEADERS: dict[str, Callable[[StoreUnderTest], None]] = {
    "a negative createdAt": _negative_created_at,
    "a version other than 0": _newer_version,
}


# ---------------------------------------------------------------- running the commands


def _state(store: StoreUnderTest) -> object:
    """Everything the commands could change: the home's files, and the PostgreSQL schema's rows."""
    if store.kind != "postgres":
        return tree_snapshot(store.home)
    assert store.url is not None
    assert store.schema is not None
    return tree_snapshot(store.home), asyncio.run(dump_schema(store.url, store.schema))


def _commands(store: StoreUnderTest, *agents_args: str) -> tuple[list[dict[str, Any]], int, int, list[dict[str, Any]]]:
    """`(agents rows, unlisted count, doctor exit code, doctor problems)`, the store unchanged by them."""
    before = _state(store)
    agents = store.run("agents", "P", "--json", *agents_args)
    assert agents.returncode == 0, agents.stderr
    doctor = store.run("doctor", "--json")
    assert doctor.returncode in (0, 7), doctor.stderr
    assert _state(store) == before
    return json.loads(agents.stdout), unlisted_count(agents.stderr), doctor.returncode, doctor_problems(doctor.stdout)


def _store(kind: str, tmp_path: Path, pg_schemas: ThrowawaySchemas) -> StoreUnderTest:
    store = open_store(kind, tmp_path, pg_schemas)
    asyncio.run(write_family(store, ["good", "bad"]))
    return store


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_valid_header_with_a_damaged_log_is_a_diagnostic_row(
    tmp_path: Path, kind: str, pg_schemas: ThrowawaySchemas
) -> None:
    """Row 1: `bad` stays a row: from the cache rung, or with --verify an `unavailable` diagnostic; doctor fails."""
    store = _store(kind, tmp_path, pg_schemas)
    _log_damaged(store)
    trusting, unlisted, _, _ = _commands(store)
    # The projection cache holds `bad`'s identity, so the default listing answers without its log.
    assert [(row["id"], row["kind"]) for row in trusting] == [("good", "child"), ("bad", "child")]
    assert unlisted == 0
    rows, unlisted, code, problems = _commands(store, "--verify")
    assert [row["id"] for row in rows] == ["good", "bad"]
    assert rows[1] == {"kind": "diagnostic", "id": "bad", "reason": "unavailable"}
    assert unlisted == 0
    assert code == 7
    assert [(p["sessionId"], p["kind"], p["severity"]) for p in problems] == [("bad", "unreadable", "fail")]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_header_only_the_typescript_harness_accepts_is_a_row_and_a_warning(
    tmp_path: Path, kind: str, pg_schemas: ThrowawaySchemas
) -> None:
    """Row 2: a Windows `cwd`: `bad` is an ordinary row, nothing is unlisted, doctor warns (exit 0)."""
    store = _store(kind, tmp_path, pg_schemas)
    _upstream_header(store)
    rows, unlisted, code, problems = _commands(store)
    assert [(row["id"], row["kind"], row.get("label")) for row in rows] == [
        ("good", "child", "good"),
        ("bad", "child", "bad"),
    ]
    assert unlisted == 0
    assert code == 0
    assert [(p["sessionId"], p["kind"], p["severity"]) for p in problems] == [("bad", "upstream-header", "warn")]


@pytest.mark.parametrize("damage", sorted(INVALID_HEADERS))
@pytest.mark.parametrize("kind", BACKENDS)
def test_an_invalid_header_is_no_row_but_counted_and_named(
    tmp_path: Path, kind: str, damage: str, pg_schemas: ThrowawaySchemas
) -> None:
    """Row 3: `bad` is no row, stderr counts 1, doctor fails with `unreadable` naming `bad`."""
    store = _store(kind, tmp_path, pg_schemas)
    INVALID_HEADERS[damage](store)
    rows, unlisted, code, problems = _commands(store)
    assert [row["id"] for row in rows] == ["good"]
    assert unlisted == 1
    assert code == 7
    assert [(p["sessionId"], p["kind"], p["severity"]) for p in problems] == [("bad", "unreadable", "fail")]
    expected = "SESSION_FORMAT_UNSUPPORTED" if damage == "a version other than 0" else "SESSION_CORRUPT"
    assert problems[0]["reason"].startswith(expected)
