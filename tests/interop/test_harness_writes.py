"""The harness writes, pydsh reads: `Runtime`, `dsh sessions`, `dsh agents`, `dsh history` and `dsh doctor`
see what the harness's own code sees, and pydsh's catalog equals the harness's.

The harness writes through its live append path (a session created in its store, events appended,
one flush per batch) in its default format (zstd frames, runs of chunk deltas packed into rows) and
uncompressed, and forks through its own `fork`; children carry descriptors of both modes, two
levels deep (docs/storage-format.md#compatibility-with-the-typescript-harness).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import zstandard
from typer.testing import CliRunner

from dsh.cli.main import app
from tests.interop.compare import harness_view, pydsh_view
from tests.interop.harness import HarnessProcess
from tests.interop.streams import chunk_batches, descriptor, harness_turn, user_message

pytestmark = [pytest.mark.interop, pytest.mark.slow]

runner = CliRunner()
CWD = "/srv/harness"
PARENT = "h-parent"
SESSIONS = [PARENT, "h-quick", "h-keeper", "h-deeper", "h-fork", "h-keeper-fork"]


def _child(parent: str, depth: int, created_at: int) -> dict[str, Any]:
    return {
        "cwd": CWD,
        "parentSession": parent,
        "origin": "subagent",
        "delegationDepth": depth,
        "createdAt": created_at,
    }


def write_harness_home(harness: HarnessProcess, root: Path, *, compression: str = "zstd") -> None:
    """A parent with a packed-chunk turn and a plain one, a one-shot and a continuable child, a grandchild,
    a plain fork of the parent and a subagent fork of the continuable child, all written by the harness."""
    where = {"root": root, "compression": compression}
    quick = [
        [
            {"type": "turn/start", "data": {"turn": 1}},
            descriptor("one-shot", "Quick look"),
            user_message("q1", "Look quickly.", kind="coordinator"),
        ],
        *chunk_batches(1, ["Looked", " at", " it", "."])[1:],
    ]
    keeper = [
        [descriptor("continuable", "Keeper")],
        *harness_turn(1, "Keep at it.", "Kept."),
        *harness_turn(2, "More.", "More kept."),
    ]
    deeper = [[descriptor("continuable", "Deeper")], *harness_turn(1, "Go deeper.", "Deep.")]
    sessions = [
        {
            "id": PARENT,
            "meta": {"cwd": CWD, "createdAt": 1_800_000_000_000},
            "batches": [*chunk_batches(1, ["Hel", "lo", ", ", "world", "!"]), *harness_turn(2, "Again.", "Again!")],
        },
        {"id": "h-quick", "meta": _child(PARENT, 1, 1_800_000_000_100), "batches": quick},
        {"id": "h-keeper", "meta": _child(PARENT, 1, 1_800_000_000_200), "batches": keeper},
        {"id": "h-deeper", "meta": _child("h-keeper", 2, 1_800_000_000_300), "batches": deeper},
    ]
    harness.call("write", sessions=sessions, **where)
    harness.call(
        "fork", source=PARENT, child="h-fork", boundary=None, batches=harness_turn(3, "Forked.", "Fork!"), **where
    )
    harness.call(
        "fork",
        source="h-keeper",
        child="h-keeper-fork",
        meta={"origin": "subagent", "delegationDepth": 2, "createdAt": 1_800_000_000_400},
        batches=[[descriptor("continuable", "Keeper's fork")], *harness_turn(3, "Go on.", "Going.")],
        **where,
    )


@pytest.fixture(scope="module", params=["zstd", "none"])
def harness_home(
    request: pytest.FixtureRequest, harness: HarnessProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """A home whose store the harness wrote, in its default zstd format or uncompressed."""
    home = tmp_path_factory.mktemp(f"harness-{request.param}") / "home"
    write_harness_home(harness, home / "sessions", compression=request.param)
    return home, request.param


def test_the_harness_writes_what_it_is_known_to_write(harness_home: tuple[Path, str]) -> None:
    """The store holds the harness's own format: packed rows, one frame per flush (zstd) or plain lines."""
    home, compression = harness_home
    logs = sorted(path.name for path in (home / "sessions").rglob("session.jsonl*"))
    assert logs == ["session.jsonl.zstd" if compression == "zstd" else "session.jsonl"] * len(SESSIONS)
    parent = next((home / "sessions").rglob(f"{PARENT}/session.jsonl*"))
    raw = parent.read_bytes()
    text = raw if compression == "none" else _unzstd(raw)
    assert b'"type":"text-chunks"' in text


def test_pydsh_reads_the_harness_store_as_the_harness_does(
    harness: HarnessProcess, harness_home: tuple[Path, str]
) -> None:
    """Through a read-only `Runtime`, every header, log, catalog and descendant tree equals the harness's."""
    home, compression = harness_home
    ours = asyncio.run(pydsh_view(home / "sessions", catalogs=SESSIONS, descendants=[PARENT]))
    theirs = harness_view(harness, home / "sessions", catalogs=SESSIONS, descendants=[PARENT], compression=compression)
    assert sorted(ours.logs) == sorted(SESSIONS)
    assert ours.logs == theirs.logs
    assert ours.headers == theirs.headers
    assert ours.children == theirs.children
    assert ours.descendants == theirs.descendants
    assert [row["label"] for row in ours.children[PARENT]] == ["Quick look", "Keeper"]
    assert [(entry["id"], entry["depth"]) for entry in ours.descendants[PARENT]] == [
        ("h-quick", 1),
        ("h-keeper", 1),
        ("h-deeper", 2),
        ("h-keeper-fork", 2),
    ]


def _cli(home: Path, *args: str) -> Any:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DSH_")}
    return runner.invoke(app, ["--home", str(home), *args], env=env)


def test_the_cli_reads_the_harness_store_with_no_flag(harness: HarnessProcess, harness_home: tuple[Path, str]) -> None:
    """`dsh sessions`, `dsh agents`, `dsh history` and `dsh doctor` work on the harness's store (either
    compression, no option or variable), and what they print agrees with the harness."""
    home, compression = harness_home
    where = {"root": home / "sessions", "compression": compression}
    listed = _cli(home, "sessions", "--json", "--all")
    assert listed.exit_code == 0, listed.output
    assert sorted(item["id"] for item in json.loads(listed.stdout)["items"]) == sorted(
        header["id"] for header in harness.call("list", **where)
    )
    for parent in (PARENT, "h-keeper"):
        agents = _cli(home, "agents", parent, "--json")
        assert agents.exit_code == 0, agents.output
        assert json.loads(agents.stdout) == harness.call("children", parents=[parent], **where)[parent]["rows"]
    for session_id in SESSIONS:
        page = _cli(home, "history", session_id, "--json", "--limit", "200")
        assert page.exit_code == 0, page.output
        events = json.loads(page.stdout)["events"]
        assert events == harness.call("inspect", session=session_id, **where)["events"][-len(events) :]
    doctor = _cli(home, "doctor", "--json")
    assert doctor.exit_code == 0, doctor.output


def _unzstd(data: bytes) -> bytes:
    """Every frame of a zstd log, decoded."""
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
