"""The CLI of long sessions: titles and totals in `dsh sessions` (and `--search`), per-turn tokens in `dsh history`,
the `dsh run` summary line, and `dsh compact`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from dsh.cli.main import app
from dsh.config import Config
from dsh.runtime import Runtime

runner = CliRunner()


def _script(tmp_path: Path, name: str, main: list[dict[str, Any]], **tracks: list[dict[str, Any]]) -> Path:
    agents: dict[str, Any] = {"main": {"steps": main}}
    agents.update({key: {"steps": steps} for key, steps in tracks.items()})
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"version": 1, "model": "deepseek-chat", "agents": agents}), encoding="utf-8")
    return path


def _run(home: Path, prompt: str, script: Path, *extra: str) -> Any:
    return runner.invoke(app, ["--home", str(home), "run", prompt, "--script", str(script), *extra])


async def _events(home: Path, session_id: str) -> list[Any]:
    async with Runtime.open(Config(home=home), read_only=True) as rt:
        return list((await rt.persistence.read_events(session_id)).events)


def test_three_runs_list_three_titles_with_totals_and_search_filters_them(tmp_path: Path) -> None:
    """`dsh sessions` after three runs with different prompts shows three titles and token totals (from the
    projection cache); `--search` keeps the matching ones, any case."""
    home = tmp_path / "home"
    usage = {"inputTokens": 1000, "outputTokens": 100, "cacheReadTokens": 4000}
    prompts = ["Refactor the parser module today", "Write release notes for 2.0", "Explain the build failure"]
    for n, prompt in enumerate(prompts):
        script = _script(tmp_path, f"s{n}", [{"text": f"answer {n}", "usage": usage}])
        result = _run(home, prompt, script)
        assert result.exit_code == 0, result.output
    listed = runner.invoke(app, ["--home", str(home), "sessions", "--json"])
    assert listed.exit_code == 0, listed.output
    items = json.loads(listed.stdout)["items"]
    assert sorted(item["title"] for item in items) == sorted(
        ["Refactor the parser module today", "Write release notes for 2.0", "Explain the build failure"]
    )
    for item in items:
        assert item["tokens"]["inputTokens"] == 1000
        assert item["tokens"]["cacheReadTokens"] == 4000
        assert item["tokens"]["currency"] == "USD"
    table = runner.invoke(app, ["--home", str(home), "sessions", "--plain"], env={"COLUMNS": "200"})
    assert "TITLE" in table.stdout
    assert "TOKENS" in table.stdout
    assert "5,100" in table.stdout
    assert "Explain the build failure" in table.stdout
    found = runner.invoke(app, ["--home", str(home), "sessions", "--json", "--search", "RELEASE"])
    assert [item["title"] for item in json.loads(found.stdout)["items"]] == ["Write release notes for 2.0"]
    none = runner.invoke(app, ["--home", str(home), "sessions", "--search", "nothing like it"])
    assert none.exit_code == 0
    assert "(no sessions yet)" in none.stdout


def test_run_ends_with_a_token_summary_on_stderr(tmp_path: Path) -> None:
    """`dsh run` prints one line on stderr with the session's tokens and, for a priced model, the cost."""
    script = _script(tmp_path, "s", [{"text": "ok", "usage": {"inputTokens": 1200, "outputTokens": 45}}])
    result = _run(tmp_path / "home", "Say ok", script)
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stderr.splitlines() if "tokens" in line]
    assert "1,245 tokens (in 1,200 · cached 0 · out 45) · $0.0004" in line


def test_history_shows_each_turns_tokens(tmp_path: Path) -> None:
    """`dsh history` ends every turn shown from its start with the turn's token total."""
    home = tmp_path / "home"
    usage = {"inputTokens": 300, "outputTokens": 20}
    script = _script(tmp_path, "s", [{"text": "first", "usage": usage}, {"text": "second", "usage": usage}])
    first = _run(home, "one", script, "--json")
    session_id = json.loads(first.stdout.splitlines()[-1])["sessionId"]
    again = _script(tmp_path, "t", [{"text": "second", "usage": {"inputTokens": 700, "outputTokens": 30}}])
    assert _run(home, "two", again, "--session", session_id).exit_code == 0
    shown = runner.invoke(app, ["--home", str(home), "history", session_id, "--plain"])
    assert shown.exit_code == 0, shown.output
    lines = [line.strip() for line in shown.stdout.splitlines() if line.strip().startswith("tokens:")]
    assert lines == [
        "tokens: 320 tokens (in 300 · cached 0 · out 20) · $0.0001",
        "tokens: 730 tokens (in 700 · cached 0 · out 30) · $0.0002",
    ]


def test_dsh_compact_writes_one_compaction_and_a_failure_exits_6(tmp_path: Path) -> None:
    """`dsh compact ID` summarises the earlier exchanges (one `compaction/*` bracket); a failing summary request
    exits 6 with the reason, and the session still runs."""
    home = tmp_path / "home"
    first = _run(home, "one", _script(tmp_path, "a", [{"text": "first"}]), "--json")
    session_id = json.loads(first.stdout.splitlines()[-1])["sessionId"]
    assert _run(home, "two", _script(tmp_path, "b", [{"text": "second"}]), "--session", session_id).exit_code == 0
    ok = _script(tmp_path, "c", [], compaction=[{"text": "## Goal\n- two prompts"}])
    done = runner.invoke(app, ["--home", str(home), "compact", session_id, "--script", str(ok)])
    assert done.exit_code == 0, done.output
    assert "compacted 3 messages" in done.stdout  # the first prompt, its context and its answer
    events = asyncio.run(_events(home, session_id))
    assert [event.type for event in events].count("compaction/summary") == 1
    bad = _script(tmp_path, "d", [], compaction=[{"error": {"code": "MODEL_UNAVAILABLE", "message": "no summary"}}])
    three = _run(home, "three", _script(tmp_path, "e", [{"text": "third"}]), "--session", session_id)
    assert three.exit_code == 0
    failed = runner.invoke(app, ["--home", str(home), "compact", session_id, "--script", str(bad)])
    assert failed.exit_code == 6
    assert "COMPACTION_FAILED" in failed.stderr
    assert "no summary" in failed.stderr
    four = _run(home, "four", _script(tmp_path, "f", [{"text": "fourth"}]), "--session", session_id)
    assert four.exit_code == 0
    assert "fourth" in four.stdout
    shown = runner.invoke(app, ["--home", str(home), "history", session_id, "--plain", "--limit", "200"])
    assert "summary:" in shown.stdout
