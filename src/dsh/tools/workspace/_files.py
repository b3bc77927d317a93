"""The file tools: `read`, `write` and `edit`, with the TypeScript harness's names, parameters and results.

Layer: tools (private to `dsh.tools.workspace`). Every path goes through the workspace rule
(`_paths.Workspace`); every file operation runs in a worker thread. `read` returns numbered lines
inside the harness's `<path>/<type>/<content>` envelope, at most `read_max_lines` lines and
`read_max_bytes` bytes per call, lines longer than 2,000 characters cut, and refuses binary files
(a NUL byte in the first 8 KiB) and text that is not UTF-8. `write` creates or replaces a file
atomically (parents created). `edit` replaces literal text that must occur exactly once unless
`replace_all`; its result shows the change as a unified diff. In the `read-only` sandbox mode
`write` and `edit` are refused with the sandbox marker (docs/tools.md#workspace-tools).
"""

from __future__ import annotations

import asyncio
import difflib
import io
import os
import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from pydantic import BaseModel, ConfigDict, Field

from dsh.agent.errors import ToolError
from dsh.agent.messages import text
from dsh.agent.tools import ToolContext
from dsh.tools.workspace._paths import Workspace

__all__ = ["EditTool", "FileLimits", "ReadTool", "WriteTool", "path_subject", "sandbox_marker"]

MAX_LINE_CHARS: Final = 2000
_BINARY_SAMPLE: Final = 8192
_PREVIEW_LINES: Final = 200
_DIFF_CONTEXT: Final = 2


@dataclass(frozen=True, slots=True)
class FileLimits:
    """`read`'s limits: lines per call and bytes of selected text per call."""

    max_lines: int = 2000
    max_bytes: int = 50 * 1024


def sandbox_marker(mode: str) -> str:
    """The marker a change refused by the sandbox is reported with (the same as `bash` reports)."""
    return f"[sandbox: file access denied under {mode} mode]"


def _refuse_in_read_only(ctx: ToolContext, tool: str, path: str) -> None:
    permissions = ctx.permissions
    if permissions is not None and permissions.sandbox == "read-only":
        raise ToolError(
            f"{tool}: {path} was not changed {sandbox_marker('read-only')}: the session's sandbox mode allows no "
            "file changes. This is a policy decision: do not try another way.",
            code="SANDBOX_DENIED",
            name=tool,
            path=path,
        )


async def path_subject(workspace: Workspace, path: str, tool: str) -> str:
    """A path's approval subject: workspace-relative once resolved, so `./a/../b` and `/ws/b` are both `b`.

    A path outside the workspace keeps its given (normalized) form: the tool's body refuses it.
    """
    try:
        real = await asyncio.to_thread(workspace.resolve, path, tool=tool)
    except ToolError:
        return posixpath.normpath(path)
    return workspace.display(real)


def _open_text(real: Path, display: str, tool: str) -> io.TextIOWrapper:
    """A UTF-8 reader of a regular file; binary files are refused (a NUL byte in the first 8 KiB)."""
    if not real.exists():
        raise ToolError(f'cannot {tool} "{display}": not found', code="FILE_NOT_FOUND", name=tool, path=display)
    if not real.is_file():
        raise ToolError(
            f'cannot {tool} "{display}": not a regular file', code="FILE_NOT_REGULAR", name=tool, path=display
        )
    raw = real.open("rb")
    try:
        if b"\x00" in raw.read(_BINARY_SAMPLE):
            raise ToolError(f'cannot {tool} "{display}": binary file', code="FILE_NOT_TEXT", name=tool, path=display)
        raw.seek(0)
    except BaseException:
        raw.close()
        raise
    # `newline="\n"`: lines end only at LF (a CR before it is stripped below), as the harness counts them.
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n")


def _not_utf8(display: str, tool: str) -> ToolError:
    return ToolError(f'cannot {tool} "{display}": invalid UTF-8 text', code="FILE_NOT_TEXT", name=tool, path=display)


# ---------------------------------------------------------------- read


