"""The scripted replay model: selection, the chunk stream, placeholders, gates and every SCRIPT_* failure.

Layer: agent (tests). Requests are built by hand (tests/agent/scripted_helpers.py), so each test
states the conversation a track sees without running the agent loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.abort import AbortController, AbortError, AbortSignal
from dsh.agent.errors import ModelError
from dsh.agent.model import (
    BlockEnd,
    BlockStart,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh.agent.models.scripted import ModelScript, ScriptedModelClient
from tests.agent.scripted_helpers import (
    agent_call,
    assistant_calls,
    collect,
    notice,
    request,
    script,
    streamed_text,
    tool_result,
    user,
)

_GUARD_S = 10.0
"""Hang guard for awaited events; never a timing expectation."""

_HAS_YAML = importlib.util.find_spec("yaml") is not None


def _calls(chunks: list[Any]) -> list[dict[str, Any]]:
    return [dict(c.block) for c in chunks if isinstance(c, BlockEnd) and c.block["type"] == "tool-call"]


def _invalid(data: object) -> str:
    with pytest.raises(ModelError) as caught:
        ScriptedModelClient.from_dict(data)
    assert caught.value.code == "SCRIPT_INVALID"
    return caught.value.message


# -- the chunk stream ------------------------------------------------------------------------------


async def test_text_answer_streams_block_usage_and_stop() -> None:
    """A text-only step streams block-start, deltas, block-end, the default usage, then `stop`."""
    client = script({"main": {"steps": [{"text": "hello"}]}})
    chunks = await collect(client, request(user("hi")))
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "hello"),
        BlockEnd(0, {"type": "text", "text": "hello"}),
        UsageChunk(Usage(input_tokens=10, output_tokens=5)),
        Finish("stop"),
    ]


async def test_blocks_come_reasoning_then_text_then_each_tool_call() -> None:
    """Reasoning, text and two tool calls take block indexes 0-3 in that order, and the finish is `tool-calls`."""
    step = {
        "reasoning": "think",
        "text": "doing it",
        "toolCalls": [{"name": "one", "arguments": {"a": 1}}, {"name": "two", "arguments": "{}"}],
    }
    chunks = await collect(script({"main": {"steps": [step]}}), request(user("go")))
    starts = [c for c in chunks if isinstance(c, BlockStart)]
    assert starts == [
        BlockStart(0, "reasoning"),
        BlockStart(1, "text"),
        BlockStart(2, "tool-call"),
        BlockStart(3, "tool-call"),
    ]
    ends = [c.index for c in chunks if isinstance(c, BlockEnd)]
    assert ends == [0, 1, 2, 3]
    assert [c for c in chunks if isinstance(c, ReasoningDelta)] == [ReasoningDelta(0, "think")]
    assert chunks[-2:] == [UsageChunk(Usage(10, 5)), Finish("tool-calls")]
    assert _calls(chunks) == [
        {"type": "tool-call", "id": "call_1", "name": "one", "arguments": '{"a":1}'},
        {"type": "tool-call", "id": "call_2", "name": "two", "arguments": "{}"},
    ]


async def test_text_and_reasoning_are_split_by_chunk_size() -> None:
    """`chunkSize` sets the characters per delta; the default of 16 splits a longer text too."""
    client = script(
        {"main": {"steps": [{"reasoning": "abcdefghij", "text": "0123456789", "chunkSize": 4}, {"text": "x" * 40}]}}
    )
    first = await collect(client, request(user("a")))
    assert [c.text for c in first if isinstance(c, ReasoningDelta)] == ["abcd", "efgh", "ij"]
    assert [c.text for c in first if isinstance(c, TextDelta)] == ["0123", "4567", "89"]
    second = await collect(client, request(user("b")))
    assert [len(c.text) for c in second if isinstance(c, TextDelta)] == [16, 16, 8]


async def test_tool_call_arguments_stream_in_fragments_and_only_the_first_names_the_call() -> None:
    """A call's arguments arrive as several deltas split by `chunkSize`; the first carries the tool name."""
    step = {"toolCalls": [{"id": "c9", "name": "echo", "arguments": {"text": "abcdefgh"}}], "chunkSize": 5}
    chunks = await collect(script({"main": {"steps": [step]}}), request(user("go")))
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert len(deltas) > 1
    assert deltas[0].name == "echo"
    assert all(d.name is None for d in deltas[1:])
    assert {d.id for d in deltas} == {"c9"}
    assert "".join(d.arguments_delta for d in deltas) == '{"text":"abcdefgh"}'


