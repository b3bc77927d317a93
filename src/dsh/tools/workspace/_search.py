"""The search tools: `glob` (find files by path) and `grep` (search contents), as the harness has them.

Layer: tools (private to `dsh.tools.workspace`). They include different files, on purpose, as in the
TypeScript harness (docs/tools.md#glob-and-grep):

* `glob` lists files only (no folders), **including** hidden files and files ignore rules exclude,
  leaving out only version-control metadata (`.git`, `.svn`, `.hg`, `.bzr`, `.jj`, `.sl`). A pattern
  without `/` matches a file's name at any depth. Paths come oldest modification first.
* `grep` searches the way ripgrep does by default: hidden files and folders are skipped, and so is
  whatever `.ignore` and `.rgignore` files exclude, and `.gitignore` (with `.git/info/exclude`)
  inside a git repository; binary files are skipped. It runs `rg` when it is on `PATH` and searches
  in pure Python otherwise (Python's `re` syntax then). Matches are sorted by path and line.

Search roots go through the workspace rule; paths are shown relative to the workspace root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field

from dsh.agent.errors import ToolError
from dsh.agent.messages import text
from dsh.agent.tools import ToolContext
from dsh.tools.workspace._paths import Workspace

__all__ = ["GlobTool", "GrepTool", "python_grep", "ripgrep"]

VCS_FOLDERS: Final = frozenset({".git", ".svn", ".hg", ".bzr", ".jj", ".sl"})
_IGNORE_FILES: Final = (".ignore", ".rgignore")
_BINARY_SAMPLE: Final = 8192
_MAX_LINE_BYTES: Final = 2000


def _spec(lines: list[str]) -> Any:
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec.from_lines(lines)


def expand_braces(pattern: str) -> list[str]:
    """`*.{ts,tsx}` as `["*.ts", "*.tsx"]` (nested groups too): ripgrep's globs have alternation, gitignore's do not."""
    depth = 0
    start = -1
    for index, char in enumerate(pattern):
        if char == "{":
            if depth == 0:
                start = index
            depth += 1
        elif char == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                inner = pattern[start + 1 : index]
                options: list[str] = []
                level = 0
                piece = ""
                for ch in inner:
                    if ch == "," and level == 0:
                        options.append(piece)
                        piece = ""
                        continue
                    level += ch == "{"
                    level -= ch == "}"
                    piece += ch
                options.append(piece)
                head, tail = pattern[:start], pattern[index + 1 :]
                return [expanded for option in options for expanded in expand_braces(head + option + tail)]
    return [pattern]


def _search_root(workspace: Workspace, path: str | None, tool: str) -> Path:
    root = workspace.root if path is None else workspace.resolve(path, tool=tool)
    if not root.exists():
        raise ToolError(f'{tool}: "{path}" was not found', code="FILE_NOT_FOUND", name=tool, path=path)
    return root


# ---------------------------------------------------------------- glob


class GlobArgs(BaseModel):
    """`glob` arguments."""

    model_config = ConfigDict(extra="ignore")
    pattern: str = Field(min_length=1)
    path: str | None = Field(default=None, min_length=1)


class GlobTool:
    """`glob`: the files whose paths match a pattern, hidden and ignored ones included."""

    name: Final = "glob"
    args_model: Final = GlobArgs
    output_schema: Final = None

    def __init__(self, workspace: Workspace, *, max_results: int = 100) -> None:
        self.workspace = workspace
        self.max_results = max_results
        self.description = (
            "Find files whose paths match a glob pattern. Returns file paths, never folders, including hidden "
            "files and files ignore rules exclude (version-control metadata such as .git is left out). Paths come "
            f"in modification-time order, oldest first; at most {max_results} are shown, and a larger result says "
            "so. Use it, not shell find, to discover files."
        )
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": (
                        'The glob pattern, e.g. "**/*.py" or "src/**/test_*.py". A pattern without "/" matches '
                        'file names at any depth, so "*.md" searches the whole tree.'
                    ),
                },
                "path": {
                    "type": "string",
                    "description": "The folder to search, relative to the workspace root. Defaults to the root.",
                },
            },
            "required": ["pattern"],
        }

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """The pattern."""
        return cast(GlobArgs, args).pattern

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """`glob <pattern> in <folder>`."""
        parsed = cast(GlobArgs, args)
        return f"glob {parsed.pattern} in {parsed.path or '.'}"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """The rendered list (a string)."""
        parsed = cast(GlobArgs, args)
        return await asyncio.to_thread(self._glob, parsed)

    def _glob(self, args: GlobArgs) -> str:
        if args.pattern.startswith("!"):
            raise ToolError("glob: a pattern cannot start with '!'", code="SEARCH_FAILED", name="glob")
        root = _search_root(self.workspace, args.path, "glob")
        try:
            matcher = _spec(expand_braces(args.pattern))
        except Exception as error:
            raise ToolError(
                f"glob: invalid pattern {args.pattern!r}: {error}", code="SEARCH_FAILED", name="glob"
            ) from None
        found: list[tuple[float, str]] = []
        for path, relative in _walk(root, skip=lambda name, is_dir: is_dir and name in VCS_FOLDERS):
            if matcher.match_file(relative):
                with contextlib.suppress(OSError):
                    found.append((path.stat(follow_symlinks=False).st_mtime, self.workspace.display(path)))
        found.sort()
        paths = [display for _, display in found]
        if not paths:
            return "No files found"
        if len(paths) <= self.max_results:
            return "\n".join(paths)
        shown = paths[: self.max_results]
        return (
            "\n".join(shown) + f"\n\n(Showing {len(shown)} of {len(paths)} paths. Narrow pattern or path to see more.)"
        )

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The paths, one per line."""
        return [text(str(output))]


