"""What a fresh interpreter loads for `import dsh`, the core layers and `dsh agents`.

The rule is in docs/architecture.md#import-cost.

Each case runs in a subprocess, so the modules this test session already holds do not count, and
asserts on `sys.modules` only: what is loaded, never how long it took.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor

HEAVY = ("pydantic", "pydantic_settings", "typer", "rich", "openai", "fastapi", "uvicorn", "starlette")
HEAVY += ("psycopg", "psycopg_pool", "httpx", "matplotlib", "click", "yaml")
"""Third-party packages `import dsh` and the core layers must not load: each costs tens of milliseconds."""

SERVER_AND_MODEL = ("openai", "fastapi", "uvicorn", "starlette", "psycopg", "psycopg_pool", "httpx", "matplotlib")
"""What `dsh agents` never needs: the HTTP server, the model SDK, PostgreSQL and plotting."""

_REPORT = "import json, sys; print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"


def _packages_after(code: str) -> set[str]:
    """The top-level package names a fresh interpreter holds after running `code`."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_REPORT}"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "code",
    [
        "import dsh",
        "import dsh.runtime",
        "from dsh import Runtime",
        "from dsh import SessionStore, JsonlBackend, SqliteBackend, PersistenceCoordinator, ProjectionCache",
        "from dsh import SessionQuery, SubagentRuntime, SubagentChildRow, Services",
        "import dsh.session, dsh.persistence, dsh.projection, dsh.query, dsh.subagent",
    ],
)
def test_importing_the_core_loads_no_heavy_dependency(code: str) -> None:
    """`import dsh`, the runtime and the core layers load none of pydantic, typer, rich, openai, fastapi, psycopg ..."""
    loaded = _packages_after(code)
    assert sorted(loaded & set(HEAVY)) == []


def test_import_dsh_loads_no_layer() -> None:
    """`import dsh` runs no layer module: the public names load on first access."""
    done = subprocess.run(
        [sys.executable, "-c", "import dsh, sys; print(sorted(m for m in sys.modules if m.startswith('dsh')))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['dsh']"


@pytest.mark.slow
def test_the_config_is_the_one_core_module_that_loads_pydantic_settings() -> None:
    """`dsh.Config` loads pydantic-settings on first access, and nothing of the CLI or the server."""
    loaded = _packages_after("import dsh; dsh.Config")
    assert {"pydantic", "pydantic_settings"} <= loaded
    assert sorted(loaded & {"typer", "rich", *SERVER_AND_MODEL}) == []


@pytest.mark.slow
def test_registering_the_cli_loads_neither_rich_nor_the_library() -> None:
    """Reading `dsh.cli.main.app` registers every command without loading rich, pydantic-settings or a layer."""
    loaded = _packages_after("import dsh.cli.main as m; m.app")
    assert "typer" in loaded
    assert sorted(loaded & {"rich", "pydantic_settings", *SERVER_AND_MODEL}) == []


async def _small_home(home: Path) -> None:
    async with Runtime.open(Config(home=home)) as rt:
        parent = rt.sessions.create("parent")
        parent.append("turn/start", {"turn": 1})
        await rt.sessions.flush(parent)
        for index in range(2):
            descriptor = snapshot_descriptor("continuable", provider="spawn", label=f"child {index}")
            record = {"type": "subagent/descriptor", "seq": 0, "time": rt.sessions.clock(), "data": descriptor}
            child = rt.sessions.create(
                f"child-{index}",
                header=HeaderInit(parent_session="parent", origin="subagent", delegation_depth=1),
                seed=[record],
                inherited_event_count=0,
            )
            await rt.sessions.flush(child)
            rt.sessions.dispose(child)


def _run_agents(home: Path, extra: list[str]) -> str:
    """Code that runs `dsh --home HOME agents parent EXTRA` in-process, stdout a pipe (not a terminal)."""
    argv = ["dsh", "--home", str(home), "agents", "parent", *extra]
    return (
        f"import sys\nsys.argv = {argv!r}\nfrom dsh.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit as stop:\n    assert not stop.code, stop.code"
    )


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--json"], ["--plain"], ["--descendants"]])
def test_dsh_agents_off_a_terminal_loads_no_rich_server_model_or_driver(tmp_path: Path, extra: list[str]) -> None:
    """`dsh agents` into a pipe prints its table as plain lines: no rich, fastapi, openai, httpx, psycopg ..."""
    asyncio.run(_small_home(tmp_path))
    loaded = _packages_after(_run_agents(tmp_path, extra))
    assert sorted(loaded & {"rich", *SERVER_AND_MODEL}) == []


NOT_FOR_LISTING = (
    "dsh.agent.loop",
    "dsh.agent.messages",
    "dsh.agent.model",
    "dsh.agent.models",
    "dsh.agent.tools",
    "dsh.cli.doctor",
    "dsh.cli.history",
    "dsh.cli.run",
    "dsh.cli.serve",
    "dsh.cli.sessions",
    "dsh.demo",
    "dsh.doctor",
    "dsh.persistence.postgres",
    "dsh.persistence.sqlite",
    "dsh.projection.cache_postgres",
    "dsh.query.history",
    "dsh.query.summary",
    "dsh.server",
    "dsh.subagent._compose",
    "dsh.subagent._continuation",
    "dsh.subagent._inprocess",
    "dsh.subagent.activation",
    "dsh.subagent.descriptor",
    "dsh.subagent.providers",
    "dsh.testing",
    "dsh.tools",
)
"""What a listing never uses: the agent loop and its tools, the subagent operations and the descriptor
parser, history paging, the other commands, the server and the other stores. Each module defines
classes (its dataclasses cost about half a millisecond each to define), so `dsh agents` loads them
on first use only (docs/architecture.md#import-cost)."""


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--descendants"]])
def test_dsh_agents_loads_no_module_the_listing_does_not_use(tmp_path: Path, extra: list[str]) -> None:
    """A `dsh agents` start on the default store loads none of the modules `NOT_FOR_LISTING` names."""
    asyncio.run(_small_home(tmp_path))
    report = "print(json.dumps(sorted(name for name in sys.modules if name.startswith('dsh'))))"
    done = subprocess.run(
        [sys.executable, "-c", f"import json\n{_run_agents(tmp_path, extra)}\n{report}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "dsh.subagent.listing" in loaded
    assert [name for name in loaded if name.startswith(NOT_FOR_LISTING)] == []