async def test_default_call_ids_count_per_track() -> None:
    """Calls without an id get `call_1`, `call_2`, ... counted across the steps of one track, separately per track."""
    client = script(
        {
            "main": {"steps": [{"toolCalls": [{"name": "a"}, {"name": "b"}]}, {"toolCalls": [{"name": "c"}]}]},
            "helper": {"steps": [{"toolCalls": [{"name": "d"}]}]},
        }
    )
    first = await collect(client, request(user("1")))
    helper = await collect(client, request(user("x"), agent_key="helper"))
    second = await collect(client, request(user("2")))
    assert [c["id"] for c in _calls(first)] == ["call_1", "call_2"]
    assert [c["id"] for c in _calls(second)] == ["call_3"]
    assert [c["id"] for c in _calls(helper)] == ["call_1"]


async def test_finish_and_usage_can_be_scripted() -> None:
    """A scripted `finish` and `usage` (disjoint counts, cache reads and writes apart) replace the defaults."""
    usage = {"inputTokens": 7, "outputTokens": 3, "cacheReadTokens": 2, "cacheWriteTokens": 1}
    step = {"text": "cut", "finish": "length", "usage": usage}
    chunks = await collect(script({"main": {"steps": [step]}}), request(user("go")))
    assert chunks[-2:] == [UsageChunk(Usage(7, 3, cache_read_tokens=2, cache_write_tokens=1)), Finish("length")]


def test_a_script_with_the_older_inclusive_usage_is_refused_with_its_replacement() -> None:
    """`cachedInputTokens` in a script is SCRIPT_INVALID naming its path and the field that replaced it."""
    step = {"text": "x", "usage": {"inputTokens": 7, "outputTokens": 3, "cachedInputTokens": 2}}
    with pytest.raises(ModelError) as caught:
        script({"main": {"steps": [step]}})
    assert caught.value.code == "SCRIPT_INVALID"
    assert "$.agents.main.steps[0].usage: cachedInputTokens is no longer a usage field" in caught.value.message
    assert "cacheReadTokens" in caught.value.message


async def test_client_reports_its_provider_and_the_script_model() -> None:
    """The provider is `scripted` and `model` is the script's default model name."""
    client = script({"main": {"steps": []}}, model="scripted-demo")
    assert client.provider == "scripted"
    assert client.model == "scripted-demo"
    await client.aclose()


# -- selection -------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["notices-first", "user-first"])
async def test_one_standing_entry_answers_two_notices_in_either_order(order: str) -> None:
    """A standing `on` entry answers every settlement notice, wherever they fall, and is never used up."""
    client = script(
        {
            "main": {
                "steps": [{"match": {"lastUser": "go"}, "text": "STARTED"}],
                "on": [{"match": {"source": "subagent-settled"}, "text": "NOTED"}],
            }
        }
    )
    go = request(user("go"))
    sequence = [notice(), notice(), go] if order == "notices-first" else [go, notice(), notice()]
    answers = []
    for item in sequence:
        req = item if item is go else request(user("go"), item)
        answers.append(streamed_text(await collect(client, req)))
    expected = ["NOTED", "NOTED", "STARTED"] if order == "notices-first" else ["STARTED", "NOTED", "NOTED"]
    assert answers == expected
    client.assert_consumed()


