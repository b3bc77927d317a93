"""The `dsh` command line: help texts, exit codes, and `dsh agents` over a home folder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from dsh.agent.errors import AgentError, ModelError
from dsh.cli.errors import exit_code_for
from dsh.cli.main import app
from dsh.config import Config
from dsh.errors import ConfigError
from dsh.query.errors import SessionQueryError
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor

runner = CliRunner()


def _commands() -> dict[str, Any]:
    group: Any = get_command(app)
    return dict(group.commands)


def test_every_command_and_option_has_help() -> None:
    """Every CLI command and every option of it carries a help text (a missing one fails here)."""
    commands = _commands()
    assert {"demo", "agents"} <= set(commands)
    for name, command in commands.items():
        assert command.help, f"command {name} has no help text"
        for parameter in command.params:
            if parameter.param_type_name in ("option", "argument"):
                assert getattr(parameter, "help", None), (
                    f"{parameter.param_type_name} {parameter.name} of {name} lacks help"
                )


def test_version_flag_prints_the_version() -> None:
    """`dsh --version` prints the package version and exits 0."""
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("dsh ")


async def _family(home: Path) -> tuple[str, list[dict[str, object]]]:
    """A parent with one cold continuable child and one cold child without a descriptor."""
    config = Config(home=home)
    async with Runtime.open(config) as rt:
        parent = rt.sessions.create("parent")
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        child = rt.sessions.create(
            "child-good",
            header=HeaderInit(parent_session="parent", origin="subagent", delegation_depth=1),
            seed=[
                {
                    "type": "subagent/descriptor",
                    "seq": 0,
                    "time": 1,
                    "data": snapshot_descriptor("continuable", provider="spawn", label="Collect sources"),
                }
            ],
        )
        child.append("turn/start", {"turn": 1})
        child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        broken = rt.sessions.create(
            "child-broken", header=HeaderInit(parent_session="parent", origin="subagent", delegation_depth=1)
        )
        broken.append("turn/start", {"turn": 1})
        broken.append("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}})
        for session in (parent, child, broken):
            await rt.sessions.flush(session)
    async with Runtime.open(config) as rt:
        rows = [row.to_json() for row in await rt.subagents.list_children("parent")]
    return "parent", rows


def test_agents_json_equals_the_library_rows(tmp_path: Path) -> None:
    """`dsh agents P --json` prints exactly the rows `list_children(P)` returns, camelCase."""
    parent, expected = asyncio.run(_family(tmp_path))
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", parent, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == expected
    kinds = {row["id"]: row["kind"] for row in expected}
    assert kinds == {"child-good": "child", "child-broken": "diagnostic"}


def test_agents_table_marks_diagnostic_rows(tmp_path: Path) -> None:
    """The plain table shows the label of a healthy child and marks a damaged one `(diagnostic)`."""
    parent, _ = asyncio.run(_family(tmp_path))
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", parent, "--plain"])
    assert result.exit_code == 0, result.output
    assert "Collect sources" in result.output
    assert "(diagnostic): corrupt" in result.output


def test_agents_descendants_json_carries_depth(tmp_path: Path) -> None:
    """`dsh agents P --descendants --json` adds `parentId` and `depth` to each row."""
    parent, _ = asyncio.run(_family(tmp_path))
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", parent, "--descendants", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {(row["id"], row["parentId"], row["depth"]) for row in rows} == {
        ("child-good", "parent", 1),
        ("child-broken", "parent", 1),
    }


def test_agents_of_an_unknown_parent_is_empty(tmp_path: Path) -> None:
    """An unknown parent id lists `[]` with exit 0, not an error (docs/catalog.md#accepted-deviations)."""
    result = runner.invoke(app, ["--home", str(tmp_path), "agents", "nobody", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert result.stderr == f"no session nobody in {tmp_path}\n"


def test_bad_database_url_exits_with_the_configuration_code(tmp_path: Path) -> None:
    """An unsupported database URL is a configuration error: exit 4 and the stable code on stderr."""
    result = runner.invoke(app, ["--home", str(tmp_path), "--database-url", "ftp://x", "agents", "p"])
    assert result.exit_code == 4
    assert "CONFIG_INVALID" in result.output


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("bad"), 4),
        (SessionQueryError("gone", code="SESSION_QUERY_SESSION_NOT_FOUND"), 3),
        (SessionQueryError("broken", code="SESSION_QUERY_CORRUPT_SESSION"), 5),
        (RuntimeError("bug"), 1),
        (KeyboardInterrupt(), 130),
        (ModelError("no key", code="MODEL_NOT_CONFIGURED"), 4),
        (ModelError("down", code="MODEL_UNAVAILABLE"), 6),
        (ModelError("mismatch", code="SCRIPT_MISMATCH"), 6),
        (AgentError("fenced", code="SESSION_OWNED_BY_SUBAGENT"), 8),
    ],
)
def test_error_families_map_to_exit_codes(error: BaseException, code: int) -> None:
    """The one exit-code table maps error families to the documented codes."""
    assert exit_code_for(error) == code