def _walk(root: Path, *, skip: Any) -> Iterator[tuple[Path, str]]:
    """Regular files below `root` (symbolic links not followed), with their `/` path relative to it."""
    if root.is_file():
        yield root, root.name
        return
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            is_dir = entry.is_dir(follow_symlinks=False)
            if skip(entry.name, is_dir):
                continue
            if is_dir:
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                path = Path(entry.path)
                yield path, path.relative_to(root).as_posix()


# ---------------------------------------------------------------- grep


class GrepArgs(BaseModel):
    """`grep` arguments."""

    model_config = ConfigDict(extra="ignore")
    pattern: str = Field(min_length=1)
    path: str | None = Field(default=None, min_length=1)
    include: str | None = Field(default=None, min_length=1)


@dataclass(frozen=True, slots=True)
class Match:
    """One matching line: the workspace-relative path, the line number and the line (cut at 2,000 bytes)."""

    path: str
    line_number: int
    line: str


class GrepTool:
    """`grep`: lines matching a regular expression, grouped by file."""

    name: Final = "grep"
    args_model: Final = GrepArgs
    output_schema: Final = None

    def __init__(self, workspace: Workspace, *, max_matches: int = 250) -> None:
        self.workspace = workspace
        self.max_matches = max_matches
        self.description = (
            "Search file contents with a regular expression. Returns matching lines with their line numbers, "
            "grouped by file. Hidden files, binary files and files that ignore rules (.gitignore, .ignore) exclude "
            f"are not searched. At most {max_matches} matches are shown. Use it, not shell grep, and read a matched "
            "file for the surrounding lines."
        )
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "The regular expression to search for."},
                "path": {
                    "type": "string",
                    "description": "The file or folder to search, relative to the workspace root (default: the root).",
                },
                "include": {
                    "type": "string",
                    "description": 'One glob naming the files to search, e.g. "*.py" or "*.{ts,tsx}".',
                },
            },
            "required": ["pattern"],
        }

    async def call_subject(self, args: Any, ctx: ToolContext) -> str:
        """The pattern."""
        return cast(GrepArgs, args).pattern

    async def call_preview(self, args: Any, ctx: ToolContext) -> str:
        """`grep '<pattern>' in <path>`."""
        parsed = cast(GrepArgs, args)
        return f"grep {parsed.pattern!r} in {parsed.path or '.'}"

    async def execute(self, args: Any, ctx: ToolContext) -> object:
        """The rendered matches (a string), from ripgrep when it is on `PATH`, else from Python."""
        parsed = cast(GrepArgs, args)
        root = await asyncio.to_thread(_search_root, self.workspace, parsed.path, "grep")
        binary = shutil.which("rg")
        if binary is not None:
            matches = await ripgrep(binary, self.workspace, root, parsed.pattern, parsed.include)
        else:
            matches = await asyncio.to_thread(python_grep, self.workspace, root, parsed.pattern, parsed.include)
        return self._render(matches)

    def _render(self, matches: list[Match]) -> str:
        if not matches:
            return "No matches found"
        kept = matches[: self.max_matches]
        header = (
            f"Found {len(matches)} {'match' if len(matches) == 1 else 'matches'}"
            if len(kept) == len(matches)
            else f"Found {len(matches)} matches, showing the first {len(kept)}"
        )
        sections: list[str] = []
        current: str | None = None
        for match in kept:
            if match.path != current:
                sections.append(f"\n{match.path}")
                current = match.path
            sections.append(f"Line {match.line_number}: {match.line}")
        tail = "" if len(kept) == len(matches) else "\n\n(Narrow pattern, path or include to see the rest.)"
        return header + "\n" + "\n".join(sections) + tail

    def render(self, args: Any, output: object) -> list[dict[str, Any]]:
        """The matches as one text block."""
        return [text(str(output))]


def _preview(line: str) -> str:
    encoded = line.encode()
    if len(encoded) <= _MAX_LINE_BYTES:
        return line
    return encoded[:_MAX_LINE_BYTES].decode(errors="ignore") + "..."