async def test_first_fitting_standing_entry_wins_over_later_ones_and_steps() -> None:
    """Standing entries are tried in order before the steps; the first that fits answers."""
    client = script(
        {
            "main": {
                "steps": [{"text": "STEP"}],
                "on": [
                    {"match": {"lastUser": "ping"}, "text": "FIRST"},
                    {"match": {"lastUser": "p"}, "text": "SECOND"},
                ],
            }
        }
    )
    assert streamed_text(await collect(client, request(user("ping")))) == "FIRST"
    assert streamed_text(await collect(client, request(user("pong")))) == "SECOND"
    assert streamed_text(await collect(client, request(user("other")))) == "STEP"


async def test_head_mismatch_names_agent_step_request_expected_and_actual() -> None:
    """A head whose match does not fit raises SCRIPT_MISMATCH with the exact expected-against-actual message."""
    client = script(
        {
            "main": {
                "steps": [{"text": "first"}, {"match": {"lastUser": "three helpers"}, "text": "second"}],
                "on": [{"match": {"source": "subagent-settled"}, "text": "NOTED"}],
            }
        }
    )
    await collect(client, request(user("hi")))
    await collect(client, request(user("hi"), notice()))
    with pytest.raises(ModelError) as caught:
        await collect(client, request(user("List your helpers.")))
    assert caught.value.code == "SCRIPT_MISMATCH"
    assert caught.value.message == (
        'script mismatch for agent "main" at step 2 (request 3): '
        'lastUser should contain "three helpers", got "List your helpers."'
    )


async def test_last_user_ignores_a_newer_tool_result() -> None:
    """`lastUser` reads the newest non-tool user message, even when a tool result is newer."""
    conversation = [user("A: start"), assistant_calls(("c1", "echo", "{}")), tool_result("c1", "B: echoed")]
    fits = script({"main": {"steps": [{"match": {"lastUser": "A"}, "text": "ok"}]}})
    assert streamed_text(await collect(fits, request(*conversation))) == "ok"
    misses = script({"main": {"steps": [{"match": {"lastUser": "B"}, "text": "ok"}]}})
    with pytest.raises(ModelError) as caught:
        await collect(misses, request(*conversation))
    assert caught.value.code == "SCRIPT_MISMATCH"
    assert 'lastUser should contain "B", got "A: start"' in caught.value.message


async def test_last_tool_result_source_turn_and_tools_keys_all_must_hold() -> None:
    """`lastToolResult`, `source`, `turn` and `tools` each fit, and each broken one is reported."""
    match = {"lastToolResult": "echoed", "source": "coordinator", "turn": 2, "tools": ["echo", "agent"]}
    conversation = [
        user("relay", kind="coordinator"),
        assistant_calls(("c1", "echo", "{}")),
        tool_result("c1", "echoed"),
    ]
    fits = script({"main": {"steps": [{"match": match, "text": "ok"}]}})
    assert streamed_text(await collect(fits, request(*conversation, turn=2, tools=["agent", "echo"]))) == "ok"

    misses = script({"main": {"steps": [{"match": match, "text": "ok"}]}})
    with pytest.raises(ModelError) as caught:
        await collect(misses, request(user("hi"), turn=1, tools=["echo"]))
    message = caught.value.message
    assert caught.value.code == "SCRIPT_MISMATCH"
    assert 'lastToolResult should contain "echoed", got no tool result' in message
    assert 'source should be "coordinator", got "user"' in message
    assert "turn should be 2, got 1" in message
    assert 'tools should include "agent", got "echo"' in message


async def test_exhausted_track_raises_script_exhausted() -> None:
    """A request after the last step raises SCRIPT_EXHAUSTED naming agent, step and request."""
    client = script({"main": {"steps": [{"text": "only"}]}})
    await collect(client, request(user("one")))
    with pytest.raises(ModelError) as caught:
        await collect(client, request(user("two")))
    assert caught.value.code == "SCRIPT_EXHAUSTED"
    assert caught.value.message == (
        'script exhausted for agent "main" at step 2 (request 2): '
        'expected no more requests, got one with lastUser "two"'
    )


