"""`dsh.testing` and `dsh demo` work without the `pydsh[testing]` extra (test tools, the fake server stack).

Each check runs a fresh interpreter whose import system refuses those packages, the way an install
without the extra behaves, and the `testing` extra declares exactly what the blocked modules need.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_GUARD = 120  # seconds; only guards against a hang, never measures anything

# Installed first in the child: a meta-path finder that makes the extra's packages unimportable.
_BLOCKER = """
import sys

class _WithoutTheTestingExtra:
    blocked = {"pytest", "_pytest", "pytest_asyncio", "hypothesis", "fastapi", "uvicorn"}

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _WithoutTheTestingExtra())
"""


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=_GUARD,
        check=False,
    )


def test_the_blocker_blocks(tmp_path: Path) -> None:
    """In the child interpreter `import pytest` and `import hypothesis` fail, so the other checks mean something."""
    result = _run(
        "for name in ('pytest', 'pytest_asyncio', 'hypothesis'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise SystemExit(f'{name} was importable')\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_import_dsh_testing_needs_no_extra(tmp_path: Path) -> None:
    """`import dsh.testing` succeeds without the extra; `check_unit` fails only when it is first used."""
    result = _run(
        "import dsh, dsh.testing\n"
        "from dsh.testing import ManualTimer, FaultyBackend, CountingPersistence, write_stored_log\n"
        "try:\n"
        "    from dsh.testing import check_unit\n"
        "except ModuleNotFoundError as error:\n"
        "    assert error.name == 'hypothesis', error.name\n"
        "else:\n"
        "    raise SystemExit('check_unit imported without hypothesis')\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_dsh_demo_runs_without_the_extra(tmp_path: Path) -> None:
    """`dsh demo --plain` exits 0 when pytest, pytest-asyncio and hypothesis cannot be imported."""
    home = tmp_path / "home"
    result = _run(
        "import sys\n"
        "from dsh.cli.main import main\n"
        f"sys.argv = ['dsh', 'demo', '--plain', '--home', {str(home)!r}]\n"
        "main()\n",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "Done" in result.stdout


def test_testing_extra_declares_what_dsh_testing_needs() -> None:
    """The `testing` extra holds the test tools and the HTTP client; the web stack is a runtime dependency."""
    project = tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    names = {requirement.split(">", 1)[0].split("=", 1)[0].strip() for requirement in extras["testing"]}
    assert names == {"pytest", "pytest-asyncio", "hypothesis", "httpx"}
    assert any(entry.startswith(f"{project['name']}[") and "testing" in entry for entry in extras["dev"])
    runtime = {requirement.split(">", 1)[0].split("=", 1)[0].strip() for requirement in project["dependencies"]}
    assert {"fastapi", "uvicorn"} <= runtime
    assert not (runtime & names)
