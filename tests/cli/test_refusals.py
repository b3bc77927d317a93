"""Every refusal says why, and nothing hangs: the real `dsh` entry point on hostile stored data and files.

Each command runs as a fresh process (`python -m dsh`, `tests/cli/entry.py`). A stored `turn` of
2**60 is refused naming the event's seq and what is wrong with the value, on every backend; a seq
of 2**65 is printed as the integer the log spells, not as a float. A FIFO in place of
`serve-token` stops `dsh serve` at once with one line saying what the file is, instead of waiting
for a writer that never comes.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest
import zstandard

from dsh.testing.postgres import ThrowawaySchemas
from tests.cli.entry import BACKENDS, StoreUnderTest, dsh_process, open_store, write_family
from tests.helpers import tree_snapshot
from tests.postgres.helpers import sql

pytestmark = pytest.mark.slow  # every test starts `dsh` processes: `make test` only


def _rewrite_jsonl(store: StoreUnderTest, session_id: str, old: str, new: str) -> None:
    """Replace `old` by `new` in one line of a zstd log, writing every line as a frame of its own."""
    log = store.home / "sessions" / "_no-cwd" / session_id / "session.jsonl.zstd"
    with zstandard.ZstdDecompressor().stream_reader(log.read_bytes(), read_across_frames=True) as reader:
        lines = reader.read().decode().splitlines(keepends=True)
    changed = [line.replace(old, new, 1) if old in line else line for line in lines]
    assert changed != lines
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    log.write_bytes(b"".join(compressor.compress(line.encode()) for line in changed))


def _store_turn(store: StoreUnderTest, session_id: str, data: str) -> None:
    """Overwrite the stored data of the session's `turn/start` event with the JSON text `data`."""
    if store.kind == "jsonl":
        _rewrite_jsonl(store, session_id, '"data":{"turn":1}}', f'"data":{data}}}')
    elif store.kind == "sqlite":
        with sqlite3.connect(store.sqlite_path) as conn:
            conn.execute("UPDATE events SET data = ? WHERE session_id = ? AND type = 'turn/start'", (data, session_id))
        conn.close()
    else:
        assert store.url is not None
        assert store.schema is not None
        statement = "UPDATE {s}.events SET data = %s WHERE session_id = %s AND type = 'turn/start'"
        asyncio.run(sql(store.url, statement, [data, session_id], schema=store.schema))


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_stored_turn_of_2_to_the_60_names_the_seq_and_the_reason(
    tmp_path: Path, kind: str, pg_schemas: ThrowawaySchemas
) -> None:
    """`dsh history` on a log whose `turn/start` holds turn 2**60: exit 5, the seq, the field and the value."""
    store = open_store(kind, tmp_path, pg_schemas)
    asyncio.run(write_family(store, ["good"]))
    _store_turn(store, "good", '{"turn":1152921504606846976}')
    done = store.run("history", "good")
    assert done.returncode == 5, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error [SESSION_QUERY_CORRUPT_SESSION]: ")
    assert (
        'event seq 2: session event "turn/start" has invalid data: turn must be a non-negative safe integer, '
        "got 1152921504606846976, outside the safe integer range \u00b1(2**53-1)"
    ) in line


def test_a_stored_seq_beyond_64_bits_is_printed_as_the_integer(tmp_path: Path) -> None:
    """A seq of 2**65 in a committed line is reported as 36893488147419103232, never as 3.68...e+19."""
    store = open_store("jsonl", tmp_path)
    asyncio.run(write_family(store, ["good"]))
    _rewrite_jsonl(store, "good", '"seq":2,', f'"seq":{2**65},')
    done = store.run("history", "good")
    assert done.returncode == 5, done.stderr
    assert "seq gap in committed region at line 4 (expected 2, got 36893488147419103232)" in done.stderr
    assert "e+19" not in done.stderr


def test_a_fifo_as_the_serve_token_stops_serve_at_once_with_one_line(tmp_path: Path) -> None:
    """`dsh serve` with a FIFO named `serve-token`: exit 4 and one line naming the FIFO, no wait, nothing changed."""
    store = open_store("jsonl", tmp_path)
    asyncio.run(write_family(store, ["good"]))
    os.mkfifo(store.home / "serve-token", 0o600)
    before = tree_snapshot(store.home)
    done = dsh_process("--home", str(store.home), "serve", "--port", "0")
    assert done.returncode == 4, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error [CONFIG_INVALID]: the token file {store.home / 'serve-token'} is not a regular file (a FIFO); "
        "remove it, or start with --rotate-token to replace it"
    ]
    assert tree_snapshot(store.home) == before
