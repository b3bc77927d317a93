"""P5 — cold read throughput and memory: a 100,000-event JSONL+zstd log against the machine limit.

The limit, measured in the same run, is what a reader that hands out every event cannot beat:
zstd-decompress every frame and `orjson.loads` every line, keeping the parsed records (the faster of two
decoding strategies). A reader that returns every event must build them, so the limit keeps them too.
The old limit, which parses and keeps nothing, is reported beside it for reference (`nothing`).

Ours is a full observation through the coordinator: stable read, revision, scan, validation of every
record, closers. Variants, interleaved in rotated rounds, each ratio taken inside its round:

* `lazy`: the observation alone (events are frozen when touched; nobody touches them);
* `full`: the observation, then every event touched (`event.data` of each, which hands out every
  event deeply immutable) — what a consumer that reads them all pays;
* `runtime` (reported): the same full read through the public API, `Runtime.query.observe_session`;
* `deep` (reported only): the observation, then every value of every event reached.

Memory, each variant in a fresh child process under `tracemalloc`: what holding the parsed records
takes (every line `orjson.loads`-ed into one list, the decompressed text released), against the peak
of a full read with every event touched and still held. Targets: full >= 0.5 and lazy >= 0.8 of the
limit's throughput (median of the per-round ratios); full-read peak <= 2x the parsed records. Run:
`python -m bench.p5_cold_read`. Every variant runs on a collected heap with the collector on, as an
application's would be: nothing in the library or here switches it off.
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
TARGET_FULL = 0.5
TARGET_LAZY = 0.8
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


def _write_log(home: Path) -> Path:
    """The benchmark log, in the JSONL store of the home folder `home` (`home/sessions`)."""
    from dsh.testing.jsonl_writer import JsonlLogWriter

    root = home / "sessions"
    records = _records()
    header = {"type": "session", "version": 0, "id": SESSION_ID, "createdAt": 1, "delegationDepth": 0}
    writer = JsonlLogWriter(root)
    batches = [20] * (len(records) // 20) + ([len(records) % 20] if len(records) % 20 else [])
    asyncio.run(writer.write(SESSION_ID, header, records, batches=batches))
    return Path(writer.path_of(SESSION_ID))


def _frames(data: bytes) -> list[bytes]:
    """The plaintext of each zstd frame: each frame's end found by a fresh decompressor, the rest of
    the input passed as a zero-copy view."""
    texts: list[bytes] = []
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
        texts.append(b"".join(parts))
    return texts


def _limit(path: Path, *, keep: bool) -> float:
    """zstd decompress + `orjson.loads` of every line, keeping the parsed records (`keep`) or nothing.

    The faster of two decoding strategies: the whole stream at once, or frame by frame.
    """
    data = path.read_bytes()
    loads = orjson.loads
    times: list[float] = []
    for whole in (True, False):
        start = time.perf_counter()
        texts = [zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()] if whole else None
        kept: list[Any] = []
        count = 0
        for text in texts if texts is not None else _frames(data):
            lines = text.split(b"\n")
            if keep:
                kept += [loads(line) for line in lines if line]
            else:
                for line in lines:
                    if line:
                        loads(line)
                        count += 1
        times.append(time.perf_counter() - start)
        assert max(count, len(kept)) >= EVENTS
        del kept
    return min(times)


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


async def _ours(home: Path, touch: str) -> float:
    from dsh.persistence.coordinator import PersistenceCoordinator
    from dsh.persistence.jsonl import JsonlBackend
    from dsh.session.store import SessionStore

    store = SessionStore()
    # A fresh coordinator per measurement: its prepared-observation cache must not serve the read.
    async with PersistenceCoordinator(JsonlBackend(home / "sessions"), store) as persistence:
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


async def _through_runtime(home: Path) -> float:
    """A full read through the public API: a fresh `Runtime` on the home, `observe_session`, every event touched."""
    from dsh.config import Config
    from dsh.runtime import Runtime

    async with Runtime.open(Config(home=home), read_only=True) as rt:
        start = time.perf_counter()
        observation = await rt.query.observe_session(SESSION_ID)  # type: ignore[arg-type]
        for event in observation.events:
            _ = event.data
        elapsed = time.perf_counter() - start
        assert len(observation.events) >= EVENTS
    return elapsed


def _variant(name: str, home: Path, path: Path) -> float:
    if name == "limit":
        return _limit(path, keep=True)
    if name == "nothing":
        return _limit(path, keep=False)
    if name == "runtime":
        return asyncio.run(_through_runtime(home))
    return asyncio.run(_ours(home, name))


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
        async with PersistenceCoordinator(JsonlBackend(Path(root) / "sessions"), SessionStore()) as persistence:
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
        names = ["limit", "nothing", "lazy", "full", "runtime", "deep"]
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
        f"P5 cold read of a {EVENTS:,}-event JSONL+zstd log ({size_mb:.1f} MB), {ROUNDS} rotated rounds "
        "(x limit: decompress + parse, keeping the parsed records; `nothing` keeps none, the old limit)",
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
            f"full cold read of a {EVENTS:,}-event JSONL+zstd log, every event handed out deeply immutable, "
            "share of the parse-and-keep limit",
            ratios["full"]["median"],
            TARGET_FULL,
            higher_is_better=True,
            spread_=ratios["full"],
        ),
        target(
            "P5",
            "the same observation, events left untouched (lazy read), share of the parse-and-keep limit",
            ratios["lazy"]["median"],
            TARGET_LAZY,
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
            "the full read through the public API (Runtime.query.observe_session), share of the parse-and-keep limit",
            ratios["runtime"]["median"],
            unit="x",
        ),
        info(
            "P5",
            "the full read, share of the old keep-nothing limit (decompress + parse, nothing kept)",
            spread([n / f for n, f in zip(seconds["nothing"], seconds["full"], strict=True)])["median"],
            unit="x",
        ),
        info(
            "P5",
            "every value of every event reached (deep walk), share of the parse-and-keep limit",
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
    for row in targets[:7]:
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