async def test_unknown_agent_key_raises_script_unknown_agent() -> None:
    """A request for a key the script lacks raises SCRIPT_UNKNOWN_AGENT listing the known keys."""
    client = script({"main": {"steps": []}, "Draft outline": {"steps": []}})
    with pytest.raises(ModelError) as caught:
        await collect(client, request(user("x"), agent_key="one-shot"))
    assert caught.value.code == "SCRIPT_UNKNOWN_AGENT"
    assert caught.value.message == (
        'unknown script agent "one-shot" at step 1 (request 1): expected one of "Draft outline", "main"'
    )


async def test_children_with_the_same_label_share_one_track() -> None:
    """Two requests with the same agent key (two children, one label) consume one track in order."""
    client = script({"Helper": {"steps": [{"text": "first"}, {"text": "second"}]}})
    one = await collect(client, request(user("a"), agent_key="Helper", session_id="c1"))
    two = await collect(client, request(user("b"), agent_key="Helper", session_id="c2"))
    assert [streamed_text(one), streamed_text(two)] == ["first", "second"]
    client.assert_consumed()


async def test_aborted_signal_raises_before_a_step_is_consumed() -> None:
    """A request whose signal is already aborted raises the abort and leaves the step in place."""
    client = script({"main": {"steps": [{"text": "later"}]}})
    with pytest.raises(AbortError):
        await collect(client, request(user("x")), AbortSignal.aborted_with())
    assert streamed_text(await collect(client, request(user("x")))) == "later"


# -- simulated failures ----------------------------------------------------------------------------


async def test_scripted_error_raises_its_model_code() -> None:
    """A step with `error` raises ModelError with the scripted code and message."""
    client = script({"main": {"steps": [{"error": {"code": "MODEL_RATE_LIMITED", "message": "slow down"}}]}})
    with pytest.raises(ModelError) as caught:
        await collect(client, request(user("x")))
    assert (caught.value.code, caught.value.message) == ("MODEL_RATE_LIMITED", "slow down")


async def test_scripted_error_after_text_breaks_the_stream_midway() -> None:
    """An error with text streams the text deltas, then raises without closing the block or finishing."""
    step = {"text": "partial answer", "chunkSize": 8, "error": {"code": "MODEL_UNAVAILABLE", "message": "broken"}}
    client = script({"main": {"steps": [step]}})
    seen: list[Any] = []

    async def consume() -> None:
        async for chunk in client.stream(request(user("x")), signal=AbortSignal.none()):
            seen.append(chunk)

    with pytest.raises(ModelError) as caught:
        await consume()
    assert caught.value.code == "MODEL_UNAVAILABLE"
    assert seen == [BlockStart(0, "text"), TextDelta(0, "partial "), TextDelta(0, "answer")]


# -- loading ---------------------------------------------------------------------------------------


def test_documented_example_script_loads() -> None:
    """The example script of the docs is valid."""
    data = {
        "version": 1,
        "model": "scripted-demo",
        "agents": {
            "main": {
                "steps": [
                    {
                        "match": {"lastUser": "three helpers"},
                        "toolCalls": [
                            {
                                "name": "agent",
                                "arguments": {
                                    "description": "Draft outline",
                                    "prompt": "Outline the essay.",
                                    "run_in_background": True,
                                },
                            }
                        ],
                    },
                    {"text": "HELPERS_STARTED"},
                ],
                "on": [{"match": {"source": "subagent-settled"}, "text": "NOTED"}],
            },
            "Draft outline": {"steps": [{"text": "OUTLINE_OK"}, {"hold": "outline-followup", "text": "OUTLINE_V2_OK"}]},
        },
    }
    client = ScriptedModelClient(ModelScript.model_validate(data))
    assert client.model == "scripted-demo"


