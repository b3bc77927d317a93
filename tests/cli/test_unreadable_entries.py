"""Stored entries nobody can read are counted, never dropped, and odd ids get a plain answer.

Every command here runs through the real entry point (`python -m dsh` in a fresh process,
`tests/cli/entry.py`). A session folder that is a symbolic link loop or a dangling link, a log of
0 bytes and a log cut inside its header frame are each left out of `dsh agents` and counted on
stderr, and `dsh doctor` names them with their path and exits 7 (docs/storage-format.md#damage-stays-visible).
A project folder at mode 000 counts every session it holds, whether the parent index names them or
only the folder's link count tells how many there are; the kernel's refusal is real because those
commands run in a child that honours file modes (`tests/unprivileged.py`). A parent id that is not
UTF-8 answers as an unknown parent, and an id too long to be a file name is "not found", on every
backend. No command changes a byte of the home.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from dsh.testing.postgres import ThrowawaySchemas
from tests.cli.entry import BACKENDS, doctor_problems, open_store, unlisted_count, write_family
from tests.helpers import tree_snapshot
from tests.unprivileged import require_permission_checks, run_dsh

pytestmark = pytest.mark.slow  # every test starts `dsh` processes: `make test` only


def _family(tmp_path: Path, *children: str) -> Path:
    store = open_store("jsonl", tmp_path)
    asyncio.run(write_family(store, children))
    return store.home


def _folder(home: Path, session_id: str) -> Path:
    return home / "sessions" / "_no-cwd" / session_id


def _loop(home: Path) -> None:
    folder = _folder(home, "bad")
    shutil.rmtree(folder)
    folder.symlink_to("bad")  # a link to itself: every lookup through it fails with ELOOP


def _dangling(home: Path) -> None:
    folder = _folder(home, "bad")
    shutil.rmtree(folder)
    folder.symlink_to(home / "gone")


def _empty_log(home: Path) -> None:
    (_folder(home, "bad") / "session.jsonl.zstd").write_bytes(b"")


def _cut_header(home: Path) -> None:
    log = _folder(home, "bad") / "session.jsonl.zstd"
    log.write_bytes(log.read_bytes()[:10])  # inside the header's zstd frame


DAMAGE: dict[str, Callable[[Path], None]] = {
    "session folder is a symbolic link loop": _loop,
    "session folder is a dangling symbolic link": _dangling,
    "log of 0 bytes": _empty_log,
    "log cut inside its header frame": _cut_header,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_an_unreadable_entry_is_counted_by_agents_and_named_by_doctor(tmp_path: Path, damage: str) -> None:
    """The damaged child is no row but counted on stderr; doctor reports it with its path and exits 7."""
    home = _family(tmp_path, "good", "bad")
    DAMAGE[damage](home)
    before = tree_snapshot(home)
    store = open_store("jsonl", tmp_path)
    listed = store.run("agents", "P", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["id"] for row in json.loads(listed.stdout)] == ["good"]
    assert unlisted_count(listed.stderr) == 1
    doctor = store.run("doctor", "--json")
    assert doctor.returncode == 7, doctor.stderr
    (problem,) = doctor_problems(doctor.stdout)
    assert problem["kind"] == "unreadable"
    assert problem["severity"] == "fail"
    assert problem["sessionId"] == "bad"
    assert problem["path"].startswith(str(_folder(home, "bad")))
    assert tree_snapshot(home) == before


def test_an_empty_log_is_named_for_what_it_is(tmp_path: Path) -> None:
    """Doctor's reason for a 0-byte log and for a cut header says which it is, not just "corrupt"."""
    home = _family(tmp_path, "good", "bad", "cut")
    _empty_log(home)
    log = _folder(home, "cut") / "session.jsonl.zstd"
    log.write_bytes(log.read_bytes()[:10])
    doctor = open_store("jsonl", tmp_path).run("doctor", "--json")
    reasons = {problem["sessionId"]: problem["reason"] for problem in doctor_problems(doctor.stdout)}
    assert "the log is empty (0 bytes)" in reasons["bad"]
    assert "the header) is incomplete: the log ends after 10 bytes" in reasons["cut"]


@pytest.mark.parametrize("index", ["with the parent index", "without the parent index"])
def test_a_mode_000_project_folder_counts_every_session_it_holds(tmp_path: Path, index: str) -> None:
    """Four sessions in a project folder nobody may list: agents counts 4 and doctor names 4, not 1."""
    require_permission_checks()
    store = open_store("jsonl", tmp_path)
    asyncio.run(write_family(store, ["c1", "c2", "c3"]))
    home = store.home
    project = home / "sessions" / "_no-cwd"
    if index == "without the parent index":
        shutil.rmtree(home / "sessions.index")
    project.chmod(0)
    try:
        before = tree_snapshot(home)
        listed = run_dsh("--home", str(home), "agents", "P")
        doctor = run_dsh("--home", str(home), "doctor", "--json")
        after = tree_snapshot(home)
    finally:
        project.chmod(0o700)
    assert listed.returncode == 0, listed.stderr
    assert unlisted_count(listed.stderr) == 4
    assert doctor.returncode == 7, doctor.stderr
    problems = doctor_problems(doctor.stdout)
    assert len(problems) == 4
    assert {problem["kind"] for problem in problems} == {"unreadable"}
    assert all("Permission denied" in problem["reason"] for problem in problems)
    if index == "with the parent index":
        assert sorted(problem["sessionId"] for problem in problems) == ["P", "c1", "c2", "c3"]
    assert after == before


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_parent_id_that_is_not_utf8_is_an_unknown_parent(
    tmp_path: Path, kind: str, pg_schemas: ThrowawaySchemas
) -> None:
    """`dsh agents $'\\xff'` prints `(no subagents)` and `no session ...` on stderr, exit 0, on every backend."""
    store = open_store(kind, tmp_path, pg_schemas)
    asyncio.run(write_family(store, ["good"]))
    text = store.run("agents", os.fsdecode(b"\xff"))
    assert text.returncode == 0, text.stderr
    assert "(no subagents)" in text.stdout
    assert f"no session \\udcff in {store.home}" in text.stderr
    as_json = store.run("agents", os.fsdecode(b"\xff"), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_an_id_too_long_for_a_file_name_is_not_found(tmp_path: Path, kind: str, pg_schemas: ThrowawaySchemas) -> None:
    """A 300-character id: `dsh history` says not found (exit 3) and `dsh agents` knows no such parent."""
    store = open_store(kind, tmp_path, pg_schemas)
    asyncio.run(write_family(store, ["good"]))
    long_id = "a" * 300
    history = store.run("history", long_id)
    assert history.returncode == 3, history.stderr
    assert history.stderr.startswith("error [SESSION_QUERY_SESSION_NOT_FOUND]: session ")
    assert "Errno" not in history.stderr
    assert str(store.home) not in history.stderr
    agents = store.run("agents", long_id)
    assert agents.returncode == 0, agents.stderr
    assert "(no subagents)" in agents.stdout
