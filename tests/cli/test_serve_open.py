"""`dsh serve --open`: the browser is handed the UI's URL with the token in its fragment, nowhere else."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

GUARD_S = 60.0
"""A hang guard for the server process and the recorded browser call, never a timing assertion."""


def _read_fifo(path: Path) -> str:
    """Everything one writer puts into the FIFO at `path` (waits for it under the guard)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        chunks: list[bytes] = []
        while True:
            ready, _, _ = select.select([fd], [], [], GUARD_S)
            assert ready, "the browser command was never run"
            chunk = os.read(fd, 4096)
            if not chunk and chunks:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


@pytest.mark.slow
def test_open_hands_the_token_url_to_the_browser(tmp_path: Path) -> None:
    """`--open` runs `BROWSER` with `http://127.0.0.1:<port>/#token=<token>`; output never repeats a known token."""
    home = tmp_path / "home"
    fifo = tmp_path / "opened"
    os.mkfifo(fifo)
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {fifo}\n', encoding="utf-8")
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DSH_", "DEEPSEEK_"))}
    env["BROWSER"] = f"{browser} %s"
    home.mkdir()
    # A token that already exists is not printed again, yet --open still opens the page signed in.
    token = "t" * 43
    token_file = home / "serve-token"
    token_file.write_text(token + "\n", encoding="ascii")
    token_file.chmod(0o600)
    command = [
        sys.executable,
        "-c",
        "from dsh.cli.main import main; main()",
        "--home",
        str(home),
        "serve",
        "--port",
        "0",
        "--open",
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as process:
        try:
            url = _read_fifo(fifo)
        finally:
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=GUARD_S)
    assert process.returncode == 130, err.decode()
    printed = out.decode().splitlines()
    assert printed[0].startswith("http://127.0.0.1:")
    assert url == f"{printed[0]}#token={token}"
    assert token not in out.decode()
    assert token not in err.decode()
