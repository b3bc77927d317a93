"""The child process the permission tests rely on really is refused by file modes, even under root.

Tests of mode-000 logs, mode-000 session folders and read-only homes run the code under test in such a
child (`tests/unprivileged.py`); if the capability drop silently stopped working they would pass for the
wrong reason or skip, so the mechanism itself is checked here and fails loudly instead of skipping
wherever it can work (any non-root user; root on Linux).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.unprivileged import probe_permission_checks, run_python

_CAN_HONOUR_MODES = os.name == "posix" and (os.geteuid() != 0 or sys.platform.startswith("linux"))


@pytest.mark.slow
@pytest.mark.skipif(not _CAN_HONOUR_MODES, reason="root outside Linux has no capabilities to drop")
def test_the_child_is_refused_a_mode_000_file_and_folder(tmp_path: Path) -> None:
    """A mode-000 file cannot be opened and a mode-000 folder cannot be listed by the child, while this process can."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"secret")
    secret.chmod(0)
    folder = tmp_path / "closed"
    folder.mkdir(mode=0)
    code = (
        "import os, sys\n"
        "for attempt in (lambda: open(sys.argv[1], 'rb').read(), lambda: os.listdir(sys.argv[2])):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('allowed')\n"
        "    except PermissionError:\n"
        "        print('refused')\n"
    )
    try:
        done = run_python(code, str(secret), str(folder))
    finally:
        folder.chmod(0o700)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "refused"]
    if os.geteuid() == 0:
        assert secret.read_bytes() == b"secret"


@pytest.mark.skipif(not _CAN_HONOUR_MODES, reason="root outside Linux has no capabilities to drop")
def test_the_permission_probe_passes_where_the_child_can_honour_modes() -> None:
    """The probe behind `require_permission_checks()` finds no reason to skip on any non-root user or on Linux root."""
    assert probe_permission_checks() is None
