"""`dsh serve` and its security: the token file, the printed URL, bind refusals and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dsh.config import Config, ServerConfig
from dsh.errors import ConfigError
from dsh.runtime import Runtime
from dsh.server.security import HostCheck, bearer_matches, check_bind, is_loopback, load_token
from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply

GUARD_S = 60.0
"""A hang guard for the server process, never a timing assertion."""


def test_the_token_file_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    """The first load creates a 0600 file and says it is fresh; later loads read it back, not fresh."""
    home = tmp_path / "home"
    first = load_token(home)
    assert first.fresh is True
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert len(first.value) >= 43
    again = load_token(home)
    assert (again.value, again.fresh) == (first.value, False)
    assert first.value not in repr(first)
    rotated = load_token(home, rotate=True)
    assert rotated.fresh is True
    assert rotated.value != first.value
    assert stat.S_IMODE(rotated.path.stat().st_mode) == 0o600
    assert load_token(home).value == rotated.value


def test_an_unsafe_or_strange_token_file_stops_the_start(tmp_path: Path) -> None:
    """A group/other-readable token file, a symlink or a file without a usable token is a `ConfigError`."""
    home = tmp_path / "home"
    token = load_token(home)
    token.path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by group or others"):
        load_token(home)
    token.path.unlink()
    (tmp_path / "elsewhere").write_text("x" * 50)
    token.path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="cannot read the token file"):
        load_token(home)
    token.path.unlink()
    fd = os.open(token.path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"short\n")
    os.close(fd)
    with pytest.raises(ConfigError, match="does not hold a usable token"):
        load_token(home)


def test_bind_and_host_rules() -> None:
    """The default bind is 127.0.0.1:8765; loopback binds need nothing; others need `allow_remote`;
    wildcard binds skip the Host check."""
    defaults = ServerConfig()
    assert (defaults.host, defaults.port) == ("127.0.0.1", 8765)
    assert is_loopback(defaults.host)
    for host in ("127.0.0.1", "127.1.2.3", "::1", "localhost", "[::1]"):
        assert is_loopback(host)
        assert check_bind(host, allow_remote=False) is False
    for host in ("0.0.0.0", "192.0.2.1", "example.org"):
        with pytest.raises(ConfigError, match="--allow-remote"):
            check_bind(host, allow_remote=False)
        assert check_bind(host, allow_remote=True) is True
    loopback = HostCheck("127.0.0.1")
    assert loopback.allows("127.0.0.1:8765")
    assert loopback.allows("localhost")
    assert not loopback.allows("evil.test")
    assert not loopback.allows(None)
    assert HostCheck("::1").allows("[::1]:8765")
    assert HostCheck("0.0.0.0").allows("anything.example")
    assert bearer_matches("Bearer abc", "abc")
    assert not bearer_matches("Bearer abd", "abc")


def _script(path: Path) -> Path:
    script = {
        "version": 1,
        "model": "scripted-serve",
        "agents": {"main": {"steps": [{"text": "FIRST"}, {"hold": "never", "text": "held forever"}]}},
    }
    path.write_text(json.dumps(script), encoding="utf-8")
    return path


def _dsh(
    home: Path, *args: str, options: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`dsh [options] --home HOME serve --port 0 ARGS` with no `DSH_*`/`DEEPSEEK_*` variable but those of `env`."""
    entry = "from dsh.cli.main import main; main()"
    command = [sys.executable, "-c", entry, *options, "--home", str(home), "serve", "--port", "0"]
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("DSH_", "DEEPSEEK_"))}
    return subprocess.Popen(
        [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**clean, **(env or {})}, bufsize=0
    )


_pending: dict[int, bytes] = {}


