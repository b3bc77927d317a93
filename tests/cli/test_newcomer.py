"""A new user's first commands: nothing fails before anything went wrong, and what they read is plain.

Every command runs through the real entry point (`python -m dsh` in a fresh process,
`tests/cli/entry.py`), some on a pseudo-terminal 80 columns wide. A default home that does not
exist yet is an empty home (no session yet, an unknown parent, a healthy doctor) and is not
created, while a database URL naming a store that does not exist stays an error. `dsh run
--session` with an unknown id leaves no writer-lock file behind. The demo says that its temporary
home is deleted and that `--keep` keeps it. Usage lines and option lists use classic placeholders
(`ID`, `--limit LIMIT`), never `{ID}` or `<int range>`. The demo's lines fit 80 columns without a
word cut in two. `dsh agents --verify` reads every cold child's log, so damage the projection cache
would hide shows (docs/cli.md#when-damage-shows).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import tempfile
import termios
from pathlib import Path

import pytest
import zstandard

from tests.cli.entry import GUARD_S, doctor_problems, dsh_command, dsh_process, open_store, write_family
from tests.helpers import tree_snapshot

pytestmark = pytest.mark.slow  # every test starts `dsh` processes: `make test` only

_REPO = Path(__file__).resolve().parent.parent.parent


def test_a_home_that_does_not_exist_yet_is_an_empty_home(tmp_path: Path) -> None:
    """sessions, agents, history and doctor on a missing default home answer as for an empty one; nothing is created."""
    home = tmp_path / "fresh"
    before = tree_snapshot(tmp_path)
    sessions = dsh_process("--home", str(home), "sessions")
    assert (sessions.returncode, sessions.stdout, sessions.stderr) == (0, "(no sessions yet)\n", "")
    as_json = dsh_process("--home", str(home), "sessions", "--json")
    assert json.loads(as_json.stdout) == {"items": [], "nextCursor": None}
    agents = dsh_process("--home", str(home), "agents", "X")
    assert agents.returncode == 0, agents.stderr
    assert "(no subagents)" in agents.stdout
    assert agents.stderr == f"no session X in {home}\n"
    history = dsh_process("--home", str(home), "history", "X")
    assert history.returncode == 3, history.stderr
    assert history.stderr == 'error [SESSION_QUERY_SESSION_NOT_FOUND]: session "X" not found\n'
    doctor = dsh_process("--home", str(home), "doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout
    report = json.loads(doctor.stdout)
    assert report["status"] == "ok"
    assert report["checks"][0] == {
        "name": "home",
        "status": "ok",
        "detail": f"{home} does not exist yet (nothing has been stored; the first dsh run creates it)",
    }
    assert report["problems"] == []
    assert tree_snapshot(tmp_path) == before


def test_a_database_url_naming_a_missing_store_stays_an_error(tmp_path: Path) -> None:
    """`sqlite://` on a missing home and `sqlite:///` naming a missing file: exit 5 and one line, nothing created."""
    before = tree_snapshot(tmp_path)
    for url in ("sqlite://", f"sqlite:///{tmp_path}/nowhere/sessions.sqlite3"):
        done = dsh_process("--home", str(tmp_path / "fresh"), "--database-url", url, "sessions")
        assert done.returncode == 5, done.stderr
        assert len(done.stderr.splitlines()) == 1
        assert done.stderr.startswith("error [STORE_MISCONFIGURED]: ")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_run_on_an_unknown_session_leaves_no_lock_file(tmp_path: Path, kind: str) -> None:
    """`dsh run --session nonexistent`: exit 3, "not found", and no `nonexistent.lock` appears."""
    store = open_store(kind, tmp_path)
    asyncio.run(write_family(store, ["good"]))
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"version": 1, "model": "scripted", "agents": {"main": {"steps": [{"text": "ok"}]}}}))
    locks = store.home / ("sessions.locks" if kind == "jsonl" else "sessions.sqlite3.locks")
    held_before = sorted(os.listdir(locks)) if locks.exists() else []
    done = store.run("run", "hi", "--session", "nonexistent", "--script", str(script))
    assert done.returncode == 3, done.stderr
    assert done.stderr == 'error [SESSION_NOT_FOUND]: session "nonexistent" not found\n'
    held_after = sorted(os.listdir(locks)) if locks.exists() else []
    assert held_after == held_before
    assert "nonexistent.lock" not in held_after


def test_the_demo_says_its_temporary_home_is_deleted_and_how_to_keep_it(tmp_path: Path) -> None:
    """Without --keep the home line says it is deleted and names --keep, and it is gone; with --keep it stays."""
    env = {"TMPDIR": str(tmp_path)}
    done = dsh_process("demo", env=env, timeout=2 * GUARD_S)
    assert done.returncode == 0, done.stderr
    deleted = r"^home: (\S+) \(a temporary folder, deleted at the end; --keep keeps it\)$"
    match = re.search(deleted, done.stdout, re.MULTILINE)
    assert match is not None, done.stdout
    assert not Path(match.group(1)).exists()
    assert f"deleted the temporary home {match.group(1)}; dsh demo --keep keeps it to look around" in done.stdout
    kept = dsh_process("demo", "--keep", env=env, timeout=2 * GUARD_S)
    assert kept.returncode == 0, kept.stderr
    match = re.search(r"^home: (\S+) \(a temporary folder, kept: --keep\)$", kept.stdout, re.MULTILINE)
    assert match is not None, kept.stdout
    assert Path(match.group(1)).is_dir()
    assert f"kept the home: {match.group(1)}" in kept.stdout
    shutil.rmtree(match.group(1))


def test_make_demo_passes_demo_args_to_the_demo() -> None:
    """`make demo DEMO_ARGS=--keep` runs `dsh demo --keep` (a dry run of make)."""
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    argv = ["make", "--no-print-directory", "-n", "demo", "DEMO_ARGS=--keep"]
    done = subprocess.run(argv, cwd=_REPO, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if "dsh demo" in line][-1].endswith("/dsh demo --keep")


_PLACEHOLDERS = re.compile(r"\{[A-Za-z_]+\}|(?<![/\w])<(?:str|int|float|path|bool|int range|float range)>")
"""Typer's placeholders (`{ID}`, `<int range>`); `sqlite:///<path>` in a help text is an example, not one."""