def test_malformed_file_names_the_json_path_of_the_fault(tmp_path: Path) -> None:
    """A tool call without a name fails at load with SCRIPT_INVALID naming its JSON path."""
    path = tmp_path / "script.json"
    steps = [{"text": "ok"}, {"toolCalls": [{"arguments": {}}]}]
    path.write_text(json.dumps({"version": 1, "model": "m", "agents": {"main": {"steps": steps}}}))
    with pytest.raises(ModelError) as caught:
        ScriptedModelClient.from_file(path)
    assert caught.value.code == "SCRIPT_INVALID"
    assert "$.agents.main.steps[1].toolCalls[0].name: Field required" in caught.value.message
    assert str(path) in caught.value.message


def test_wrong_type_deep_inside_is_reported_with_its_path() -> None:
    """A string where a turn number belongs, deep inside a labelled track, is reported at its exact path."""
    message = _invalid(
        {"version": 1, "model": "m", "agents": {"Draft outline": {"on": [{"match": {"turn": "2"}, "text": "x"}]}}}
    )
    assert '$.agents["Draft outline"].on[0].match.turn: Input should be a valid integer' in message


@pytest.mark.parametrize(
    ("step", "path"),
    [
        ({"txt": "typo"}, "$.agents.main.steps[0].txt"),
        ({"toolCalls": [{"name": "a", "arguments": 3}]}, "$.agents.main.steps[0].toolCalls[0].arguments"),
        (
            {"toolCalls": [{"name": "a", "arguments": {"x": float("nan")}}]},
            "$.agents.main.steps[0].toolCalls[0].arguments",
        ),
        ({"chunkSize": 0}, "$.agents.main.steps[0].chunkSize"),
        ({"finish": "done"}, "$.agents.main.steps[0].finish"),
        ({"error": {"code": "SCRIPT_MISMATCH", "message": "x"}}, "$.agents.main.steps[0].error.code"),
    ],
)
def test_invalid_fields_are_refused_at_load(step: dict[str, Any], path: str) -> None:
    """Unknown keys, non-JSON arguments, chunk size 0, an unknown finish and a non-model error code fail to load."""
    assert f"{path}:" in _invalid({"version": 1, "model": "m", "agents": {"main": {"steps": [step]}}})


def test_error_cannot_be_combined_with_tool_calls() -> None:
    """A failing response may stream text but never tool calls, a finish or usage."""
    step = {"error": {"code": "MODEL_UNAVAILABLE", "message": "x"}, "toolCalls": [{"name": "a"}]}
    message = _invalid({"version": 1, "model": "m", "agents": {"main": {"steps": [step]}}})
    assert "$.agents.main.steps[0]: a response with error cannot also have toolCalls" in message


def test_unsupported_version_is_refused() -> None:
    """Only version 1 scripts load."""
    assert "$.version:" in _invalid({"version": 2, "model": "m", "agents": {}})


def test_malformed_json_is_script_invalid_with_its_position(tmp_path: Path) -> None:
    """A file that is not JSON fails with SCRIPT_INVALID naming the line and column."""
    path = tmp_path / "broken.json"
    path.write_text('{"version": 1,\n  "model": }')
    with pytest.raises(ModelError) as caught:
        ScriptedModelClient.from_file(path)
    assert caught.value.code == "SCRIPT_INVALID"
    assert "not valid JSON at line 2 column" in caught.value.message


def test_missing_file_is_script_invalid(tmp_path: Path) -> None:
    """An unreadable script path fails with SCRIPT_INVALID naming the path."""
    with pytest.raises(ModelError) as caught:
        ScriptedModelClient.from_file(tmp_path / "absent.json")
    assert caught.value.code == "SCRIPT_INVALID"
    assert "absent.json" in caught.value.message


@pytest.mark.skipif(not _HAS_YAML, reason="PyYAML (the optional pydsh[yaml] extra) is not installed")
async def test_yaml_script_is_accepted_when_pyyaml_is_installed(tmp_path: Path) -> None:
    """A `.yaml` script with the JSON schema loads and answers like its JSON twin."""
    path = tmp_path / "script.yaml"
    lines = ["version: 1", "model: from-yaml", "agents:", "  main:", "    steps:"]
    lines += ['      - match: {lastUser: "hi"}', "        text: YAML_OK"]
    path.write_text("\n".join(lines) + "\n")
    client = ScriptedModelClient.from_file(path)
    assert client.model == "from-yaml"
    assert streamed_text(await collect(client, request(user("hi")))) == "YAML_OK"


