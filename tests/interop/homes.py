"""Homes pydsh writes for the harness to read: the library API, the agent loop, a resumed harness session.

Layer: tests (interop). Each builder fills a home through public pydsh entry points only, the way a
user would, and returns what the tests need to know about it (the top-level sessions to list from).
The agent-loop home runs real agents on the scripted model: a one-shot and a continuable child that
each start a child of their own (two levels deep), a follow-up to the continuable child, a fork of
the parent, a subagent started with the `fork` provider, and a turn cancelled mid-answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dsh.agent.ids import SequentialIds
from dsh.agent.models.scripted import ScriptedModelClient
from dsh.config import Config
from dsh.runtime import Runtime
from dsh.session.header import HeaderInit
from dsh.subagent.descriptor import snapshot_descriptor
from dsh.subagent.providers import ContinuableSpec
from dsh.testing.stored_logs import StepClock

__all__ = ["AGENT_SCRIPT", "Home", "agent_home", "library_home", "resume_in_pydsh"]

GUARD_S: Final = 60.0
"""A hang guard for agents that should settle, never a timing."""

_CUT_SHORT: Final = "cut-short"


def _agent_call(description: str, prompt: str, *, background: bool = False) -> dict[str, Any]:
    arguments: dict[str, Any] = {"description": description, "prompt": prompt}
    if background:
        arguments["run_in_background"] = True
    return {"name": "agent", "arguments": arguments}


AGENT_SCRIPT: Final[dict[str, Any]] = {
    "version": 1,
    "model": "scripted-interop",
    "agents": {
        "main": {
            "steps": [
                {
                    "match": {"lastUser": "Start the work"},
                    "reasoning": "Two helpers, one of each kind.",
                    "toolCalls": [
                        _agent_call("One-shot helper", "Do the one-shot job."),
                        _agent_call("Background helper", "Do the background job.", background=True),
                    ],
                    "usage": {"inputTokens": 40, "outputTokens": 12, "cacheReadTokens": 64, "reasoningTokens": 5},
                },
                {"match": {"lastToolResult": "started subagent"}, "text": "HELPERS_STARTED"},
                {
                    "match": {"lastUser": "Ask the background helper again"},
                    "toolCalls": [
                        {
                            "name": "send_message",
                            "arguments": {"subagent_id": "${child:Background helper}", "message": "Once more."},
                        }
                    ],
                },
                {"match": {"lastToolResult": "message queued"}, "text": "ASKED_AGAIN"},
                {"match": {"lastUser": "Write a long answer"}, "hold": _CUT_SHORT, "text": "This answer is cut short."},
            ],
            "on": [
                {"match": {"source": "subagent-settled"}, "text": "NOTED"},
                {"match": {"lastUser": "Carry on in the fork"}, "text": "FORK_GOES_ON"},
            ],
        },
        "One-shot helper": {
            "steps": [
                {"toolCalls": [_agent_call("One-shot grandchild", "Dig deeper.")]},
                {"match": {"lastToolResult": "GRANDCHILD_DONE"}, "text": "ONE_SHOT_DONE"},
            ]
        },
        "One-shot grandchild": {"steps": [{"text": "GRANDCHILD_DONE", "chunkSize": 4}]},
        "Background helper": {
            "steps": [
                {"toolCalls": [_agent_call("Background grandchild", "Research more.", background=True)]},
                {"match": {"lastToolResult": "started subagent"}, "text": "BACKGROUND_STARTED"},
                {"match": {"lastUser": "Once more."}, "text": "BACKGROUND_AGAIN"},
            ],
            "on": [{"match": {"source": "subagent-settled"}, "text": "BACKGROUND_NOTED"}],
        },
        "Background grandchild": {"steps": [{"text": "BACKGROUND_GRANDCHILD_DONE"}, {"text": "FORKED_HELPER_DONE"}]},
        "Forked helper": {"steps": [{"text": "FORKED_HELPER_DONE"}]},
    },
}


@dataclass(frozen=True, slots=True)
class Home:
    """A home pydsh wrote: its folder, the JSONL root below it, and the sessions catalogs start from."""

    path: Path
    roots: tuple[str, ...]

    @property
    def sessions(self) -> Path:
        """The JSONL store root (`<home>/sessions`)."""
        return self.path / "sessions"


def _config(home: Path, *, compression: str = "zstd", log_chunks: bool = False) -> Config:
    return Config(
        home=home,
        persistence={"compression": compression},
        agent={"log_chunks": log_chunks, "cancel_grace_s": 5.0},
    )


async def agent_home(home: Path, *, log_chunks: bool, compression: str = "zstd") -> Home:
    """Run the agent-loop scenario (see the module docstring) on the scripted model in `home`."""
    model = ScriptedModelClient.from_dict(AGENT_SCRIPT)
    config = _config(home, compression=compression, log_chunks=log_chunks)
    async with Runtime.open(config, model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        parent = await rt.create_agent(cwd="/srv/interop")
        await parent.turn_result(await parent.send("Start the work."))
        await rt.settle(GUARD_S)
        await parent.turn_result(await parent.send("Ask the background helper again."))
        await rt.settle(GUARD_S)
        # A subagent that starts from the parent's conversation (the `fork` provider).
        spec = ContinuableSpec(parent=parent, prompt="Go on from here.", label="Forked helper", provider="fork")
        await rt.subagents.start_continuable(spec)
        await rt.settle(GUARD_S)
        # A plain fork of the parent's log, and one more turn on it.
        fork = rt.sessions.fork(parent.session, child_id="fork-of-main")
        forked = rt.start_agent(fork)
        await forked.turn_result(await forked.send("Carry on in the fork."))
        # A turn cancelled mid-answer: the streamed prefix is kept, marked interrupted.
        message_id = await parent.send("Write a long answer.")
        await asyncio.wait_for(model.wait_held(_CUT_SHORT), GUARD_S)
        parent.cancel("user")
        await parent.turn_result(message_id)
        await rt.settle(GUARD_S)
        roots = (parent.id, fork.id)
    return Home(home, roots)


def _message(role: str, message_id: str, text: str, **source: Any) -> dict[str, Any]:
    return {"id": message_id, "role": role, "content": [{"type": "text", "text": text}], "source": source}


async def library_home(home: Path, *, compression: str = "zstd") -> Home:
    """Sessions written through the library API: turns with every message kind, titles, children of each
    mode, an unseeded child without a label, a fork with a cut, escaped ids and a nested cwd."""
    async with Runtime.open(_config(home, compression=compression), clock=StepClock()) as rt:
        parent = rt.sessions.create("lib-parent", header=HeaderInit(cwd="/srv/a b/é", agent_preset="coder"))
        parent.append("turn/start", {"turn": 1})
        parent.append("user/message", _message("user", "u1", "List the files.", kind="user"))
        parent.append("step/start", {"turn": 1, "step": 1})
        parent.append("request/context", {"provider": "scripted", "model": "m", "contextWindow": 1000})
        call = {"type": "tool-call", "id": "call-1", "name": "ls", "arguments": '{"path":"."}'}
        assistant = _message("assistant", "a1", "Looking.", kind="model", provider="scripted", model="m")
        assistant["content"].append(call)
        usage = {"inputTokens": 3, "outputTokens": 2, "cacheReadTokens": 5}
        parent.append("assistant/message", {"turn": 1, "step": 1, "message": assistant, "usage": usage})
        parent.append(
            "tool/call", {"turn": 1, "step": 1, "callId": "call-1", "name": "ls", "arguments": '{"path":"."}'}
        )
        block = {"type": "tool-result", "toolCallId": "call-1", "content": [{"type": "text", "text": "a b"}]}
        result = {"id": "r1", "role": "user", "content": [block], "source": {"kind": "tool", "callId": "call-1"}}
        parent.append("tool/result", {"turn": 1, "step": 1, "message": result})
        parent.append("step/end", {"turn": 1, "step": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        parent.append("session/title", {"title": "Files 📁", "messageSeqs": [1], "source": {"kind": "user"}})
        children = [
            ("lib-child/one", snapshot_descriptor("one-shot", provider="spawn", label="one shot")),
            ("lib-child~two", snapshot_descriptor("continuable", provider="spawn", label="keeps going")),
            ("lib-child-three", snapshot_descriptor("one-shot", provider="spawn")),
        ]
        for index, (child_id, descriptor) in enumerate(children):
            child = rt.sessions.create(
                child_id,
                header=HeaderInit(
                    cwd=parent.header.cwd, parent_session=parent.id, origin="subagent", delegation_depth=1
                ),
            )
            child.append("turn/start", {"turn": 1})
            child.append("subagent/descriptor", descriptor)
            child.append("user/message", _message("user", f"cu{index}", "Do it.", kind="coordinator"))
            child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        fork = rt.sessions.fork(parent, boundary=parent.events[8].seq, child_id="lib-fork")
        fork.append("turn/start", {"turn": 2})
        fork.append("turn/end", {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
        lone = rt.sessions.create("lib-lone")
        lone.append("session/title", {"title": "empty", "messageSeqs": [], "source": {"kind": "user"}})
        for session in rt.sessions.list():
            await rt.sessions.flush(session)
    return Home(home, ("lib-parent", "lib-fork", "lib-lone"))


async def resume_in_pydsh(home: Path, session_id: str, prompt: str) -> str:
    """Resume a stored top-level session as a pydsh agent, run one turn on it, return the answer."""
    model = ScriptedModelClient.from_dict(
        {"version": 1, "model": "scripted-interop", "agents": {"main": {"steps": [{"text": "RESUMED_OK"}]}}}
    )
    async with Runtime.open(_config(home), model=model, ids=SequentialIds(), clock=StepClock()) as rt:
        result = await rt.run(prompt, session_id)
        return result.output
