"""Run code in a child process that cannot bypass file permissions, even when the suite runs as root.

Damage such as a mode-000 log or a mode-000 session folder only exists for a process that honours file
modes. Root does not: `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` let it read, write and list
anything, and the suite (like CI) runs as root. The tests that need a real refusal from the kernel
therefore run the code under test in a fresh interpreter that first drops both capabilities from its
effective, permitted and inheritable sets (and from its bounding set where it may), so the kernel checks
modes for it as for any other user. Files keep their owner, so the test process can still build the
home and snapshot it. A non-root user needs no drop; the child then runs as it is.

`require_permission_checks()` proves the mechanism once per run with a probe (a mode-000 file must
refuse to open and a mode-000 folder must refuse to list inside such a child) and skips the calling
test, with the probe's reason, only when neither a non-root user nor the capability drop is available.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

__all__ = ["drop_permission_bypass", "probe_permission_checks", "require_permission_checks", "run_dsh", "run_python"]

_REPO = str(Path(__file__).resolve().parent.parent)
_GUARD_S = 60

# <linux/capability.h>: the two capabilities that let root ignore file modes, and the v3 ABI.
_CAP_DAC_OVERRIDE = 1
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP = 24


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_permission_bypass() -> None:
    """Make this process honour file modes: drop the DAC capabilities (root) or do nothing (non-root).

    Raises:
        OSError: root on a system without Linux capabilities, or `capset` refused the drop.
    """
    if os.name != "posix" or os.geteuid() != 0:
        return
    if not sys.platform.startswith("linux"):
        raise OSError("root outside Linux cannot drop the capabilities that bypass file modes")
    libc = ctypes.CDLL(None, use_errno=True)
    # The bounding set only matters if this child executes another program (root regains every
    # capability in it on exec); dropping from it needs CAP_SETPCAP, so a refusal here is tolerated.
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    keep = ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    # Lowering capabilities of one's own process never needs privilege, so this only fails on a
    # kernel without capability support.
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


_PRELUDE = "import tests.unprivileged as _u\n_u.drop_permission_bypass()\ndel _u\n"


def run_python(code: str, *args: str, timeout: float = _GUARD_S) -> subprocess.CompletedProcess[str]:
    """Run Python source `code` (with `sys.argv[1:] == args`) in a child that honours file modes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, env.get("PYTHONPATH")]))
    argv = [sys.executable, "-c", _PRELUDE + code, *args]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL
    )


def run_dsh(*args: str, timeout: float = _GUARD_S) -> subprocess.CompletedProcess[str]:
    """Run the `dsh` command line with `args` in a child that honours file modes."""
    return run_python("from dsh.cli.main import main\nmain()\n", *args, timeout=timeout)


_PROBE = """
import os, sys
refused = []
try:
    open(sys.argv[1], "rb").close()
except PermissionError:
    refused.append("file")
try:
    os.listdir(sys.argv[2])
except PermissionError:
    refused.append("folder")
print(",".join(refused))
"""


@functools.cache
def probe_permission_checks() -> str | None:
    """None when a child refuses a mode-000 file and a mode-000 folder; otherwise why not."""
    with tempfile.TemporaryDirectory() as scratch:
        locked_file = Path(scratch) / "locked.bin"
        locked_file.write_bytes(b"secret")
        locked_file.chmod(0)
        locked_dir = Path(scratch) / "locked"
        locked_dir.mkdir(mode=0)
        try:
            done = run_python(_PROBE, str(locked_file), str(locked_dir))
        finally:
            locked_dir.chmod(0o700)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"cannot start a child that honours file modes: {last[0]}"
    if done.stdout.strip() != "file,folder":
        return f"a child still bypasses file modes (refused: {done.stdout.strip() or 'nothing'})"
    return None


def require_permission_checks() -> None:
    """Skip the calling test, with the reason, unless a child really is refused by file modes."""
    reason = probe_permission_checks()
    if reason is not None:
        pytest.skip(
            f"needs a process that honours file modes (non-root, or root able to drop DAC capabilities): {reason}"
        )
