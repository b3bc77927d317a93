"""Agent loop overhead: the loop's own cost per step, as a ratio to the bare scripted model stream.

The scripted model costs almost nothing, so what a step costs beyond streaming it is the loop's own
work: building the request from the surface, assembling the message, appending and validating the
events, driving the projection registry, and the two flushes per step through the persistence
coordinator. Variants, interleaved in rotated rounds so warm-up and noise spread evenly:

* `bare stream`: `ScriptedModelClient.stream()` consumed directly (the floor);
* `loop, memory`: one agent turn per step on the memory backend (the loop without disk);
* `loop, jsonl`: the same on the default JSONL+zstd backend (real fsyncs at the flush points).

Reported: microseconds per step and ratio to the bare stream, median over rounds. Run:
`python -m bench.agent_loop`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import QUICK, info, print_table, write_json

STEPS = 50 if QUICK else 200
ROUNDS = 2 if QUICK else 5
ANSWER = "The loop benchmark answer is long enough to arrive in several chunks. " * 3


def _script(steps: int) -> Any:
    from dsh.agent.models import ScriptedModelClient

    step = {"text": ANSWER, "chunkSize": 16}
    return ScriptedModelClient.from_dict(
        {"version": 1, "model": "bench", "agents": {"main": {"steps": [step] * steps}}}
    )


async def _bare(steps: int) -> float:
    from dsh.abort import AbortSignal
    from dsh.agent.model import ModelRequest, RequestMeta

    client = _script(steps)
    messages = [{"id": "u", "role": "user", "content": [{"type": "text", "text": "go"}], "source": {"kind": "user"}}]
    start = time.perf_counter()
    for turn in range(1, steps + 1):
        request = ModelRequest("bench", None, messages, [], RequestMeta("s", "main", turn, 1))
        async for _chunk in client.stream(request, signal=AbortSignal.none()):
            pass
    return time.perf_counter() - start


async def _loop(steps: int, database_url: str | None) -> float:
    from dsh.agent.ids import SequentialIds
    from dsh.config import Config
    from dsh.runtime import Runtime

    with tempfile.TemporaryDirectory() as home:
        values: dict[str, Any] = {"home": Path(home)}
        if database_url is not None:
            values["database_url"] = database_url
        async with Runtime.open(Config(**values), model=_script(steps), ids=SequentialIds()) as rt:
            agent = await rt.create_agent()
            start = time.perf_counter()
            for _ in range(steps):
                await agent.turn_result(await agent.send("go"))
            return time.perf_counter() - start


VARIANTS = {
    "bare stream": lambda: _bare(STEPS),
    "loop, memory": lambda: _loop(STEPS, "memory:"),
    "loop, jsonl": lambda: _loop(STEPS, None),
}


async def _measure() -> dict[str, list[float]]:
    names = list(VARIANTS)
    per_step: dict[str, list[float]] = {name: [] for name in names}
    await VARIANTS["loop, memory"]()  # warm imports and caches once, outside the rounds
    for round_ in range(ROUNDS):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            seconds = await VARIANTS[name]()
            per_step[name].append(seconds / STEPS * 1e6)
    return per_step


def main() -> None:
    """Run the rounds, print the table and write `bench/results/agent_loop.json`."""
    per_step = asyncio.run(_measure())
    floor = statistics.median(per_step["bare stream"])
    rows = []
    for name, values in per_step.items():
        median = statistics.median(values)
        rows.append([name, median, median / floor, median - floor])
    print_table(
        f"Agent loop cost per step ({STEPS} one-step turns, median of {ROUNDS} rotated rounds)",
        ["variant", "µs/step", "x bare", "loop's own µs"],
        rows,
    )
    write_json(
        "agent_loop",
        {
            "steps": STEPS,
            "rounds": ROUNDS,
            "us_per_step": {name: statistics.median(values) for name, values in per_step.items()},
            "ratio_to_bare": {name: statistics.median(values) / floor for name, values in per_step.items()},
            "samples_us_per_step": per_step,
            "targets": [
                info(
                    "loop",
                    f"{name}: cost per step / the bare scripted stream (median of {ROUNDS} rounds)",
                    statistics.median(values) / floor,
                    unit="x",
                )
                for name, values in per_step.items()
                if name != "bare stream"
            ],
        },
    )


if __name__ == "__main__":
    main()
