"""`dsh doctor`: every stored session read once, read-only; one line per problem; exit 7 on damage.

A home with exactly one damaged log and one damaged header reports exactly those two problems
(`unreadable`) and exits 7; a subagent child without its descriptor is `subagent-without-identity`;
warnings (`orphan`, `upstream-header`, `torn-tail`) alone exit 0; a clean home exits 0. The files are
unchanged afterwards (tree snapshots: bytes, modes, mtimes). `--json` is one JSON document, and the
progress bar appears only on a terminal's stderr, never with `--json` (docs/cli.md#dsh-doctor).
Permission damage (mode-000 logs and folders, an unwritable home) is checked in a child process that
honours file modes even as root (`tests/unprivileged.py`); a FIFO in the cache's place never blocks.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard
from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.doctor import run_doctor
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.testing.jsonl_writer import JsonlLogWriter
from dsh.testing.stored_logs import stored_header
from tests.helpers import tree_snapshot
from tests.unprivileged import require_permission_checks, run_dsh

runner = CliRunner()
_GUARD_S = 60


async def _build(home: Path, *, broken_child: bool = False, children: int = 1) -> None:
    """A parent `P` with healthy continuable children (and, on request, one without a descriptor)."""
    async with Runtime.open(Config(home=home)) as rt:
        parent = rt.sessions.create("P")
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        sessions = [parent]
        for index in range(children):
            descriptor = snapshot_descriptor("continuable", provider="spawn", label=f"child {index}")
            child = rt.sessions.create(
                f"C{index}",
                header=HeaderInit(parent_session="P", origin="subagent", delegation_depth=1),
                seed=[{"type": "subagent/descriptor", "seq": 0, "time": 1, "data": descriptor}],
            )
            child.append("turn/start", {"turn": 1})
            child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            sessions.append(child)
        if broken_child:
            broken = rt.sessions.create(
                "C-broken", header=HeaderInit(parent_session="P", origin="subagent", delegation_depth=1)
            )
            broken.append("turn/start", {"turn": 1})
            broken.append("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}})
            sessions.append(broken)
        for session in sessions:
            await rt.sessions.flush(session)


def _home(tmp_path: Path, **kwargs: Any) -> Path:
    home = tmp_path / "home"
    asyncio.run(_build(home, **kwargs))
    return home


def _doctor(home: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = runner.invoke(app, ["--home", str(home), "doctor", "--json", *args])
    return result.exit_code, json.loads(result.stdout), result.stderr


def _problems(report: dict[str, Any]) -> list[tuple[object, ...]]:
    problems = report["problems"]
    assert isinstance(problems, list)
    return sorted((p["kind"], p["severity"], p["sessionId"]) for p in problems)


def test_a_clean_home_exits_0_with_no_problems(tmp_path: Path) -> None:
    """A healthy home: status ok, every check ok, no problem, exit 0, and nothing changed."""
    home = _home(tmp_path, children=2)
    before = tree_snapshot(home)
    code, report, _ = _doctor(home)
    assert code == 0
    assert report["status"] == "ok"
    assert report["problems"] == []
    assert report["sessions"] == 3
    assert {check["name"]: check["status"] for check in report["checks"]} == {
        "home": "ok",
        "free-space": "ok",
        "cache": "ok",
        "serve-token": "ok",
        "model-url": "ok",
        "model-key": "ok",
        "store": "ok",
    }
    assert tree_snapshot(home) == before


def test_one_damaged_log_and_one_damaged_header_are_exactly_the_two_problems(tmp_path: Path) -> None:
    """A corrupt log and an invalid header: exactly two `unreadable` problems (id, path, reason), exit 7."""
    home = _home(tmp_path, children=2)
    writer = JsonlLogWriter(home / "sessions")
    asyncio.run(writer.damage_events("C0"))
    bad_header = stored_header("C1", parentSession="P", origin="elsewhere", delegationDepth=1)
    data = Path(writer.path_of("C1")).read_bytes()
    decoder = zstandard.ZstdDecompressor().decompressobj()
    decoder.decompress(data)
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(json.dumps(bad_header).encode() + b"\n")
    Path(writer.path_of("C1")).write_bytes(frame + decoder.unused_data)
    before = tree_snapshot(home)
    code, report, _ = _doctor(home)
    assert code == 7
    assert report["status"] == "fail"
    assert _problems(report) == [("unreadable", "fail", "C0"), ("unreadable", "fail", "C1")]
    for problem in report["problems"]:
        assert problem["path"] == writer.path_of(problem["sessionId"])
        assert problem["reason"]
    assert tree_snapshot(home) == before


def test_a_child_without_its_descriptor_is_subagent_without_identity(tmp_path: Path) -> None:
    """The catalog's `corrupt` child is `subagent-without-identity`, exit 7, and no byte or mtime changes."""
    home = _home(tmp_path, broken_child=True)
    before = tree_snapshot(home)
    code, report, _ = _doctor(home)
    assert code == 7
    assert _problems(report) == [("subagent-without-identity", "fail", "C-broken")]
    assert tree_snapshot(home) == before
    listed = runner.invoke(app, ["--home", str(home), "agents", "P", "--json"])
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows["C-broken"] == {"kind": "diagnostic", "id": "C-broken", "reason": "corrupt"}


