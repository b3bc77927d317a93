"""P5 — cold read throughput and memory: a 100,000-event JSONL+zstd log against the machine limit.

The limit, measured in the same run, is what no reader can beat: zstd-decompress every frame and
`orjson.loads` every line, nothing else (the faster of two decoding strategies, keeping nothing).
Ours is a full observation through the coordinator: stable read, revision, scan, validation of every
record, closers. Variants, interleaved in rotated rounds, each ratio taken inside its round:

* `lazy`: the observation alone (events are frozen when touched; nobody touches them);
* `full`: the observation, then every event touched (`event.data` of each, which hands out every
  event deeply immutable) — what a consumer that reads them all pays;
* `deep` (reported only): the observation, then every value of every event reached.

Memory, each variant in a fresh child process under `tracemalloc`: what holding the parsed records
takes (every line `orjson.loads`-ed into one list, the decompressed text released), against the peak
of a full read with every event touched and still held. Targets: full >= 0.5 and lazy >= 0.5 of the
limit's throughput (median of the per-round ratios); full-read peak <= 2x the parsed records. Run:
`python -m bench.p5_cold_read`.

The run starts from a collected heap and leaves `gc.freeze()` alone: a process that keeps frozen
objects of its own makes the read path skip its collector shortcut (docs/architecture.md#read-path).
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import zstandard

from bench.common import QUICK, info, later, print_table, rotated, spread, target, write_json
from bench.p6_append import _turn_events

EVENTS = 20_000 if QUICK else 100_000
SESSION_ID = "p5-session"
ROUNDS = 3 if QUICK else 9
TARGET_SPEED = 0.5
TARGET_MEMORY = 2.0
_ROOT = Path(__file__).resolve().parents[1]


def _records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    turn = 0
    while len(out) < EVENTS:
        turn += 1
        for kind, data in _turn_events(turn):
            out.append({"type": kind, "seq": len(out), "time": 1_789_000_000_000 + len(out), "data": data})
            if kind in ("user/message", "assistant/message", "tool/result"):
                out[-1]["surfaceOp"] = "append"
    return out[:EVENTS] if out[EVENTS - 1]["type"] == "turn/end" else out


def _write_log(root: Path) -> Path:
    from dsh.testing.jsonl_writer import JsonlLogWriter

    records = _records()
    header = {"type": "session", "version": 0, "id": SESSION_ID, "createdAt": 1, "delegationDepth": 0}
    writer = JsonlLogWriter(root)
    batches = [20] * (len(records) // 20) + ([len(records) % 20] if len(records) % 20 else [])
    asyncio.run(writer.write(SESSION_ID, header, records, batches=batches))
    return Path(writer.path_of(SESSION_ID))


def _limit(path: Path) -> float:
    """zstd decompress + orjson.loads per line; nothing else (the faster of two decoding strategies).

    One strategy decompresses the whole stream at once, the other frame by frame (each frame's end
    found by a fresh decompressor, the rest of the input passed as a zero-copy view).
    """
    data = path.read_bytes()
    loads = orjson.loads

    start = time.perf_counter()
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    text = reader.read()
    count = 0
    for line in text.split(b"\n"):
        if line:
            loads(line)
            count += 1
    whole_stream = time.perf_counter() - start

    start = time.perf_counter()
    view = memoryview(data)
    position = 0
    decompressor = zstandard.ZstdDecompressor()
    while position < len(data):
        frame = decompressor.decompressobj()
        parts = []
        while not frame.eof:
            piece = view[position : position + 65536]
            parts.append(frame.decompress(piece))
            position += len(piece)
        position -= len(frame.unused_data)
        for line in b"".join(parts).split(b"\n"):
            if line:
                loads(line)
    per_frame = time.perf_counter() - start
    assert count >= EVENTS
    return min(whole_stream, per_frame)


def _walk(value: Any) -> int:
    """Reach every value below `value` through the public API; returns how many it reached."""
    stack = [value]
    reached = 0
    while stack:
        node = stack.pop()
        reached += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return reached


async def _ours(root: Path, touch: str) -> float:
    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.session.store import SessionStore

    store = SessionStore()
    # A fresh coordinator per measurement: its prepared-observation cache must not serve the read.
    async with PersistenceCoordinator(JsonlBackend(root), store) as persistence:
        start = time.perf_counter()
        observation = await persistence.inspect(SESSION_ID)
        if touch == "full":
            for event in observation.events:
                _ = event.data
        elif touch == "deep":
            for event in observation.events:
                _walk(event)
        elapsed = time.perf_counter() - start
        assert len(observation.events) >= EVENTS
    return elapsed


def _variant(name: str, root: Path, path: Path) -> float:
    if name == "limit":
        return _limit(path)
    return asyncio.run(_ours(root, name))


def memory_child(variant: str, root: str) -> None:
    """Child process entry: print the `tracemalloc` figures (bytes) of one variant as JSON.

    `parsed` holds every event line `orjson.loads`-ed into one list (the reference: its `current`
    after the decompressed text is released); `full` and `lazy` hold the observation of a cold read,
    `full` with every event touched.
    """
    import tracemalloc

    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.session.store import SessionStore

    async def read() -> Any:
        async with PersistenceCoordinator(JsonlBackend(Path(root)), SessionStore()) as persistence:
            observation = await persistence.inspect(SESSION_ID)
            if variant == "full":
                for event in observation.events:
                    _ = event.data
            return observation

    path = next(Path(root).rglob("session.jsonl.zstd"))
    data = path.read_bytes()
    held: Any = None
    tracemalloc.start()
    if variant == "parsed":
        text = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
        lines = text.split(b"\n")[1:]
        del text
        held = [orjson.loads(line) for line in lines if line]
        del lines
    else:
        held = asyncio.run(read())
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(json.dumps({"variant": variant, "current": current, "peak": peak, "held": held is not None}))


def _memory(root: Path) -> dict[str, dict[str, int]]:
    figures: dict[str, dict[str, int]] = {}
    for variant in ("parsed", "full", "lazy"):
        code = f"from bench.p5_cold_read import memory_child; memory_child({variant!r}, {str(root)!r})"
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True, check=True, timeout=600
        )
        figures[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    """Build the log, measure the limit and the variants in rotated rounds, measure memory, print ratios."""
    tmp = Path(tempfile.mkdtemp(prefix="dsh-p5-"))
    try:
        path = _write_log(tmp)
        size_mb = path.stat().st_size / 1e6
        # Measure every variant on a collected heap: the generator's records are gone.
        gc.collect()
        names = ["limit", "lazy", "full", "deep"]
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(ROUNDS):
            for name in rotated(names, round_, ROUNDS):
                gc.collect()
                seconds[name].append(_variant(name, tmp, path))
        memory = _memory(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = {
        name: spread([limit / took for limit, took in zip(seconds["limit"], seconds[name], strict=True)])
        for name in names
    }
    best = {name: min(values) for name, values in seconds.items()}
    rows = [
        [f"{name}", best[name], EVENTS / best[name], ratios[name]["median"], ratios[name]["min"], ratios[name]["max"]]
        for name in names
    ]
    print_table(
        f"P5 cold read of a {EVENTS:,}-event JSONL+zstd log ({size_mb:.1f} MB), {ROUNDS} rotated rounds",
        ["variant", "best s", "events/s", "x limit (median)", "min", "max"],
        rows,
    )
    # The reference is what holding the parsed records costs (the list alone, text released).
    reference = memory["parsed"]["current"]
    memory_ratio = memory["full"]["peak"] / reference
    print_table(
        "Traced memory (tracemalloc, a fresh child process each; x = peak / the parsed records held)",
        ["variant", "peak MB", "held MB", "x parsed records"],
        [[name, row["peak"] / 1e6, row["current"] / 1e6, row["peak"] / reference] for name, row in memory.items()],
    )
    targets = [
        target(
            "P5",
            f"full cold read of a {EVENTS:,}-event JSONL+zstd log, every event touched, share of the machine limit",
            ratios["full"]["median"],
            TARGET_SPEED,
            higher_is_better=True,
            spread_=ratios["full"],
        ),
        target(
            "P5",
            "the same observation, events left untouched (lazy read), share of the machine limit",
            ratios["lazy"]["median"],
            TARGET_SPEED,
            higher_is_better=True,
            spread_=ratios["lazy"],
        ),
        target(
            "P5",
            "peak memory of the full read (every event touched and held) / holding the parsed records",
            memory_ratio,
            TARGET_MEMORY,
            higher_is_better=False,
        ),
        info(
            "P5",
            "every value of every event reached (deep walk), share of the machine limit",
            ratios["deep"]["median"],
            unit="x",
        ),
        info(
            "P5",
            "peak memory of the lazy read / holding the parsed records",
            memory["lazy"]["peak"] / reference,
            unit="x",
        ),
        later("P4", "typed read push-down: a descriptor-only cold fold >= 4x faster than a full parse"),
    ]
    for row in targets[:5]:
        print(f"  {row['what']}: {row['measured']:.2f} (target {row['target'] or '-'}) {row['verdict']}")
    write_json(
        "p5_cold_read",
        {
            "events": EVENTS,
            "log_mb": size_mb,
            "rounds": ROUNDS,
            "seconds": seconds,
            "ratios": ratios,
            "memory_bytes": memory,
            "memory_ratio": memory_ratio,
            "targets": targets,
        },
    )


if __name__ == "__main__":
    main()