def test_yaml_script_without_pyyaml_says_to_install_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PyYAML a `.yaml` script fails with SCRIPT_INVALID naming the `pydsh[yaml]` extra."""
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` raise ImportError
    path = tmp_path / "script.yml"
    path.write_text("version: 1\n")
    with pytest.raises(ModelError) as caught:
        ScriptedModelClient.from_file(path)
    assert caught.value.code == "SCRIPT_INVALID"
    assert "pydsh[yaml]" in caught.value.message


# -- placeholders ----------------------------------------------------------------------------------


async def test_self_placeholder_becomes_the_requesting_session_id() -> None:
    """`${self}` resolves in text, reasoning and nested strings of object arguments."""
    step = {
        "reasoning": "I am ${self}",
        "text": "id=${self}",
        "toolCalls": [{"name": "note", "arguments": {"who": ["${self}", 1], "raw": "${other}"}}],
    }
    chunks = await collect(script({"main": {"steps": [step]}}), request(user("x"), session_id="s-42"))
    assert streamed_text(chunks) == "id=s-42"
    assert "".join(c.text for c in chunks if isinstance(c, ReasoningDelta)) == "I am s-42"
    assert json.loads(_calls(chunks)[0]["arguments"]) == {"who": ["s-42", 1], "raw": "${other}"}


async def test_child_placeholder_resolves_from_the_started_subagent_result() -> None:
    """`${child:Draft outline}` becomes the id reported for the earlier background `agent` call with that label."""
    conversation = [
        user("Research with helpers."),
        assistant_calls(agent_call("c1", "Collect sources"), agent_call("c2", "Draft outline")),
        tool_result("c1", "started subagent child-sources"),
        tool_result("c2", "started subagent child-outline"),
        user("Ask the outline helper to add a conclusion."),
    ]
    step = {
        "toolCalls": [{"name": "send_message", "arguments": {"to": "${child:Draft outline}", "message": "Add it."}}]
    }
    chunks = await collect(script({"main": {"steps": [step]}}), request(*conversation))
    assert json.loads(_calls(chunks)[0]["arguments"]) == {"to": "child-outline", "message": "Add it."}


async def test_child_placeholder_in_string_arguments_is_replaced() -> None:
    """A placeholder inside raw string arguments is replaced in place."""
    conversation = [assistant_calls(agent_call("c1", "Draft outline")), tool_result("c1", "started subagent kid-1")]
    step = {"toolCalls": [{"name": "interrupt_agent", "arguments": '{"id":"${child:Draft outline}"}'}]}
    chunks = await collect(script({"main": {"steps": [step]}}), request(*conversation))
    assert _calls(chunks)[0]["arguments"] == '{"id":"kid-1"}'


async def test_unresolvable_placeholder_raises_script_placeholder() -> None:
    """A child label with no started subagent raises SCRIPT_PLACEHOLDER naming it, the agent, step and request."""
    conversation = [assistant_calls(agent_call("c1", "Draft outline")), tool_result("c1", "OUTLINE_OK")]
    client = script({"main": {"steps": [{"text": "${child:Draft outline}"}]}})
    with pytest.raises(ModelError) as caught:
        await collect(client, request(*conversation))
    assert caught.value.code == "SCRIPT_PLACEHOLDER"
    message = caught.value.message
    assert message.startswith('unresolved placeholder ${child:Draft outline} for agent "main" at step 1 (request 1)')


# -- assert_consumed -------------------------------------------------------------------------------


async def test_assert_consumed_lists_remaining_steps_per_agent() -> None:
    """Leftover steps raise SCRIPT_UNCONSUMED per agent key; standing entries never count."""
    client = script(
        {
            "main": {
                "steps": [{"text": "used"}, {"text": "LEFT_MAIN"}],
                "on": [{"match": {"source": "subagent-settled"}, "text": "standing"}],
            },
            "Draft outline": {"steps": [{"text": "LEFT_CHILD"}]},
            "idle": {"on": [{"text": "never asked"}]},
        }
    )
    await collect(client, request(user("x")))
    with pytest.raises(ModelError) as caught:
        client.assert_consumed()
    assert caught.value.code == "SCRIPT_UNCONSUMED"
    message = caught.value.message
    assert 'agent "main" has 1 step left (step 2: text "LEFT_MAIN")' in message
    assert 'agent "Draft outline" has 1 step left (step 1: text "LEFT_CHILD")' in message
    assert "idle" not in message


# -- gates -----------------------------------------------------------------------------------------


async def _settle_loop() -> None:
    # Let every ready callback run: a held stream stays pending however often the loop turns.
    for _ in range(10):
        await asyncio.sleep(0)


async def test_hold_pauses_after_the_first_delta_until_released() -> None:
    """A held step streams its first delta, then waits until `release(name)`, then completes."""
    client = script({"main": {"steps": [{"hold": "gate", "text": "abcdef", "chunkSize": 3}]}})
    stream = client.stream(request(user("x")), signal=AbortSignal.none())
    assert await anext(stream) == BlockStart(0, "text")
    assert await anext(stream) == TextDelta(0, "abc")
    pending = asyncio.ensure_future(anext(stream))
    await _settle_loop()
    assert not pending.done()
    client.release("gate")
    assert await asyncio.wait_for(pending, _GUARD_S) == TextDelta(0, "def")
    rest = [chunk async for chunk in stream]
    assert rest[-1] == Finish("stop")


async def test_release_before_the_hold_is_remembered() -> None:
    """A gate released before the stream reaches it does not wait."""
    client = script({"main": {"steps": [{"hold": "early", "toolCalls": [{"name": "a"}]}]}})
    client.release("early")
    chunks = await asyncio.wait_for(collect(client, request(user("x"))), _GUARD_S)
    assert chunks[-1] == Finish("tool-calls")


async def test_hold_without_text_waits_before_the_first_chunk() -> None:
    """A held step with no text or reasoning waits before its first chunk."""
    client = script({"main": {"steps": [{"hold": "gate", "toolCalls": [{"name": "a"}]}]}})
    stream = client.stream(request(user("x")), signal=AbortSignal.none())
    pending = asyncio.ensure_future(anext(stream))
    await _settle_loop()
    assert not pending.done()
    client.release("gate")
    assert await asyncio.wait_for(pending, _GUARD_S) == BlockStart(0, "tool-call")
    await stream.aclose()


async def test_abort_while_held_stops_the_stream_with_the_reason() -> None:
    """Aborting the signal while held raises the abort reason from the pending read without a release."""
    client = script({"main": {"steps": [{"hold": "never", "text": "partial text", "chunkSize": 4}]}})
    controller = AbortController()
    stream = client.stream(request(user("x")), signal=controller.signal)
    assert await anext(stream) == BlockStart(0, "text")
    assert await anext(stream) == TextDelta(0, "part")
    pending = asyncio.ensure_future(anext(stream))
    await _settle_loop()
    reason = AbortError("user cancelled")
    controller.abort(reason)
    with pytest.raises(AbortError) as caught:
        await asyncio.wait_for(pending, _GUARD_S)
    assert caught.value is reason


async def test_task_cancellation_while_held_propagates() -> None:
    """Cancelling the consuming task while held raises CancelledError and leaves the gate usable."""
    client = script({"main": {"steps": [{"hold": "gate", "text": "a"}, {"hold": "gate", "text": "b"}]}})
    consumer = asyncio.ensure_future(collect(client, request(user("x"))))
    await _settle_loop()
    assert not consumer.done()
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(consumer, _GUARD_S)
    client.release("gate")
    chunks = await asyncio.wait_for(collect(client, request(user("y"))), _GUARD_S)
    assert streamed_text(chunks) == "b"