class ReadArgs(BaseModel):
    """`read` arguments."""

    model_config = ConfigDict(extra="ignore")
    file_path: str = Field(min_length=1)
    offset: int = Field(default=1, ge=1)
    limit: int | None = Field(default=None, ge=1)


class ReadTool:
    """`read`: a window of a UTF-8 text file, numbered."""

    name: Final = "read"
    args_model: Final = ReadArgs
    output_schema: Final = None

    def __init__(self, workspace: Workspace, limits: FileLimits | None = None) -> None:
        self.workspace = workspace
        self.limits = limits or FileLimits()
        self.description = (
            "Read a UTF-8 text file and return its lines, numbered from 1. Use it, not shell commands such as cat, "
            "to look at files. Binary files are refused. One call returns at most "
            f"{self.limits.max_lines} lines and {self.limits.max_bytes} bytes; the footer says how to continue."
        )
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {
                "file_path": {"type": "string", "description": "The file to read, relative to the workspace root."},
                "offset": {"type": "number", "description": "The first line to return, counted from 1. Defaults to 1."},
                "limit": {
                    "type": "number",
                    "description": f"The most lines to return. Defaults to {self.limits.max_lines}, also the cap.",
                },
            },
            "required": ["file_path"],
        }

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """The workspace-relative path."""
        return await path_subject(self.workspace, cast(ReadArgs, args).file_path, "read")

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """`read <path>`."""
        return f"read {await self.call_subject(args, ctx)}"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """The rendered window (a string: the model sees exactly this)."""
        parsed = cast(ReadArgs, args)
        limit = min(parsed.limit or self.limits.max_lines, self.limits.max_lines)
        return await asyncio.to_thread(self._read, parsed.file_path, parsed.offset, limit)

    def _read(self, path: str, offset: int, limit: int) -> str:
        real = self.workspace.resolve(path, tool="read")
        display = self.workspace.display(real)
        lines: list[tuple[int, str]] = []
        total = 0
        used = 0
        capped = False
        with _open_text(real, display, "read") as stream:
            try:
                while True:
                    line, more = _next_line(stream)
                    if line is None:
                        break
                    total += 1
                    if capped or total < offset or len(lines) >= limit:
                        continue
                    if more:
                        line = f"{line}... (line truncated to {MAX_LINE_CHARS} chars)"
                    size = len(line.encode()) + (1 if lines else 0)
                    if used + size > self.limits.max_bytes:
                        capped = True
                        continue
                    used += size
                    lines.append((total, line))
            except UnicodeDecodeError:
                raise _not_utf8(display, "read") from None
        if not capped and offset > total and not (total == 0 and offset == 1):
            raise ToolError(
                f'offset {offset} is out of range for "{display}" ({total} lines)',
                code="READ_OUT_OF_RANGE",
                name="read",
                path=display,
            )
        end = lines[-1][0] if lines else max(0, offset - 1)
        if capped:
            footer = f"(Output capped. Showing lines {offset}-{end}. Use offset={end + 1} to continue.)"
        elif end < total:
            footer = f"(Showing lines {offset}-{end} of {total}. Use offset={end + 1} to continue.)"
        else:
            footer = f"(End of file - total {total} lines)"
        body = "\n".join(f"{number}: {line}" for number, line in lines)
        body = f"{body}\n\n{footer}" if lines else footer
        return f"<path>{display}</path>\n<type>file</type>\n<content>\n{body}\n</content>"

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The window as one text block."""
        return [text(str(output))]


def _next_line(stream: io.TextIOWrapper) -> tuple[str | None, bool]:
    """The next line without its line end (None at the end), and whether it was longer than the cap.

    A line past the cap is read through to its end in pieces, so one huge line never fills memory.
    """
    line = stream.readline(MAX_LINE_CHARS + 1)
    if not line:
        return None, False
    if line.endswith("\n"):
        return line[:-1].removesuffix("\r"), False
    if len(line) <= MAX_LINE_CHARS:
        return line.removesuffix("\r"), False
    while True:
        rest = stream.readline(65536)
        if not rest or rest.endswith("\n"):
            break
    return line[:MAX_LINE_CHARS], True


# ---------------------------------------------------------------- write


class WriteArgs(BaseModel):
    """`write` arguments."""

    model_config = ConfigDict(extra="ignore")
    file_path: str = Field(min_length=1)
    content: str


def _atomic_write(real: Path, content: str) -> None:
    """Replace `real` with `content` in one rename (parents created, an existing file's mode kept)."""
    real.parent.mkdir(parents=True, exist_ok=True)
    mode = real.stat().st_mode & 0o7777 if real.exists() else None
    handle, temporary = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".dsh-tmp", dir=real.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(content)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, real)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _current_text(real: Path, display: str, tool: str) -> str | None:
    """The file's text, or None when it does not exist."""
    if not real.exists():
        return None
    with _open_text(real, display, tool) as stream:
        try:
            return stream.read()
        except UnicodeDecodeError:
            raise _not_utf8(display, tool) from None