def _line(process: subprocess.Popen[bytes]) -> str:
    """The next stdout line (read straight from the pipe: a buffered reader would hide lines from `select`)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    buffered = _pending.get(process.pid, b"")
    while b"\n" not in buffered:
        ready, _, _ = select.select([fd], [], [], GUARD_S)
        assert ready, "dsh serve printed nothing"
        chunk = os.read(fd, 4096)
        assert chunk, "dsh serve closed its output"
        buffered += chunk
    line, _, _pending[process.pid] = buffered.partition(b"\n")
    return line.decode().strip()


def _stop(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    code, _, stderr = _stop_all(process)
    return code, stderr


def _stop_all(process: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    """SIGINT, then the exit code, the rest of stdout (after the lines already read) and stderr."""
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=GUARD_S)
    rest = _pending.pop(process.pid, b"") + stdout
    return process.returncode, rest.decode(), stderr.decode()


@pytest.mark.slow
def test_dsh_serve_prints_the_token_once_and_shuts_down_gracefully(tmp_path: Path) -> None:
    """First start prints the URL with `#token=`; Ctrl-C exits 130 and an open turn ends `aborted` (disposed);
    the next start prints the URL without the token and says where the file is."""
    home = tmp_path / "home"
    script = _script(tmp_path / "script.json")
    process = _dsh(home, "--script", str(script))
    try:
        url = _line(process)
        assert url.startswith("http://127.0.0.1:")
        assert "/#token=" in url
        base, token = url.split("/#token=")
        assert token == (home / "serve-token").read_text().strip()
        assert "kept in" in _line(process)
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=auth, timeout=GUARD_S) as http:
            session_id = http.post("/api/v1/sessions", json={"prompt": "first"}).json()["session"]["id"]
            with http.stream("GET", "/api/v1/stream", params={"sessionId": session_id}) as stream:
                prompt = {"content": [{"type": "text", "text": "second"}]}
                assert http.post(f"/api/v1/sessions/{session_id}/prompt", json=prompt).status_code == 202
                lines = stream.iter_lines()
                for line in lines:
                    frame = json.loads(line[6:]) if line.startswith("data: ") else {}
                    if frame.get("type") == "step/start" and frame.get("turn") == 2:
                        break
                code, stderr = _stop(process)
                list(lines)  # returns because the shutdown ended the stream (else the read times out)
    finally:
        if process.returncode is None:
            code, stderr = _stop(process)
    assert code == 130, stderr
    assert token not in stderr
    assert f"POST /api/v1/sessions/{session_id}/prompt 202" in stderr

    async def last_turn_end() -> object:
        async with Runtime.open(Config(home=home)) as rt:
            events = (await rt.query.observe_session(session_id)).events
            return [event.data for event in events if event.type == "turn/end"][-1]

    end = asyncio.run(last_turn_end())
    assert end == {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "disposed"}}}
    again = _dsh(home, "--script", str(script))
    try:
        url = _line(again)
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/")
        assert "#token" not in url
        assert str(home / "serve-token") in _line(again)
    finally:
        code, _ = _stop(again)
    assert code == 130


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "prepare", "message"),
    [
        (("--host", "0.0.0.0"), None, "--allow-remote"),
        ((), "0644", "readable by group or others"),
    ],
)
def test_dsh_serve_refuses_to_start_with_exit_4(
    tmp_path: Path, args: tuple[str, ...], prepare: str | None, message: str
) -> None:
    """A non-loopback `--host` without `--allow-remote`, or a 0644 token file, exits 4 before serving."""
    home = tmp_path / "home"
    if prepare is not None:
        load_token(home).path.chmod(int(prepare, 8))
    process = _dsh(home, *args)
    stdout, stderr = process.communicate(timeout=GUARD_S)
    assert process.returncode == 4, stderr
    assert message in stderr.decode()
    assert stdout == b""


@pytest.mark.slow
def test_dsh_serve_with_allow_remote_warns(tmp_path: Path) -> None:
    """`--host 0.0.0.0 --allow-remote` starts, with a warning on stderr."""
    process = _dsh(tmp_path / "home", "--host", "0.0.0.0", "--allow-remote")
    try:
        assert "#token=" in _line(process)
    finally:
        code, stderr = _stop(process)
    assert code == 130
    assert "warning: listening on 0.0.0.0" in stderr


@pytest.mark.slow
def test_dsh_serve_rotate_token_prints_a_new_token_once_and_retires_the_old_one(tmp_path: Path) -> None:
    """`--rotate-token` replaces the 0600 token file, prints the new token in the URL, and the old one is 401."""
    home = tmp_path / "home"
    old = load_token(home).value
    process = _dsh(home, "--rotate-token")
    try:
        url = _line(process)
        base, _, token = url.partition("/#token=")
        assert token
        assert token != old
        assert token == (home / "serve-token").read_text().strip()
        assert stat.S_IMODE((home / "serve-token").stat().st_mode) == 0o600
        assert "kept in" in _line(process)
        with httpx.Client(base_url=base, timeout=GUARD_S) as http:
            stale = http.get("/api/v1/sessions", headers={"Authorization": f"Bearer {old}"})
            fresh = http.get("/api/v1/sessions", headers={"Authorization": f"Bearer {token}"})
        assert stale.status_code == 401
        assert stale.json()["error"]["code"] == "unauthenticated"
        assert fresh.status_code == 200
    finally:
        code, rest, stderr = _stop_all(process)
    assert code == 130, stderr
    assert token not in rest
    assert token not in stderr
    assert old not in rest + stderr


@pytest.mark.slow
def test_dsh_serve_never_logs_the_model_key_even_verbose(tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    """`dsh -v serve` with a model key: a real turn goes to the (fake) endpoint, and the key is in no output."""
    key = "sk-serve-never-logged-5150"
    openai_server.enqueue(FakeReply(text="HELLO FROM THE MODEL", chunks=3))
    env = {"DSH_MODEL_API_KEY": key, "DSH_MODEL_BASE_URL": openai_server.base_url}
    process = _dsh(tmp_path / "home", options=("-v",), env=env)
    try:
        base, _, token = _line(process).partition("/#token=")
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=GUARD_S) as http:
            created = http.post("/api/v1/sessions", json={})
            assert created.status_code == 201, created.text
            session_id = created.json()["session"]["id"]
            with http.stream("GET", "/api/v1/stream", params={"sessionId": session_id}) as stream:
                prompt = {"content": [{"type": "text", "text": "hello"}]}
                assert http.post(f"/api/v1/sessions/{session_id}/prompt", json=prompt).status_code == 202
                for line in stream.iter_lines():
                    frame = json.loads(line[6:]) if line.startswith("data: ") else {}
                    if frame.get("type") == "turn/end":
                        assert frame["summary"] == {"reason": {"kind": "completed"}}
                        break
            page = http.get(f"/api/v1/sessions/{session_id}/history").json()
    finally:
        code, rest, stderr = _stop_all(process)
    assert code == 130, stderr
    texts = [entry["event"]["data"] for entry in page["events"] if entry["event"]["type"] == "assistant/message"]
    assert texts[-1]["message"]["content"] == [{"type": "text", "text": "HELLO FROM THE MODEL"}]
    assert openai_server.requests[-1].headers["authorization"] == f"Bearer {key}"
    assert "DEBUG" in stderr, "verbose logging was on"
    assert key not in rest
    assert key not in stderr
    assert key not in json.dumps(page)
