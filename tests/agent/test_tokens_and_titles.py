"""Token totals (per turn, per session, per subagent tree) with their cost, and session titles."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dsh.agent.models import ScriptedModelClient
from dsh.agent.titles import fallback_title
from dsh.agent.usage import TokenTotals
from dsh.config import Config
from dsh.persistence.coordinator import PersistenceCoordinator
from dsh.runtime import Runtime
from dsh.testing.event_shapes import assert_harness_shapes
from dsh.testing.postgres import ThrowawaySchemas
from tests.agent.helpers import HANG_GUARD_S, open_runtime, script

_KEYS = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")


def _tree_script(model: str) -> ScriptedModelClient:
    def usage(n: int) -> dict[str, int]:
        return {"inputTokens": 100 * n, "outputTokens": 10 * n, "cacheReadTokens": 1000 * n, "reasoningTokens": n}

    def call(label: str, prompt: str) -> dict[str, Any]:
        return {"name": "agent", "arguments": {"description": label, "prompt": prompt}}

    return ScriptedModelClient.from_dict(
        {
            "version": 1,
            "model": model,
            "agents": {
                "main": {
                    "steps": [
                        {"toolCalls": [call("Level one", "Go one level deeper.")], "usage": usage(1)},
                        {"text": "TOP_DONE", "usage": usage(2)},
                    ]
                },
                "Level one": {
                    "steps": [
                        {"toolCalls": [call("Level two", "Answer LEAF.")], "usage": usage(3)},
                        {"text": "ONE_DONE", "usage": usage(4)},
                    ]
                },
                "Level two": {"steps": [{"text": "LEAF", "usage": usage(5)}]},
            },
        }
    )


async def _logged_usage(rt: Runtime) -> tuple[dict[str, int], int]:
    """The usage of every `assistant/message` of every stored session, summed from the logs themselves."""
    total: Counter[str] = Counter()
    requests = 0
    for row in await rt.persistence.list():
        for event in (await rt.persistence.read_events(row.header.id)).events:
            if event.type == "assistant/message" and "usage" in event.data:  # type: ignore[operator]
                total.update(event.data["usage"])  # type: ignore[index]
                requests += 1
    return {key: total.get(key, 0) for key in _KEYS}, requests


@pytest.mark.parametrize(("model", "priced"), [("deepseek-chat", True), ("scripted-unpriced", False)])
async def test_a_two_level_tree_totals_the_usage_of_its_steps(tmp_path: Path, model: str, priced: bool) -> None:
    """A parent, its child and its grandchild: the tree's total equals the usage summed over every step in their
    logs, the parent's own total only its steps; DeepSeek's price gives a cost, an unknown model none."""
    async with Runtime.open(Config(home=tmp_path, agent={"time_context": False}), model=_tree_script(model)) as rt:
        result = await rt.run("Delegate two levels down.")
        assert result.output == "TOP_DONE"
        await rt.settle(timeout=HANG_GUARD_S)
        tree = await rt.tokens(result.session_id, tree=True)
        own = await rt.tokens(result.session_id)
        logged, requests = await _logged_usage(rt)
        sessions = await rt.persistence.list()
        for row in sessions:
            assert_harness_shapes((await rt.persistence.read_events(row.header.id)).events)
    assert len(sessions) == 3
    assert (tree.input_tokens, tree.output_tokens, tree.cache_read_tokens) == (
        logged["inputTokens"],
        logged["outputTokens"],
        logged["cacheReadTokens"],
    )
    assert (tree.reasoning_tokens, tree.requests) == (logged["reasoningTokens"], requests) == (15, 5)
    assert (own.input_tokens, own.requests) == (300, 2)
    if priced:
        # $0.28 per million uncached input, $0.028 per million cache hits, $0.42 per million output.
        expected = (1500 * 0.28 + 15000 * 0.028 + 150 * 0.42) / 1_000_000
        assert tree.cost == pytest.approx(expected)
        assert tree.currency == "USD"
        assert result.tokens is not None
        assert result.tokens.cost == pytest.approx((300 * 0.28 + 3000 * 0.028 + 30 * 0.42) / 1_000_000)
    else:
        assert (tree.cost, tree.currency) == (None, None)
        assert "$" not in tree.summary()


async def test_run_results_carry_the_turn_and_session_totals(tmp_path: Path) -> None:
    """`rt.run` returns the turn's total and the session's total so far; a turn without usage counts nothing."""
    client = script(
        [
            {"text": "one", "usage": {"inputTokens": 100, "outputTokens": 5, "cacheReadTokens": 40}},
            {"text": "two", "usage": {"inputTokens": 20, "outputTokens": 7, "cacheReadTokens": 140}},
        ]
    )
    async with open_runtime(tmp_path, client) as rt:
        first = await rt.run("one")
        second = await rt.run("two", first.session_id)
    assert first.tokens == TokenTotals(100, 5, 40, requests=1)
    assert second.tokens == TokenTotals(20, 7, 140, requests=1)
    assert second.session_tokens == TokenTotals(120, 12, 180, requests=2)
    assert second.session_tokens.total_tokens == 312


def test_the_fallback_title_is_the_first_five_words_within_60_characters() -> None:
    """Five words, controls and runs of whitespace removed, and never more than 60 characters."""
    assert fallback_title("  Fix the\tflaky   test in parser.py please, it fails on CI") == "Fix the flaky test in"
    assert fallback_title("\x1b[31mred\x1b[0m alert") == "red alert"
    long = fallback_title("Supercalifragilisticexpialidocious " * 5)
    assert len(long) <= 60
    assert long.startswith("Supercalifragilisticexpialidocious Supercal")
    assert fallback_title(" \n ") == ""


async def test_the_first_turn_titles_the_session_once(tmp_path: Path) -> None:
    """Only the first user message titles a session (`session/title`, fallback source, its seq); later turns don't,
    and the `title` unit shows it."""
    async with open_runtime(tmp_path, script([{"text": "a"}, {"text": "b"}])) as rt:
        first = await rt.run("Summarise the quarterly report for the board meeting")
        await rt.run("And now in French", first.session_id)
        session = rt.sessions.get(first.session_id)
        assert session is not None
        titles = [event for event in session.events if event.type == "session/title"]
        view = rt.projections.snapshot(session, ["title"]).get("title")
    assert [event.data for event in titles] == [
        {"title": "Summarise the quarterly report for", "messageSeqs": [5], "source": {"kind": "fallback"}}
    ]
    assert view == "Summarise the quarterly report for"


async def test_a_model_written_title_never_delays_the_turn(tmp_path: Path) -> None:
    """With `model_titles`, the turn ends while the title request is still held; once released, the request is
    recorded in the harness's shape and the model's title wins."""
    client = script([{"text": "answer"}], title=[{"hold": "title", "text": '"Quarterly board summary."'}])
    async with open_runtime(tmp_path, client, model_titles=True) as rt:
        result = await rt.run("Summarise the quarterly report for the board meeting")
        assert result.output == "answer"
        agent = rt.agents.get(result.session_id)
        assert agent is not None
        types = [event.type for event in agent.session.events]
        assert types.count("session/title") == 1  # only the fallback: the model is still held
        assert types.count("session/title-llm-request") == 1
        client.release("title")
        await asyncio.wait_for(agent.wait_title(), HANG_GUARD_S)
        events = list(agent.session.events)
        title = rt.projections.snapshot(agent.session, ["title"]).get("title")
    request = next(event for event in events if event.type == "session/title-llm-request")
    assert request.data["titleProvider"] == "pydsh/model-title"  # type: ignore[index]
    assert request.data["route"] == {"provider": "scripted", "model": "scripted-test"}  # type: ignore[index]
    last = [event for event in events if event.type == "session/title"][-1]
    assert last.data["source"] == {  # type: ignore[index]
        "kind": "provider",
        "provider": "pydsh/model-title",
        "model": {"provider": "scripted", "model": "scripted-test"},
    }
    assert title == "Quarterly board summary"
    assert_harness_shapes(events)


async def test_a_failed_model_title_keeps_the_fallback(tmp_path: Path) -> None:
    """A title request that fails only logs: the fallback title stays and the turn is unaffected."""
    client = script([{"text": "answer"}], title=[{"error": {"code": "MODEL_UNAVAILABLE", "message": "down"}}])
    async with open_runtime(tmp_path, client, model_titles=True) as rt:
        result = await rt.run("Plan the garden for spring")
        agent = rt.agents.get(result.session_id)
        assert agent is not None
        await asyncio.wait_for(agent.wait_title(), HANG_GUARD_S)
        assert rt.projections.snapshot(agent.session, ["title"]).get("title") == "Plan the garden for spring"
    assert result.output == "answer"


async def test_lists_get_titles_and_totals_from_the_cache_with_zero_log_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the session closed, a new runtime lists its title and total from the projection cache alone."""
    await _listed_after_close(Config(home=tmp_path), monkeypatch)


