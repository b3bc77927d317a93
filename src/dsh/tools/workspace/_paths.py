"""`Workspace`: the root every workspace tool's path is resolved in, and the rule that keeps it there.

Layer: tools (private to `dsh.tools.workspace`). A path from the model is taken relative to the
workspace root (an absolute path as it is), then resolved with every symbolic link followed and
every `..` applied. The result must be the root or lie below it; anything else is refused with
`PATH_OUTSIDE_WORKSPACE`, and the message names the workspace rule (docs/tools.md#the-workspace-rule).
This covers `../`, absolute paths elsewhere, a symbolic link that points out, and a path through a
symbolically linked parent folder. Resolution does file-system calls: callers run it in a worker
thread, with the file work that follows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from dsh.agent.errors import ToolError
from dsh.errors import ConfigError

__all__ = ["Workspace"]

_RULE: Final = "the workspace rule: every path must resolve, with symbolic links followed, inside the workspace root"


class Workspace:
    """The folder workspace tools work in. `root` is its real path (symbolic links resolved)."""

    __slots__ = ("root",)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        real = Path(os.path.realpath(os.fspath(root)))
        if not real.is_dir():
            raise ConfigError(f"the workspace {os.fspath(root)} is not a folder")
        self.root = real

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str, *, tool: str) -> Path:
        """The real path `path` names inside the workspace.

        Raises:
            ToolError: `PATH_OUTSIDE_WORKSPACE`, naming the rule, when it resolves anywhere else.
        """
        if "\x00" in path:
            raise ToolError(
                f'{tool}: "{path!r}" is not a valid path (it contains a NUL byte)',
                code="PATH_OUTSIDE_WORKSPACE",
                name=tool,
                path=path,
            )
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        real = Path(os.path.realpath(candidate))
        if not self.contains(real):
            raise ToolError(
                f'{tool}: "{path}" is refused by {_RULE} ({self.root}); it resolves to {real}',
                code="PATH_OUTSIDE_WORKSPACE",
                name=tool,
                path=path,
            )
        return real

    def contains(self, real: Path) -> bool:
        """Whether an already resolved path is the root or lies below it."""
        return real == self.root or self.root in real.parents

    def display(self, real: Path) -> str:
        """`real` relative to the root, with `/` separators (`.` for the root itself)."""
        if real == self.root:
            return "."
        return real.relative_to(self.root).as_posix()


# The public names (docs/architecture.md#public-names).
Workspace.__module__ = "dsh.tools.workspace"
