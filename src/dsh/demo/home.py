"""The demo's home folder: a fresh temporary one, or a given folder that must be empty (or absent).

Layer: demo. A home the demo cannot use is refused before anything runs, with one `ConfigError`
(`CONFIG_INVALID`, CLI exit 4) that says what is wrong with it: not a directory, not empty, not
readable, not writable, or not creatable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsh.errors import ConfigError

__all__ = ["DemoHome", "prepare_home"]


@dataclass(frozen=True, slots=True)
class DemoHome:
    """The folder the demo runs in.

    Attributes:
        path: The absolute path.
        temporary: True when the demo created it in the temporary folder (removed afterwards unless kept).
    """

    path: Path
    temporary: bool

    def remove(self) -> None:
        """Delete a temporary home (a given one is never deleted)."""
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)


def _refused(path: Path, problem: str) -> ConfigError:
    return ConfigError(f"demo home {path} {problem}; give an empty or absent folder, or no --home")


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def prepare_home(path: Path | None) -> DemoHome:
    """A usable, empty home: `path` (created when absent) or a new temporary folder.

    Raises:
        ConfigError: `path` is not a directory, is not empty, or cannot be created, read or written.
    """
    if path is None:
        return DemoHome(Path(tempfile.mkdtemp(prefix="dsh-demo-")).resolve(), temporary=True)
    path = path.expanduser().absolute()
    try:
        exists = path.exists()
        if exists and not path.is_dir():
            raise _refused(path, "is not a directory")
        if not exists:
            path.mkdir(parents=True)
    except OSError as error:
        raise _refused(path, f"cannot be created ({_reason(error)})") from error
    try:
        with os.scandir(path) as entries:
            if any(True for _ in entries):
                raise _refused(path, "is not empty")
    except OSError as error:
        raise _refused(path, f"cannot be read ({_reason(error)})") from error
    try:
        # A real write, not a permission check: it also catches read-only file systems.
        descriptor, probe = tempfile.mkstemp(prefix=".dsh-demo-probe-", dir=path)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise _refused(path, f"is not writable ({_reason(error)})") from error
    return DemoHome(path.resolve(), temporary=False)
