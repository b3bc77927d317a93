"""The package builds as a pure-Python wheel (`py3-none-any`) on a machine where no C compiler works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_is_pure_python_and_builds_without_a_compiler(tmp_path: Path) -> None:
    """`pip wheel . --no-deps` with only failing compilers on PATH gives one `py3-none-any` wheel with no
    compiled file in it."""
    no_cc = tmp_path / "no-cc"
    no_cc.mkdir()
    for compiler in ("cc", "gcc", "c++", "g++", "clang"):
        script = no_cc / compiler
        script.write_text('#!/bin/sh\necho "no C compiler here" >&2\nexit 1\n', encoding="utf-8")
        script.chmod(0o755)
    source = tmp_path / "source"
    # A copy of the tracked tree, so build artefacts never land in the checkout.
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (_ROOT / name).is_file():
            shutil.copy2(_ROOT / name, target)
    out = tmp_path / "wheels"
    env = {**os.environ, "PATH": f"{no_cc}{os.pathsep}{os.environ['PATH']}", "CC": str(no_cc / "cc")}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)],
        env=env,
        check=True,
        timeout=600,
    )
    wheels = sorted(out.glob("*.whl"))
    assert [wheel.name for wheel in wheels] == ["pydsh-0.1.0-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0]) as archive:
        names = archive.namelist()
    assert "dsh/__init__.py" in names
    assert [name for name in names if name.endswith((".so", ".pyd", ".c", ".dylib"))] == []
