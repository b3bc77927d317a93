"""Child process of the subagent crash test: a parent starts a continuable child and is killed mid-turn.

Run as `python crash_subagent_child.py <home>`. It opens a `Runtime` on the JSONL home with a
scripted model, runs one parent turn, starts a continuable child whose answer holds on a gate that is
never released, and once the child's stream reached the hold (so the loop's flush before the model
request made the child's open turn durable) prints `READY <parent id> <child id>` and waits to be
killed. The program imports nothing from the `tests` package, so it runs by path with only `dsh`.
"""

from __future__ import annotations

import asyncio
import os
import sys

from dsh import Config, Runtime
from dsh.agent.ids import SequentialIds
from dsh.agent.models import ScriptedModelClient
from dsh.subagent.providers import ContinuableSpec

LABEL = "crash helper"

SCRIPT = {
    "version": 1,
    "model": "scripted-test",
    "agents": {
        "main": {"steps": [{"text": "PARENT_READY"}]},
        LABEL: {"steps": [{"hold": "never", "text": "NEVER_FINISHED"}]},
    },
}


async def main(home: str) -> int:
    client = ScriptedModelClient.from_dict(SCRIPT)
    async with Runtime.open(Config(home=home), model=client, ids=SequentialIds()) as rt:
        result = await rt.run("hello")
        parent = rt.agents.get(result.session_id)
        assert parent is not None
        started = await rt.subagents.start_continuable(
            ContinuableSpec(parent=parent, prompt="a long task", label=LABEL)
        )
        await client.wait_held("never")
        os.write(1, f"READY {parent.id} {started.child_id}\n".encode())
        await asyncio.Event().wait()  # until SIGKILL
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1])))