def test_unlisted_entries_are_unreadable_with_their_path(tmp_path: Path) -> None:
    """A FIFO, a directory and a dangling symlink in place of logs are `unreadable` problems naming the path."""
    home = _home(tmp_path, children=4)
    writer = JsonlLogWriter(home / "sessions")
    paths = {session_id: Path(writer.path_of(session_id)) for session_id in ("C1", "C2", "C3")}
    for path in paths.values():
        path.unlink()
    os.mkfifo(paths["C1"])
    paths["C2"].mkdir()
    paths["C3"].symlink_to(home / "nowhere")
    before = tree_snapshot(home)
    code, report, _ = _doctor(home)
    assert code == 7
    assert _problems(report) == [
        ("unreadable", "fail", "C1"),
        ("unreadable", "fail", "C2"),
        ("unreadable", "fail", "C3"),
    ]
    assert {p["sessionId"]: p["path"] for p in report["problems"]} == {
        session_id: str(path) for session_id, path in paths.items()
    }
    assert tree_snapshot(home) == before


@pytest.mark.slow
def test_a_mode_000_log_and_a_mode_000_folder_are_unreadable_problems(tmp_path: Path) -> None:
    """Run where modes are enforced (even as root): a mode-000 log and a mode-000 session folder are two problems."""
    require_permission_checks()
    home = _home(tmp_path, children=3)
    writer = JsonlLogWriter(home / "sessions")
    log = Path(writer.path_of("C1"))
    folder = Path(writer.path_of("C2")).parent
    log.chmod(0)
    folder.chmod(0)
    try:
        before = tree_snapshot(home)
        done = run_dsh("--home", str(home), "doctor", "--json")
        after = tree_snapshot(home)
    finally:
        folder.chmod(0o700)
    assert done.returncode == 7, done.stderr
    report = json.loads(done.stdout)
    assert _problems(report) == [("unreadable", "fail", "C1"), ("unreadable", "fail", "C2")]
    assert {p["sessionId"]: p["path"] for p in report["problems"]} == {"C1": str(log), "C2": str(folder)}
    assert all("Permission denied" in p["reason"] for p in report["problems"])
    assert after == before


@pytest.mark.slow
def test_an_unwritable_home_is_read_with_warnings_only(tmp_path: Path) -> None:
    """Where modes are enforced (even as root) a mode-500 home is read: `home` and `cache` warn, exit 0."""
    require_permission_checks()
    home = _home(tmp_path, children=2)
    home.chmod(0o500)
    try:
        before = tree_snapshot(home)
        done = run_dsh("--home", str(home), "doctor", "--json")
        listed = run_dsh("--home", str(home), "agents", "P", "--json")
        after = tree_snapshot(home)
    finally:
        home.chmod(0o700)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    checks = {check["name"]: check for check in report["checks"]}
    assert (checks["home"]["status"], checks["cache"]["status"], checks["store"]["status"]) == ("warn", "warn", "ok")
    assert "not writable" in checks["home"]["detail"]
    assert "cache.sqlite3-shm" in checks["cache"]["detail"]
    assert (report["status"], report["sessions"], report["problems"]) == ("warn", 3, [])
    assert listed.returncode == 0, listed.stderr
    assert [row["id"] for row in json.loads(listed.stdout)] == ["C0", "C1"]
    assert listed.stderr == ""
    assert after == before


