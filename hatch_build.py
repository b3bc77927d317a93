"""Build hook: compile the optional C helpers of the read path (`src/dsh/_speedups.c`).

The extension is optional. Without a C compiler or Python's headers, or on an interpreter it does
not support (free-threaded builds, PyPy), the build goes on without it and `dsh` runs its pure-Python
read path, which gives the same results more slowly (docs/architecture.md#read-path). Set
`DSH_BUILD_SPEEDUPS=0` to skip it on purpose, or `DSH_BUILD_SPEEDUPS=1` to make a failed compile
fail the build.

An editable install compiles the module next to its source (`src/dsh/`, ignored by git), where the
editable path finds it; a wheel compiles it into a temporary folder and ships it as `dsh/_speedups…`.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_SOURCE = Path("src/dsh/_speedups.c")


def _supported() -> str | None:
    """Why this interpreter gets no extension, or None when it does."""
    if platform.python_implementation() != "CPython":
        return f"{platform.python_implementation()} is not CPython"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded interpreter"
    if os.name != "posix":
        return "not a POSIX system"
    return None


def compile_extension(source: Path, folder: Path) -> Path:
    """Compile `source` into `folder` with the interpreter's own compiler settings; returns the module."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = folder / f"_speedups{suffix}"
    include = sysconfig.get_paths()["include"]
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    cflags = shlex.split(sysconfig.get_config_var("CFLAGS") or "")
    shared = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    linker = shlex.split(sysconfig.get_config_var("LDSHARED") or "cc -shared")
    with tempfile.TemporaryDirectory() as scratch:
        objects = Path(scratch) / "_speedups.o"
        compile_ = [*compiler, *cflags, *shared, "-O2", "-I", include, "-c", str(source), "-o", str(objects)]
        subprocess.run(compile_, check=True, capture_output=True, text=True)  # noqa: S603 - the interpreter's own compiler
        built = Path(scratch) / target.name
        link = [*linker, str(objects), "-o", str(built)]
        subprocess.run(link, check=True, capture_output=True, text=True)  # noqa: S603 - the interpreter's own linker
        os.replace(built, target)
    return target


class SpeedupsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles `dsh._speedups` for editable installs and wheels (see the module docstring)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Compile the extension; on failure warn and build without it (unless asked to fail)."""
        wanted = os.environ.get("DSH_BUILD_SPEEDUPS", "")
        if self.target_name != "wheel" or wanted == "0":
            return
        reason = _supported()
        if reason is not None:
            self.app.display_warning(f"dsh._speedups not built: {reason}; the pure-Python read path is used")
            return
        root = Path(self.root)
        editable = version == "editable"
        folder = root / "src" / "dsh" if editable else Path(tempfile.mkdtemp(prefix="dsh-speedups-"))
        try:
            built = compile_extension(root / _SOURCE, folder)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or str(error)
            if wanted == "1":
                raise
            self.app.display_warning(
                f"dsh._speedups not built ({detail.strip()[:500]}); the pure-Python read path is used"
            )
            return
        if not editable:
            build_data["force_include"][str(built)] = f"dsh/{built.name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        self.app.display_info(f"built {built.name} for Python {sys.version.split()[0]}")
