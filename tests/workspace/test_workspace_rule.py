"""The workspace rule: every path a workspace tool takes resolves, symbolic links followed, inside the root.

`../`, an absolute path elsewhere, a symbolic link that points out and a path through a symbolically
linked parent folder are all refused, by every tool that takes a path, with an errored result that
names the rule and carries `PATH_OUTSIDE_WORKSPACE`; nothing outside is read or written.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.errors import ToolError
from dsh.tools.workspace import Workspace
from tests.workspace.helpers import GUARD_S, bash_call, call, result_blocks, result_texts, scripted, workspace_runtime

_RULE = "refused by the workspace rule"


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with a secret outside it, a link to the secret and a link to the outside folder."""
    workspace = tmp_path / "work"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n", encoding="utf-8")
    (workspace / "inside.txt").write_text("fine\n", encoding="utf-8")
    (workspace / "secret-link.txt").symlink_to(outside / "secret.txt")
    (workspace / "linked-folder").symlink_to(outside)
    return workspace, outside


def _escapes(outside: Path) -> dict[str, str]:
    return {
        "dot-dot": "../outside/secret.txt",
        "absolute": str(outside / "secret.txt"),
        "symlink": "secret-link.txt",
        "symlinked-parent": "linked-folder/secret.txt",
    }


@pytest.mark.parametrize("kind", ["dot-dot", "absolute", "symlink", "symlinked-parent"])
def test_the_resolver_refuses_every_escape_and_names_the_rule(tmp_path: Path, kind: str) -> None:
    """`Workspace.resolve` refuses each kind of escape with `PATH_OUTSIDE_WORKSPACE` and the rule's name."""
    workspace, outside = _layout(tmp_path)
    with pytest.raises(ToolError) as raised:
        Workspace(workspace).resolve(_escapes(outside)[kind], tool="read")
    assert raised.value.code == "PATH_OUTSIDE_WORKSPACE"
    assert _RULE in raised.value.message
    assert "symbolic links followed" in raised.value.message


def test_paths_inside_resolve_and_display_relative(tmp_path: Path) -> None:
    """A relative path, an absolute path inside and a `..` that stays inside all resolve to the same file."""
    workspace, _ = _layout(tmp_path)
    (workspace / "sub").mkdir()
    root = Workspace(workspace)
    expected = (workspace / "inside.txt").resolve()
    for path in ("inside.txt", str(workspace / "inside.txt"), "sub/../inside.txt"):
        assert root.resolve(path, tool="read") == expected
    assert root.display(expected) == "inside.txt"
    # `..` after a linked folder is taken from the link's target, which is outside.
    with pytest.raises(ToolError):
        root.resolve("linked-folder/../inside.txt", tool="read")


def _calls(outside: Path) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for path in _escapes(outside).values():
        steps.append(call("read", {"file_path": path}))
        steps.append(call("write", {"file_path": path, "content": "overwritten"}))
        steps.append(call("edit", {"file_path": path, "old_string": "top", "new_string": "no"}))
    steps.append(call("glob", {"pattern": "*", "path": "../outside"}))
    steps.append(call("grep", {"pattern": "secret", "path": "linked-folder"}))
    steps.append(bash_call("cat secret.txt", workdir="linked-folder"))
    steps.append({"text": "done"})
    return steps


async def test_every_tool_refuses_every_escape_through_the_loop(tmp_path: Path) -> None:
    """read, write, edit, glob, grep and bash each answer an escape with an errored result naming the rule."""
    workspace, outside = _layout(tmp_path)
    async with workspace_runtime(tmp_path / "home", scripted(_calls(outside)), workspace) as rt:
        result = await asyncio.wait_for(rt.run("Try to get out."), GUARD_S)
        events = list(rt.sessions.get(result.session_id).events)  # type: ignore[union-attr]
    texts = result_texts(events)
    assert len(texts) == 15
    for text in texts:
        assert _RULE in text, text
    for data in result_blocks(events):
        assert data["message"]["content"][0]["isError"] is True
        assert data["error"] == {"name": "ToolError", "code": "PATH_OUTSIDE_WORKSPACE"}
    assert (outside / "secret.txt").read_text(encoding="utf-8") == "top secret\n"
    assert "top secret" not in "".join(texts)
