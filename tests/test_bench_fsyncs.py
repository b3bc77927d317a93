"""The fsync counter the append benchmarks use to prove equal durability (bench/fsyncs.py)."""

from __future__ import annotations

import shutil

import pytest

from bench import fsyncs

_SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 91.20    0.041000          82       500           fsync
  8.80    0.004000          40       100         3 fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.045000          75       600         3 total
"""


def test_summary_rows_of_durable_syncs_are_summed() -> None:
    """The calls of every durable-sync row of an `strace -c` table add up; the total row is not counted twice."""
    assert fsyncs.parse(_SUMMARY) == 600


def test_an_empty_summary_counts_nothing() -> None:
    """A child that synced nothing leaves a table without rows: zero."""
    assert fsyncs.parse("% time     seconds  usecs/call     calls    errors syscall\n") == 0


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_child_process_fsyncs_are_counted_from_the_kernel_side() -> None:
    """Seven `os.fsync` calls in a child process are counted as seven."""
    setup = "import os, tempfile\nf = tempfile.TemporaryFile()\nfor _ in range(7): os.fsync(f.fileno())"
    counted = fsyncs.count(["timeit", "-n", "1", "-r", "1", "-s", setup, "pass"])
    if counted is None:
        pytest.skip("this environment does not permit tracing a child process")
    assert counted == 7