@pytest.mark.slow
def test_a_fifo_in_place_of_the_cache_fails_its_check_without_blocking(tmp_path: Path) -> None:
    """A FIFO named `cache.sqlite3`: doctor (a real process) is never blocked opening it and fails the cache check."""
    home = _home(tmp_path)
    cache = home / "cache.sqlite3"
    cache.unlink()
    os.mkfifo(cache)
    before = tree_snapshot(home)
    argv = [sys.executable, "-c", "from dsh.cli.main import main; main()", "--home", str(home), "doctor", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_GUARD_S, check=False)
    assert done.returncode == 7, done.stderr
    checks = {check["name"]: check for check in json.loads(done.stdout)["checks"]}
    assert checks["cache"]["status"] == "fail"
    assert "is not a regular file" in checks["cache"]["detail"]
    assert checks["store"]["status"] == "ok"
    assert tree_snapshot(home) == before


def test_warnings_alone_exit_0(tmp_path: Path) -> None:
    """An orphan, a Windows `cwd` header and a torn tail are warnings: listed, status warn, exit 0."""
    home = _home(tmp_path)
    writer = JsonlLogWriter(home / "sessions")
    closed = [
        {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
        {"type": "turn/end", "seq": 1, "time": 2, "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]
    asyncio.run(writer.write("orphan", stored_header("orphan", parentSession="gone"), closed))
    asyncio.run(writer.write("win", stored_header("win", cwd="C:\\work"), closed))
    asyncio.run(writer.write("torn", stored_header("torn"), closed, batches=[1, 1]))
    asyncio.run(writer.tear("torn", "last-block"))
    code, report, _ = _doctor(home)
    assert code == 0
    assert report["status"] == "warn"
    assert _problems(report) == [
        ("orphan", "warn", "orphan"),
        ("torn-tail", "warn", "torn"),
        ("upstream-header", "warn", "win"),
    ]


def test_a_store_holding_both_encodings_is_a_warning_about_the_harness(tmp_path: Path) -> None:
    """Logs of both encodings read fine, and `log-encodings` warns (the TypeScript harness refuses such a
    root), counting each kind; a store of one encoding shows no such check (see the clean home)."""
    home = _home(tmp_path)
    closed = [
        {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
        {"type": "turn/end", "seq": 1, "time": 2, "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]
    asyncio.run(JsonlLogWriter(home / "sessions", compression="none").write("plain", stored_header("plain"), closed))
    code, report, _ = _doctor(home)
    assert code == 0
    assert report["problems"] == []
    assert report["sessions"] == 3
    check = next(check for check in report["checks"] if check["name"] == "log-encodings")
    assert check["status"] == "warn"
    assert "1 session.jsonl, 2 session.jsonl.zstd" in check["detail"]
    assert "TypeScript harness refuses" in check["detail"]


def test_the_text_report_is_one_line_per_problem(tmp_path: Path) -> None:
    """Without `--json`: one line per check and per problem (severity, kind, id, path, reason), then a summary."""
    home = _home(tmp_path, broken_child=True)
    result = runner.invoke(app, ["--home", str(home), "doctor", "--plain"])
    assert result.exit_code == 7
    lines = result.stdout.splitlines()
    problem_lines = [line for line in lines if "subagent-without-identity" in line]
    assert len(problem_lines) == 1
    assert problem_lines[0].startswith("fail")
    assert "C-broken" in problem_lines[0]
    assert str(home / "sessions") in problem_lines[0]
    assert lines[-1].endswith("exit 7")
    assert result.stderr == ""


def test_a_missing_home_is_an_empty_home_and_is_not_created(tmp_path: Path) -> None:
    """Doctor on a default home that does not exist yet: `home` ok, an empty store, exit 0, nothing created."""
    before = tree_snapshot(tmp_path)
    code, report, _ = _doctor(tmp_path / "absent")
    assert code == 0
    assert report["checks"][0] == {
        "name": "home",
        "status": "ok",
        "detail": f"{tmp_path / 'absent'} does not exist yet (nothing has been stored; the first dsh run creates it)",
    }
    assert report["sessions"] == 0
    assert report["problems"] == []
    assert tree_snapshot(tmp_path) == before


def test_a_damaged_cache_file_fails_its_check(tmp_path: Path) -> None:
    """A `cache.sqlite3` that is not a database fails the cache check (opened read-only, left unchanged)."""
    home = _home(tmp_path)
    (home / "cache.sqlite3").write_bytes(b"this is not a database" * 100)
    before = tree_snapshot(home)
    code, report, _ = _doctor(home)
    assert code == 7
    checks = {check["name"]: check["status"] for check in report["checks"]}
    assert checks["cache"] == "fail"
    assert tree_snapshot(home) == before


async def test_the_library_report_counts_progress(tmp_path: Path) -> None:
    """`run_doctor` calls the progress callback once per session read, ending at (n, n)."""
    home = tmp_path / "home"
    await _build(home, children=3)
    seen: list[tuple[int, int]] = []
    report = await run_doctor(Config(home=home), progress=lambda done, total: seen.append((done, total)))
    assert report.status == "ok"
    assert seen[0] == (0, 4)
    assert seen[-1] == (4, 4)
    assert sorted(done for done, _ in seen[1:]) == [1, 2, 3, 4]


def _run_with_pty_stderr(args: list[str]) -> tuple[int, str, str]:
    """Run `dsh` with stdout a pipe and stderr a pseudo-terminal; return exit code, stdout and stderr."""
    leader, follower = pty.openpty()
    argv = [sys.executable, "-c", "from dsh.cli.main import main; main()", *args]
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, env=env) as child:
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        out, _ = child.communicate(timeout=_GUARD_S)
    os.close(leader)
    return child.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_json_under_a_terminal_is_one_document_and_shows_no_progress(tmp_path: Path) -> None:
    """`dsh doctor --json` with a terminal on stderr: stdout parses as one JSON document, stderr stays empty."""
    home = _home(tmp_path, broken_child=True, children=3)
    code, out, err = _run_with_pty_stderr(["--home", str(home), "doctor", "--json"])
    assert code == 7
    assert json.loads(out)["status"] == "fail"
    assert err == ""


@pytest.mark.slow
def test_the_text_report_under_a_terminal_shows_progress_on_stderr_only(tmp_path: Path) -> None:
    """Without `--json`, a terminal on stderr gets the progress bar; stdout carries only the report."""
    home = _home(tmp_path, children=3)
    code, out, err = _run_with_pty_stderr(["--home", str(home), "doctor"])
    assert code == 0
    assert "reading sessions" in err
    assert "reading sessions" not in out
    assert out.splitlines()[0].startswith("dsh doctor:")


def test_doctor_on_the_demo_home_names_the_damaged_child(tmp_path: Path) -> None:
    """After `dsh demo`, doctor names the damaged child `subagent-without-identity`, exits 7, changes nothing."""
    home = tmp_path / "demo"
    demo = runner.invoke(app, ["demo", "--home", str(home), "--plain"])
    assert demo.exit_code == 0, demo.output
    before = tree_snapshot(home)
    code, report, _ = _doctor(home)
    assert code == 7
    problems = report["problems"]
    assert isinstance(problems, list)
    assert [problem["kind"] for problem in problems] == ["subagent-without-identity"]
    listed = runner.invoke(app, ["--home", str(home), "agents", str(demo_parent(home)), "--json"])
    diagnostic = [row["id"] for row in json.loads(listed.stdout) if row["kind"] == "diagnostic"]
    assert [problem["sessionId"] for problem in problems] == diagnostic
    assert tree_snapshot(home) == before
    healthy = _home(tmp_path / "healthy")
    assert _doctor(healthy)[0] == 0


def demo_parent(home: Path) -> str:
    """The demo's parent: the one stored session without a `parentSession`."""

    async def find() -> str:
        async with Runtime.open(Config(home=home), read_only=True) as rt:
            roots = [row.header.id for row in await rt.persistence.list() if row.header.parent_session is None]
        assert len(roots) == 1
        return roots[0]

    return asyncio.run(find())