_USAGE = {
    "run": "Usage: dsh run [OPTIONS] PROMPT",
    "history": "Usage: dsh history [OPTIONS] ID",
    "agents": "Usage: dsh agents [OPTIONS] PARENT_ID",
    "sessions": "Usage: dsh sessions [OPTIONS]",
    "doctor": "Usage: dsh doctor [OPTIONS]",
    "serve": "Usage: dsh serve [OPTIONS]",
    "demo": "Usage: dsh demo [OPTIONS]",
}


@pytest.mark.parametrize("command", sorted(_USAGE))
def test_help_uses_classic_placeholders(command: str) -> None:
    """`dsh COMMAND --help`: the usage line names arguments plainly and no `{x}` or `<type>` placeholder appears."""
    done = dsh_process(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == _USAGE[command]
    assert _PLACEHOLDERS.search(done.stdout) is None, done.stdout
    assert all(len(line) <= 80 for line in done.stdout.splitlines() if not line.startswith("    dsh "))


def test_root_help_and_a_usage_error_use_classic_placeholders() -> None:
    """`dsh --help` lists `--home DIR` and `--database-url URL`; a missing argument repeats the plain usage line."""
    root = dsh_process("--help")
    assert "--home DIR " in root.stdout
    assert "--database-url URL " in root.stdout
    assert _PLACEHOLDERS.search(root.stdout) is None, root.stdout
    missing = dsh_process("history")
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[0] == "Usage: dsh history [OPTIONS] ID"
    limits = dsh_process("sessions", "--help")
    assert re.search(r"^  --limit LIMIT +Sessions per page", limits.stdout, re.MULTILINE), limits.stdout


def _on_a_terminal(columns: int, *args: str) -> str:
    """`python -m dsh ARGS` with stdout a pseudo-terminal `columns` wide and no colour; its output."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm", "NO_COLOR": "1"}
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    argv = [*dsh_command(), *args]
    with subprocess.Popen(argv, stdout=follower, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env) as child:
        os.close(follower)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closes with the child (EIO on Linux)
                break
            if not chunk:
                break
            chunks.append(chunk)
        child.wait(timeout=2 * GUARD_S)
    os.close(leader)
    assert child.returncode == 0
    return _SGR.sub("", b"".join(chunks).decode().replace("\r\n", "\n"))


_SGR = re.compile(r"\x1b\[[0-9;]*m")
"""Rich's styles (bold headings) on a terminal; NO_COLOR turns colours off, not bold."""


def _words(text: str) -> set[str]:
    return {word for word in re.split(r"[\s,|]+", text) if word}


def test_the_demo_fits_80_columns_without_cutting_a_word(tmp_path: Path) -> None:
    """On an 80-column terminal every demo line fits, and every word of the 200-column run is still whole."""
    # A short home path: a path wider than the screen is one word, which runs past the edge.
    scratch = Path(tempfile.mkdtemp(prefix="dsh-w-"))
    try:
        home = scratch / "h"
        narrow = _on_a_terminal(80, "demo", "--home", str(home))
        shutil.rmtree(home)
        wide = _on_a_terminal(200, "demo", "--home", str(home))
    finally:
        shutil.rmtree(scratch)
    assert max(len(line) for line in wide.splitlines()) > 80  # there was something to wrap
    too_wide = [line for line in narrow.splitlines() if len(line) > 80]
    assert too_wide == []
    # Tables drop columns at 80 (docs/cli.md#tables-at-80-columns); the narrative lines keep every word.
    narrative = [line for line in wide.splitlines() if not re.match(r"^(ID |00000001-|\(not shown)", line)]
    missing = _words("\n".join(narrative)) - _words(narrow)
    assert not missing, missing
    assert '  "message":"Add a conclusion."})' in narrow.splitlines()


def _corrupt_second_frame(log: Path) -> None:
    """Flip the checksum byte of the log's second zstd frame: a defect inside a complete frame."""
    data = bytearray(log.read_bytes())
    decoder = zstandard.ZstdDecompressor().decompressobj()
    decoder.decompress(bytes(data))
    first = len(data) - len(decoder.unused_data)
    decoder = zstandard.ZstdDecompressor().decompressobj()
    decoder.decompress(bytes(data[first:]))
    second_end = len(data) - len(decoder.unused_data)
    data[second_end - 1] ^= 0xFF
    log.write_bytes(bytes(data))


def test_agents_verify_reads_the_log_the_cache_would_answer_for(tmp_path: Path) -> None:
    """A cached one-shot child whose log is damaged is a row from the cache; `--verify` shows its diagnostic."""
    store = open_store("jsonl", tmp_path)
    asyncio.run(write_family(store, ["good", "cached"], one_shot=["cached"]))
    _corrupt_second_frame(store.home / "sessions" / "_no-cwd" / "cached" / "session.jsonl.zstd")
    before = tree_snapshot(store.home)
    trusting = store.run("agents", "P", "--json")
    assert trusting.returncode == 0, trusting.stderr
    assert [(row["id"], row["kind"]) for row in json.loads(trusting.stdout)] == [("good", "child"), ("cached", "child")]
    verified = store.run("agents", "P", "--verify", "--json")
    assert verified.returncode == 0, verified.stderr
    rows = json.loads(verified.stdout)
    assert rows[0]["id"] == "good"
    assert rows[1] == {"kind": "diagnostic", "id": "cached", "reason": "unavailable"}
    doctor = store.run("doctor", "--json")
    assert doctor.returncode == 7
    assert [(problem["sessionId"], problem["kind"]) for problem in doctor_problems(doctor.stdout)] == [
        ("cached", "unreadable")
    ]
    assert tree_snapshot(store.home) == before
