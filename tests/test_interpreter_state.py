"""The library leaves the interpreter alone: no collector switches, no objects changing type, no environment
writes, no global interpreter settings, signal handlers only where a `dsh` command runs a process, and no
compiled code of its own (docs/architecture.md#read-path)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_SOURCES = sorted((_ROOT / "src" / "dsh").rglob("*.py"))
# The modules that run a whole `dsh` process (the CLI, and the serving loop `dsh serve` calls) may install
# signal handlers for it; a library call never does.
_PROCESS_ENTRIES = ("src/dsh/cli/", "src/dsh/server/serve.py")
_INTERPRETER_SETTINGS = frozenset(
    {"setswitchinterval", "setrecursionlimit", "settrace", "setprofile", "setdlopenflags"}
)


def _relative(path: Path) -> str:
    return path.relative_to(_ROOT).as_posix()


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _findings(tree: ast.AST, where: str) -> list[str]:
    """Every use of the collector, type change, environment write, interpreter setting or signal handler."""
    found: list[str] = []
    process_entry = where.startswith(_PROCESS_ENTRIES)
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import) and any(alias.name == "gc" for alias in node.names):
            found.append(f"{line}: import gc")
        elif isinstance(node, ast.ImportFrom) and node.module == "gc":
            found.append(f"{line}: from gc import ...")
        elif isinstance(node, ast.Attribute) and _is_name(node.value, "gc"):
            found.append(f"{line}: gc.{node.attr}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "__class__":
                    found.append(f"{line}: assignment to __class__")
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Attribute)
                    and target.value.attr == "environ"
                ):
                    found.append(f"{line}: os.environ write")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            literal_args = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
            if name in {"setattr", "__setattr__"} and "__class__" in literal_args:
                found.append(f"{line}: __class__ set through {name}")
            elif name in {"putenv", "unsetenv"} or (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Attribute)
                and func.value.attr == "environ"
                and name in {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
            ):
                found.append(f"{line}: environment write ({name})")
            elif name in _INTERPRETER_SETTINGS and isinstance(func, ast.Attribute) and _is_name(func.value, "sys"):
                found.append(f"{line}: sys.{name}")
            elif name in {"signal", "add_signal_handler"} and not process_entry:
                found.append(f"{line}: signal handler ({name})")
    return found


def test_the_source_never_touches_the_collector_or_changes_an_objects_type() -> None:
    """No module under src/dsh uses `gc` or assigns `__class__` (nor writes the environment, changes an
    interpreter-wide setting or installs a signal handler outside a `dsh` process entry)."""
    found: list[str] = []
    for path in _SOURCES:
        found += _findings(ast.parse(path.read_text(encoding="utf-8")), _relative(path))
    # `dsh.testing.SqliteLoopGuard` watches C calls with `sys.setprofile` inside a test, by design.
    found = [
        item for item in found if not item.startswith("src/dsh/testing/sqlite_writer.py") or "setprofile" not in item
    ]
    assert found == []


def test_the_checker_finds_each_forbidden_construct() -> None:
    """The scan reports each construct it looks for, so the test above cannot pass by not looking."""
    source = "\n".join(
        [
            "import gc",
            "from gc import freeze",
            "gc.disable()",
            "x.__class__ = int",
            "setattr(x, '__class__', int)",
            "object.__setattr__(x, '__class__', int)",
            "os.environ['A'] = '1'",
            "os.environ.update(A='1')",
            "os.putenv('A', '1')",
            "sys.setswitchinterval(1)",
            "signal.signal(2, f)",
            "loop.add_signal_handler(2, f)",
        ]
    )
    found = _findings(ast.parse(source), "src/dsh/example.py")
    assert len(found) == 12, found
    assert _findings(ast.parse("signal.signal(2, f)"), "src/dsh/cli/run.py") == []
    assert _findings(ast.parse("kind = x.__class__; y = type(x)"), "src/dsh/example.py") == []


def test_the_repository_ships_no_compiled_sources_of_its_own() -> None:
    """No C, C++, Cython or Rust source, and no build hook, is tracked in the repository."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=_ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    compiled = [name for name in tracked if name.endswith((".c", ".h", ".cc", ".cpp", ".pyx", ".pxd", ".rs"))]
    assert compiled == []
    assert "hatch_build.py" not in tracked