def unified_diff(display: str, before: str, after: str) -> str:
    """A unified diff of a change, two lines of context, at most 200 lines."""
    lines = list(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{display}",
            tofile=f"b/{display}",
            n=_DIFF_CONTEXT,
        )
    )
    shown = [
        line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n" for line in lines[:_PREVIEW_LINES]
    ]
    if len(lines) > _PREVIEW_LINES:
        shown.append(f"... ({len(lines) - _PREVIEW_LINES} more diff lines)\n")
    return "".join(shown).rstrip("\n")


class WriteTool:
    """`write`: create a file or replace all of its content."""

    name: Final = "write"
    description: Final = (
        "Create a UTF-8 text file, or replace all of an existing file's content (missing parent folders are "
        "created). Read an existing file before replacing it, and prefer edit for a targeted change."
    )
    parameters: Final[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The file to write, relative to the workspace root."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["file_path", "content"],
    }
    args_model: Final = WriteArgs
    output_schema: Final[dict[str, Any]] = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "operation": {"enum": ["create", "update"]}},
        "required": ["path", "operation"],
    }

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """The workspace-relative path."""
        return await path_subject(self.workspace, cast(WriteArgs, args).file_path, "write")

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """The change: a diff against the file, or the new file's lines."""
        return await asyncio.to_thread(self._preview, cast(WriteArgs, args))

    def _preview(self, args: WriteArgs) -> str:
        real = self.workspace.resolve(args.file_path, tool="write")
        display = self.workspace.display(real)
        try:
            before = _current_text(real, display, "write")
        except ToolError:
            before = None
        if before is None:
            lines = args.content.splitlines()
            head = "\n".join(f"+{line}" for line in lines[:_PREVIEW_LINES])
            more = f"\n... ({len(lines) - _PREVIEW_LINES} more lines)" if len(lines) > _PREVIEW_LINES else ""
            return f"write {display} (new file, {len(lines)} lines)\n{head}{more}"
        diff = unified_diff(display, before, args.content) or "(no change)"
        return f"write {display} (replaces the file)\n{diff}"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Write the file; returns `{path, operation}`."""
        parsed = cast(WriteArgs, args)
        return await asyncio.to_thread(self._write, parsed, ctx)

    def _write(self, args: WriteArgs, ctx: ToolContext) -> dict[str, str]:
        real = self.workspace.resolve(args.file_path, tool="write")
        display = self.workspace.display(real)
        _refuse_in_read_only(ctx, "write", display)
        if real.exists() and not real.is_file():
            raise ToolError(
                f'cannot write "{display}": not a regular file', code="FILE_NOT_REGULAR", name="write", path=display
            )
        operation = "update" if real.exists() else "create"
        _atomic_write(real, args.content)
        return {"path": display, "operation": operation}

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The harness's confirmation envelope (the content is not echoed back)."""
        out = cast(dict[str, str], output)
        verb = "Created" if out["operation"] == "create" else "Updated"
        return [text(f"<path>{out['path']}</path>\n<type>file</type>\n<content>\n{verb} file\n</content>")]


# ---------------------------------------------------------------- edit