async def ripgrep(binary: str, workspace: Workspace, root: Path, pattern: str, include: str | None) -> list[Match]:
    """Search with ripgrep (`rg --json`), its own defaults deciding which files it reads."""
    argv = [binary, "--json", "--sort=path", f"--regexp={pattern}"]
    if include is not None:
        argv.append(f"--glob={include}")
    argv += ["--", str(root)]
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=workspace.root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = await process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(BaseException):
            await process.wait()
        raise
    matches: list[Match] = []
    for raw in stdout.splitlines():
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if record.get("type") != "match":
            continue
        data = record.get("data") or {}
        found = (data.get("path") or {}).get("text")
        number = data.get("line_number")
        lines = data.get("lines") or {}
        if not isinstance(found, str) or not isinstance(number, int):
            continue
        line = lines.get("text")
        shown = _preview(line.rstrip("\r\n")) if isinstance(line, str) else "(line is not valid UTF-8)"
        matches.append(Match(found, number, shown))
    # ripgrep prints the paths it was given: absolute here, so each is shown relative to the workspace.
    matches = [Match(workspace.display(Path(match.path)), match.line_number, match.line) for match in matches]
    if process.returncode not in (0, 1) and not matches:
        reason = stderr.decode(errors="replace").strip().splitlines()
        raise ToolError(
            f"grep search failed (exit {process.returncode}): {reason[-1] if reason else 'no message'}",
            code="SEARCH_FAILED",
            name="grep",
        )
    return matches


def python_grep(workspace: Workspace, root: Path, pattern: str, include: str | None) -> list[Match]:
    """Search in pure Python with ripgrep's default file selection (see the module docstring)."""
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise ToolError(
            f"grep: invalid regular expression {pattern!r}: {error}", code="SEARCH_FAILED", name="grep"
        ) from None
    selected = _spec(expand_braces(include)) if include is not None else None
    matches: list[Match] = []
    for path in _searchable(root, selected):
        try:
            with path.open("rb") as handle:
                content = handle.read()
        except OSError:
            continue
        if b"\x00" in content[:_BINARY_SAMPLE]:
            continue
        display = workspace.display(path)
        for number, raw in enumerate(content.decode(errors="replace").split("\n"), start=1):
            line = raw.removesuffix("\r")
            if regex.search(line):
                matches.append(Match(display, number, _preview(line)))
    matches.sort(key=lambda match: (match.path, match.line_number))
    return matches


def _searchable(root: Path, selected: Any) -> Iterator[Path]:
    """The files ripgrep would search below `root`: hidden and ignored ones left out by default.

    With an include glob (`selected`), as with ripgrep's `--glob`, a file is searched exactly when it
    matches the glob, hidden or ignored or not; folders are still skipped when hidden or ignored.
    """
    if root.is_file():
        yield root
        return
    repository = next((folder for folder in (root, *root.parents) if (folder / ".git").exists()), None)
    # Ignore files of the folders above the root apply too, each relative to its own folder.
    base_rules: list[tuple[Path, Any]] = []
    for folder in reversed(root.parents):
        rules = _ignore_rules(folder, repository)
        if rules is not None:
            base_rules.append((folder, rules))
    stack: list[tuple[Path, list[tuple[Path, Any]]]] = [(root, base_rules)]
    while stack:
        folder, inherited = stack.pop()
        own = _ignore_rules(folder, repository)
        rules = [*inherited, (folder, own)] if own is not None else inherited
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                if not entry.name.startswith(".") and not _ignored(path, True, rules):
                    stack.append((path, rules))
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            if selected is not None:
                if selected.match_file(entry.name) or selected.match_file(path.relative_to(root).as_posix()):
                    yield path
            elif not entry.name.startswith(".") and not _ignored(path, False, rules):
                yield path


def _ignore_rules(folder: Path, repository: Path | None) -> Any:
    """The rules of `folder`'s ignore files: `.gitignore` only inside a git repository, as ripgrep has it."""
    lines: list[str] = []
    names = [*_IGNORE_FILES]
    in_git = repository is not None and (folder == repository or repository in folder.parents)
    if in_git:
        names.insert(0, ".gitignore")
    for name in names:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines += (folder / name).read_text(encoding="utf-8").splitlines()
    if in_git and folder == repository:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines += (folder / ".git" / "info" / "exclude").read_text(encoding="utf-8").splitlines()
    return _spec(lines) if any(line.strip() and not line.lstrip().startswith("#") for line in lines) else None


def _ignored(path: Path, is_dir: bool, rules: list[tuple[Path, Any]]) -> bool:
    """The last rule set with an opinion decides (a deeper file's rules override a shallower one's)."""
    verdict = False
    for folder, spec in rules:
        relative = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
        result = spec.check_file(relative)
        if result.include is not None:
            verdict = bool(result.include)
    return verdict


# The public names (docs/architecture.md#public-names).
GlobTool.__module__ = "dsh.tools.workspace"
GrepTool.__module__ = "dsh.tools.workspace"
