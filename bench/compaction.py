"""Compaction's cost on the turn path: the estimate every request pays, as a ratio to a loop without it.

Before each request the loop estimates the prompt (compact JSON bytes of the system prompt, tools and
messages over a calibrated bytes-per-token ratio) when the model has a known context window. Variants,
on the memory backend, interleaved in rotated rounds:

* `no window`: the model has no configured window, so the check stops at once (the floor);
* `window, no pressure`: a 128K window that is never crossed: every request pays the estimate;
* `small window`: a window a few turns fill, so the loop also prunes and summarises regularly.

The conversation grows by one 2,000-character tool result per turn, like an agent reading files.
Reported, median over rounds: microseconds per turn and the ratio to `no window`. Run:
`python -m bench compaction` (`DSH_BENCH_QUICK=1` for a short run).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import QUICK, info, print_table, write_json

TURNS = 40 if QUICK else 150
ROUNDS = 2 if QUICK else 5
MODEL = "bench-model"


def _script(turns: int) -> Any:
    from dsh.agent.models import ScriptedModelClient

    steps: list[dict[str, Any]] = []
    for n in range(turns):
        steps.append(
            {
                "toolCalls": [{"name": "fetch", "arguments": {"n": n}}],
                "usage": {"inputTokens": 500 * (n + 1), "outputTokens": 5},
            }
        )
        steps.append({"text": f"done {n}"})
    data = {
        "version": 1,
        "model": MODEL,
        "agents": {"main": {"steps": steps}, "compaction": {"on": [{"text": "## Goal\n- records"}]}},
    }
    return ScriptedModelClient.from_dict(data)


async def _run(window: int | None) -> float:
    """Seconds for TURNS two-step turns with one long tool result each."""
    from dsh.agent.function_tool import tool
    from dsh.config import Config
    from dsh.runtime import Runtime

    @tool
    def fetch(n: int) -> str:
        """Fetch record n."""
        return f"record {n}: " + "x" * 2000

    compaction: dict[str, Any] = {"context_windows": {MODEL: window}} if window is not None else {}
    with tempfile.TemporaryDirectory() as home:
        config = Config(home=Path(home), database_url="memory:", agent={"time_context": False}, compaction=compaction)
        async with Runtime.open(config, model=_script(TURNS), tools=[fetch]) as rt:
            agent = await rt.create_agent()
            start = time.perf_counter()
            for n in range(TURNS):
                await agent.turn_result(await agent.send(f"Fetch record {n}."))
            return time.perf_counter() - start


VARIANTS = {"no window": None, "window, no pressure": 131_072, "small window": 8_000}


async def _measure() -> dict[str, list[float]]:
    names = list(VARIANTS)
    out: dict[str, list[float]] = {name: [] for name in names}
    await _run(None)  # warm imports once, outside the rounds
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            out[name].append(await _run(VARIANTS[name]) / TURNS * 1e6)
    return out


def main() -> None:
    """Run the rounds, print the table and write `bench/results/compaction.json`."""
    samples = asyncio.run(_measure())
    floor = statistics.median(samples["no window"])
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print_table(
        f"Compaction check per turn ({TURNS} turns of a tool call and an answer, median of {ROUNDS} rounds)",
        ["variant", "µs/turn", "ratio to no window"],
        [[name, value, value / floor] for name, value in medians.items()],
    )
    write_json(
        "compaction",
        {
            "turns": TURNS,
            "rounds": ROUNDS,
            "us_per_turn": medians,
            "samples_us_per_turn": samples,
            "targets": [
                info(
                    "compaction",
                    f"{name}: µs per turn / no window (median of {ROUNDS} rounds)",
                    value / floor,
                    unit="x",
                )
                for name, value in medians.items()
                if name != "no window"
            ],
        },
    )


if __name__ == "__main__":
    main()