class EditArgs(BaseModel):
    """`edit` arguments."""

    model_config = ConfigDict(extra="ignore")
    file_path: str = Field(min_length=1)
    old_string: str = Field(min_length=1)
    new_string: str
    replace_all: bool = False


class EditTool:
    """`edit`: replace literal text in a file, exactly once unless told to replace every occurrence."""

    name: Final = "edit"
    description: Final = (
        "Change an existing UTF-8 text file by replacing literal text. old_string must occur exactly once unless "
        "replace_all is true; when it occurs several times, give more surrounding text. The result shows the "
        "change as a diff. Read the file first."
    )
    parameters: Final[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The file to change, relative to the workspace root."},
            "old_string": {"type": "string", "description": "The exact text to replace (whitespace included)."},
            "new_string": {"type": "string", "description": "The replacement; an empty string deletes old_string."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence instead of requiring exactly one. Defaults to false.",
            },
        },
        "required": ["file_path", "old_string", "new_string"],
    }
    args_model: Final = EditArgs
    output_schema: Final[dict[str, Any]] = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "replacements": {"type": "integer"}, "diff": {"type": "string"}},
        "required": ["path", "replacements", "diff"],
    }

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """The workspace-relative path."""
        return await path_subject(self.workspace, cast(EditArgs, args).file_path, "edit")

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """The diff the edit would make."""
        return await asyncio.to_thread(self._preview, cast(EditArgs, args))

    def _preview(self, args: EditArgs) -> str:
        real = self.workspace.resolve(args.file_path, tool="edit")
        display = self.workspace.display(real)
        try:
            before, after, _ = self._apply(real, display, args)
        except ToolError as error:
            return f"edit {display} (cannot apply: {error.message})"
        return f"edit {display}\n{unified_diff(display, before, after)}"

    def _apply(self, real: Path, display: str, args: EditArgs) -> tuple[str, str, int]:
        if args.old_string == args.new_string:
            raise ToolError("old_string and new_string must differ", code="EDIT_NOT_FOUND", name="edit", path=display)
        before = _current_text(real, display, "edit")
        if before is None:
            raise ToolError(f'cannot edit "{display}": not found', code="FILE_NOT_FOUND", name="edit", path=display)
        old, new = args.old_string, args.new_string
        count = before.count(old)
        if count == 0 and "\r\n" in before and "\n" in old and "\r\n" not in old:
            # The model writes LF; a CRLF file is matched with its own line ends.
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
            count = before.count(old)
        if count == 0:
            raise ToolError(
                f'old_string was not found in "{display}"', code="EDIT_NOT_FOUND", name="edit", path=display
            )
        if count > 1 and not args.replace_all:
            raise ToolError(
                f'old_string matched {count} times in "{display}"; provide a more specific old_string or set '
                "replace_all to true",
                code="EDIT_AMBIGUOUS",
                name="edit",
                path=display,
            )
        return before, before.replace(old, new) if args.replace_all else before.replace(old, new, 1), count

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """Apply the edit; returns `{path, replacements, diff}`."""
        return await asyncio.to_thread(self._edit, cast(EditArgs, args), ctx)

    def _edit(self, args: EditArgs, ctx: ToolContext) -> dict[str, Any]:
        real = self.workspace.resolve(args.file_path, tool="edit")
        display = self.workspace.display(real)
        _refuse_in_read_only(ctx, "edit", display)
        before, after, count = self._apply(real, display, args)
        _atomic_write(real, after)
        replacements = count if args.replace_all else 1
        return {"path": display, "replacements": replacements, "diff": unified_diff(display, before, after)}

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The confirmation and the diff of the change."""
        out = cast(dict[str, Any], output)
        head = (
            f"The file {out['path']} has been updated. All {out['replacements']} occurrences were replaced."
            if cast(EditArgs, args).replace_all
            else f"The file {out['path']} has been updated successfully."
        )
        return [text(f"{head}\n\n{out['diff']}")]


# The public names (docs/architecture.md#public-names).
EditTool.__module__ = "dsh.tools.workspace"
ReadTool.__module__ = "dsh.tools.workspace"
WriteTool.__module__ = "dsh.tools.workspace"
