"""Agent loop overhead: the loop's own cost per step, as a ratio to the bare scripted model stream.

The scripted model costs almost nothing, so what a step costs beyond streaming it is the loop's own
work: building the request from the surface, assembling the message, appending and validating the
events, driving the projection registry, and the two flushes per step through the persistence
coordinator. Variants, interleaved in rotated rounds so warm-up and noise spread evenly:

* `bare stream`: `ScriptedModelClient.stream()` consumed directly (the floor);
* `loop, memory`: one agent turn per step on the memory backend (the loop without disk);
* `loop, jsonl`: the same on the default JSONL+zstd backend (real fsyncs at the flush points).

Inside the loop variants the model client is wrapped so the time spent waiting for its next chunk is
measured; the loop's own cost per step is the step's total time minus that model time. Reported,
median over rounds: microseconds per step, the model's share, the loop's own microseconds, and the
loop's own cost as a ratio to the bare stream (`own / bare`), which is the headline figure. Run:
`python -m bench agent_loop` (`DSH_BENCH_QUICK=1` for a short run).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
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


class _TimedModel:
    """Wraps a model client and adds up the time spent waiting for its chunks."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.model = inner.model
        self.seconds = 0.0

    async def stream(self, request: Any, *, signal: Any) -> AsyncIterator[Any]:
        chunks = self.inner.stream(request, signal=signal).__aiter__()
        while True:
            started = time.perf_counter()
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                self.seconds += time.perf_counter() - started
                return
            self.seconds += time.perf_counter() - started
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _loop(steps: int, database_url: str | None) -> tuple[float, float]:
    """Run `steps` one-step turns; returns (total seconds, seconds spent in the model)."""
    from dsh.agent.ids import SequentialIds
    from dsh.config import Config
    from dsh.runtime import Runtime

    model = _TimedModel(_script(steps))
    with tempfile.TemporaryDirectory() as home:
        values: dict[str, Any] = {"home": Path(home)}
        if database_url is not None:
            values["database_url"] = database_url
        async with Runtime.open(Config(**values), model=model, ids=SequentialIds()) as rt:
            agent = await rt.create_agent()
            start = time.perf_counter()
            for _ in range(steps):
                await agent.turn_result(await agent.send("go"))
            return time.perf_counter() - start, model.seconds


async def _bare_variant(steps: int) -> tuple[float, float]:
    seconds = await _bare(steps)
    return seconds, seconds


VARIANTS = {
    "bare stream": lambda: _bare_variant(STEPS),
    "loop, memory": lambda: _loop(STEPS, "memory:"),
    "loop, jsonl": lambda: _loop(STEPS, None),
}


async def _measure() -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per variant and round: µs per step in total, and µs per step spent in the model."""
    names = list(VARIANTS)
    total: dict[str, list[float]] = {name: [] for name in names}
    in_model: dict[str, list[float]] = {name: [] for name in names}
    await VARIANTS["loop, memory"]()  # warm imports and caches once, outside the rounds
    for round_ in range(ROUNDS):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            seconds, model_seconds = await VARIANTS[name]()
            total[name].append(seconds / STEPS * 1e6)
            in_model[name].append(model_seconds / STEPS * 1e6)
    return total, in_model


def main() -> None:
    """Run the rounds, print the table and write `bench/results/agent_loop.json`."""
    total, in_model = asyncio.run(_measure())
    floor = statistics.median(total["bare stream"])
    own: dict[str, float] = {}
    rows: list[list[Any]] = [["bare stream", floor, statistics.median(in_model["bare stream"]), "—", "—"]]
    for name in total:
        if name == "bare stream":
            continue
        own[name] = statistics.median([t - m for t, m in zip(total[name], in_model[name], strict=True)])
        rows.append(
            [name, statistics.median(total[name]), statistics.median(in_model[name]), own[name], own[name] / floor]
        )
    print_table(
        f"Agent loop cost per step ({STEPS} one-step turns, median of {ROUNDS} rotated rounds)",
        ["variant", "µs/step", "in model µs", "loop's own µs", "own / bare"],
        rows,
    )
    print(
        "\nown / bare: the loop's own cost per step (time not spent in the model) divided by the cost of "
        "the bare scripted stream."
    )
    write_json(
        "agent_loop",
        {
            "steps": STEPS,
            "rounds": ROUNDS,
            "us_per_step": {name: statistics.median(values) for name, values in total.items()},
            "model_us_per_step": {name: statistics.median(values) for name, values in in_model.items()},
            "own_us_per_step": own,
            "own_ratio_to_bare": {name: value / floor for name, value in own.items()},
            "samples_us_per_step": total,
            "samples_model_us_per_step": in_model,
            "targets": [
                info(
                    "loop",
                    f"{name}: the loop's own cost per step (time not in the model) / the bare scripted stream "
                    f"(median of {ROUNDS} rounds)",
                    value / floor,
                    unit="x",
                )
                for name, value in own.items()
            ],
        },
    )


if __name__ == "__main__":
    main()
