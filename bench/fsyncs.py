"""Counting the fsyncs a workload performs, to show that systems compared for speed are equally durable.

A durable commit ends in `fsync`/`fdatasync` whether Python code calls it (`os.fsync`) or C code does
(SQLite's pager), so counting in Python is not enough. The count comes from the kernel's side
instead: the workload runs in a child process under `strace -f -c` restricted (with a seccomp
filter, so the child runs at nearly full speed) to the syscalls that make data durable, and the
summary table strace prints is parsed. Where `strace` is missing (or the kernel forbids tracing) the
count is reported as unavailable, never guessed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs", "msync")
REPO = Path(__file__).resolve().parent.parent


def available() -> bool:
    """Whether fsyncs can be counted here (an `strace` on the PATH that can trace a child)."""
    return shutil.which("strace") is not None


def count(module_args: Sequence[str], *, timeout: float = 600.0) -> int | None:
    """The durable-sync syscalls of `python -m <module_args...>` (run from the repository root).

    Returns:
        The number of `fsync`, `fdatasync`, `sync_file_range`, `syncfs` and `msync` calls made by
        the child and every thread or process it started, or None when they cannot be counted.
    """
    strace = shutil.which("strace")
    if strace is None:
        return None
    with tempfile.TemporaryDirectory(prefix="dsh-fsyncs-") as tmp:
        out = os.path.join(tmp, "strace.txt")
        command = [
            strace,
            "-f",
            "-c",
            "--seccomp-bpf",
            "-e",
            f"trace={','.join(SYNC_CALLS)}",
            "-o",
            out,
            sys.executable,
            "-m",
            *module_args,
        ]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0 or not os.path.exists(out):
            print(f"  (fsync count failed: {result.stderr.strip()[-300:]})")
            return None
        return parse(Path(out).read_text(encoding="utf-8"))


def parse(summary: str) -> int:
    """Sum the `calls` column of the durable-sync rows of an `strace -c` summary table."""
    total = 0
    for line in summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in SYNC_CALLS:
            # Rows read `% time, seconds, usecs/call, calls, [errors,] syscall`.
            total += int(fields[3])
    return total