async def test_lists_get_titles_and_totals_from_the_postgres_cache_with_zero_log_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_schemas: ThrowawaySchemas
) -> None:
    """The same on PostgreSQL, whose cache table lives beside the sessions."""
    postgres = {"schema_name": pg_schemas.new()}
    await _listed_after_close(Config(home=tmp_path, database_url=pg_schemas.url, postgres=postgres), monkeypatch)


async def _listed_after_close(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    client = script([{"text": "a", "usage": {"inputTokens": 50, "outputTokens": 5}}])
    async with Runtime.open(config, model=client) as rt:
        result = await rt.run("Count the words in README")
    reads: Counter[str] = Counter()
    for name in ("inspect", "read_events", "prepare"):
        original = getattr(PersistenceCoordinator, name)

        def counting(self: Any, session_id: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            reads[session_id] += 1
            return _original(self, session_id, *args, **kwargs)

        monkeypatch.setattr(PersistenceCoordinator, name, counting)
    async with Runtime.open(config, read_only=True) as rt:
        (record,) = await rt.query.list_sessions()
        facts = await rt.listed_facts(record.header)
    assert record.id == result.session_id
    assert facts.title == "Count the words in README"
    assert facts.tokens == TokenTotals(50, 5, requests=1)
    assert sum(reads.values()) == 0


async def test_a_session_written_before_titles_is_titled_from_its_first_prompt(tmp_path: Path) -> None:
    """A session whose log has prompts but no title gets one at its next turn, from its first prompt."""
    async with open_runtime(tmp_path, script([{"text": "ok"}])) as rt:
        session = rt.sessions.create()
        first = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "Migrate the billing tables"}]}
        event = session.append("user/message", {**first, "source": {"kind": "user"}}, surface_op="append")
        agent = rt.start_agent(session)
        await agent.turn_result(await agent.send("Any news?"))
        titles = [e.data for e in agent.session.events if e.type == "session/title"]
    assert titles == [
        {"title": "Migrate the billing tables", "messageSeqs": [event.seq], "source": {"kind": "fallback"}}
    ]
