"""Start-up of a one-step `dsh run` on the local OpenAI-compatible test server, against `import openai`.

Four commands, each a fresh process, timed from spawn to exit (wall clock) and interleaved in
rotated rounds so drift and warm caches spread evenly over them:

* `baseline`: `python -c "import openai"`, the model SDK any OpenAI-compatible client pays for before
  it sends a byte (the baseline the target is set against, issue 30);
* `dsh run`: the `dsh` entry point of this environment running one prompt (`dsh --home H run hi
  --workspace W`) against `dsh.testing.fake_openai`, served by this process on 127.0.0.1: a new
  session on the default store (JSONL), one model request streamed in three chunks, the answer
  printed, the session flushed and closed. The output is checked;
* `dsh run --json`: the same with JSON lines (reported beside it);
* `python`: `python -c pass`, the bare interpreter, for scale.

The target is median over rounds of time(`dsh run`) / time(`baseline`) <= 1.5. The children's CPU time
(user + system) is reported next to it; the server's work is this process's, so it is in neither.

Every command runs from compiled bytecode, as an installed package does after its first run (the
subprocesses get `PYTHONPYCACHEPREFIX` set to a folder of this run, `PYTHONDONTWRITEBYTECODE` removed,
and each command runs twice before the rounds). `DSH_*` variables are removed, then the model
settings point at the fake server. Run: `python -m bench run_startup`.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import QUICK, info, print_table, rotated, spread, target, write_json

ROUNDS = 5 if QUICK else 21
WARMUPS = 2
TARGET = 1.5
BASELINE_IMPORTS = "import openai"
ANSWER = "The run path is short."


def _dsh_command() -> list[str]:
    """The `dsh` entry point installed next to this interpreter (or the same call through `-c`)."""
    script = Path(sys.executable).with_name("dsh")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from dsh.cli.main import main; main()"]


def _environment(pycache: Path, base_url: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DSH_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.update({"DSH_MODEL_BASE_URL": base_url, "DSH_MODEL_API_KEY": "sk-bench-0123456789", "DSH_MODEL": "fake"})
    return env


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, child CPU seconds (user + system) and stdout of one run; a failing run raises."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False, cwd=cwd)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv!r} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout.decode(errors="replace")


def _measure(folder: Path) -> dict[str, Any]:
    from dsh.testing.fake_openai import FakeOpenAIServer, FakeReply

    home, workspace = folder / "home", folder / "work"
    workspace.mkdir()
    runs_of_dsh = 2 * (WARMUPS + ROUNDS + 1)
    with FakeOpenAIServer() as server:
        server.enqueue(*(FakeReply(text=ANSWER, chunks=3) for _ in range(runs_of_dsh)))
        env = _environment(folder / "pycache", server.base_url)
        run = [*_dsh_command(), "--home", str(home), "run", "hi", "--workspace", str(workspace)]
        commands = {
            "baseline": [sys.executable, "-c", BASELINE_IMPORTS],
            "dsh run": run,
            "dsh run --json": [*run, "--json"],
            "python": [sys.executable, "-c", "pass"],
        }
        for _ in range(WARMUPS):
            for argv in commands.values():
                _timed(argv, env, folder)
        _, _, shown = _timed(commands["dsh run"], env, folder)
        if shown.strip() != ANSWER:
            raise RuntimeError(f"dsh run printed {shown!r}, expected {ANSWER!r}")
        wall: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for round_ in range(ROUNDS):
            for name in rotated(list(commands), round_, ROUNDS):
                seconds, used, _ = _timed(commands[name], env, folder)
                wall[name].append(seconds)
                cpu[name].append(used)
    return {"wall": wall, "cpu": cpu}


def _ratios(values: dict[str, list[float]], name: str, base: str) -> list[float]:
    """Per-round ratios of `name` to `base` (both measured in the same round)."""
    return [run / ref for run, ref in zip(values[name], values[base], strict=True)]


def main() -> None:
    """Run the rounds, print the table and write `bench/results/run_startup.json`."""
    with tempfile.TemporaryDirectory(prefix="dsh-bench-run-startup-") as folder:
        result = _measure(Path(folder))
    wall, cpu = result["wall"], result["cpu"]
    ratios = _ratios(wall, "dsh run", "baseline")
    cpu_ratios = _ratios(cpu, "dsh run", "baseline")
    json_ratios = _ratios(wall, "dsh run --json", "baseline")
    ratio = statistics.median(ratios)
    ms = {name: statistics.median(values) * 1e3 for name, values in wall.items()}
    cpu_ms = {name: statistics.median(values) * 1e3 for name, values in cpu.items()}
    rows = [[round_ + 1, *(wall[name][round_] * 1e3 for name in wall), ratios[round_]] for round_ in range(len(ratios))]
    print_table(
        f"one-step dsh run, wall ms per fresh process ({ROUNDS} rotated rounds)", ["round", *wall, "run/baseline"], rows
    )
    print_table("medians", ["command", "wall ms", "cpu ms"], [[name, ms[name], cpu_ms[name]] for name in wall])
    row = target(
        "run",
        f"one-step `dsh run` on the fake OpenAI-compatible server / `python -c '{BASELINE_IMPORTS}'`, wall per process",
        ratio,
        TARGET,
        higher_is_better=False,
        spread_=spread(ratios),
    )
    print(f"\nmedian ratio dsh run / import openai: {ratio:.3g} (target <= {TARGET}): {row['verdict']}")
    print(f"median CPU ratio: {statistics.median(cpu_ratios):.3g}; --json: {statistics.median(json_ratios):.3g}")
    write_json(
        "run_startup",
        {
            "rounds": ROUNDS,
            "baseline": BASELINE_IMPORTS,
            "wall_ms": {name: [value * 1e3 for value in values] for name, values in wall.items()},
            "cpu_ms": {name: [value * 1e3 for value in values] for name, values in cpu.items()},
            "ratios": ratios,
            "cpu_ratios": cpu_ratios,
            "json_ratios": json_ratios,
            "median_ratio": ratio,
            "target": TARGET,
            "verdict": row["verdict"],
            "targets": [
                row,
                info(
                    "run-cpu",
                    "the same ratio in child CPU time (user + system)",
                    statistics.median(cpu_ratios),
                    unit="x",
                ),
                info("run-json", "`dsh run --json` / the baseline, wall", statistics.median(json_ratios), unit="x"),
                info("run-ms", "one-step `dsh run`, wall time per process", ms["dsh run"], unit=" ms"),
                info("baseline-ms", "`python -c 'import openai'`, wall time per process", ms["baseline"], unit=" ms"),
                info("python-ms", "`python -c pass`, wall time per process", ms["python"], unit=" ms"),
            ],
        },
    )


if __name__ == "__main__":
    main()
