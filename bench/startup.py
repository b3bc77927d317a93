"""Start-up: `dsh agents` on a small home against importing the libraries it stands on.

Six commands, each a fresh process, timed from spawn to exit (wall clock) and interleaved in
rotated rounds so drift and warm caches spread evenly over them:

* `baseline`: `python -c "import orjson, zstandard"`, the compiled libraries any reader of the
  store pays for before it reads a byte (the baseline the target is set against);
* `cli baseline`: `python -c "import typer, rich, pydantic_settings, orjson, zstandard"`, what any
  CLI built on the libraries the CLI uses pays before it does anything (the earlier baseline,
  reported beside it);
* `dsh agents`: the `dsh` entry point of this environment listing a stored parent's children
  (`dsh --home H agents parent`) on a home built once through the writers: a parent with a turn and
  three continuable children, JSONL (the default store) and the projection cache;
* `agents --json`: the same listing printed as JSON (reported beside the table; off a terminal
  neither loads rich, docs/cli.md#tables-at-80-columns);
* `import dsh`: `python -c "import dsh"`;
* `python`: `python -c pass`, the bare interpreter, for scale.

The target is median over rounds of time(`dsh agents`) / time(`baseline`) <= 1.5; the ratio to the
CLI baseline is reported beside it (its earlier target was 1.3). The children's CPU time (user +
system) is reported next to them: on a busy machine it moves less than wall time.

Every command runs from compiled bytecode, as an installed package does after its first run: the
subprocesses get `PYTHONPYCACHEPREFIX` set to a folder of this run (so no `__pycache__` lands in the
tree) with `PYTHONDONTWRITEBYTECODE` removed, and each command runs twice before the rounds to fill
it. `DSH_*` variables are removed so the default store is used. Run: `python -m bench startup`.
"""

from __future__ import annotations

import asyncio
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
CHILDREN = 3
TARGET = 1.5
CLI_TARGET = 1.3
PARENT = "bench-parent"
BASELINE_IMPORTS = "import orjson, zstandard"
CLI_BASELINE_IMPORTS = "import typer, rich, pydantic_settings, orjson, zstandard"


async def _build_home(home: Path) -> None:
    """A parent with one turn and three continuable children, written by the default stack."""
    from dsh.config import Config
    from dsh.runtime import Runtime
    from dsh.session.header import HeaderInit
    from dsh.subagent.descriptor import snapshot_descriptor

    async with Runtime.open(Config(home=home)) as rt:
        store = rt.sessions
        parent = store.create(PARENT)
        parent.append("turn/start", {"turn": 1})
        parent.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        await store.flush(parent)
        for index in range(CHILDREN):
            descriptor = snapshot_descriptor("continuable", provider="spawn", label=f"child {index}")
            record = {"type": "subagent/descriptor", "seq": 0, "time": store.clock(), "data": descriptor}
            child = store.create(
                f"bench-child-{index}",
                header=HeaderInit(parent_session=PARENT, origin="subagent", delegation_depth=1),
                seed=[record],
                inherited_event_count=0,
            )
            child.append("turn/start", {"turn": 1})
            child.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
            await store.flush(child)
            store.dispose(child)  # the cache writes the child's checkpoint here


def _dsh_command() -> list[str]:
    """The `dsh` entry point installed next to this interpreter (or the same call through `-c`)."""
    script = Path(sys.executable).with_name("dsh")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from dsh.cli.main import main; main()"]


def _environment(pycache: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("DSH_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, child CPU seconds (user + system) and stdout of one run; a failing run raises."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv!r} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout.decode(errors="replace")


def _measure(home: Path, pycache: Path) -> dict[str, Any]:
    env = _environment(pycache)
    commands = {
        "baseline": [sys.executable, "-c", BASELINE_IMPORTS],
        "cli baseline": [sys.executable, "-c", CLI_BASELINE_IMPORTS],
        "dsh agents": [*_dsh_command(), "--home", str(home), "agents", PARENT],
        "agents --json": [*_dsh_command(), "--home", str(home), "agents", PARENT, "--json"],
        "import dsh": [sys.executable, "-c", "import dsh"],
        "python": [sys.executable, "-c", "pass"],
    }
    for _ in range(WARMUPS):
        for argv in commands.values():
            _timed(argv, env)
    _, _, listing = _timed(commands["dsh agents"], env)
    missing = [f"bench-child-{index}" for index in range(CHILDREN) if f"bench-child-{index}" not in listing]
    if missing:
        raise RuntimeError(f"dsh agents did not list {missing}:\n{listing}")
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(ROUNDS):
        for name in rotated(list(commands), round_, ROUNDS):
            seconds, used, _ = _timed(commands[name], env)
            wall[name].append(seconds)
            cpu[name].append(used)
    return {"wall": wall, "cpu": cpu}


def _ratios(values: dict[str, list[float]], name: str, base: str) -> list[float]:
    """Per-round ratios of `name` to `base` (both measured in the same round)."""
    return [run / ref for run, ref in zip(values[name], values[base], strict=True)]


def main() -> None:
    """Run the rounds, print the table and write `bench/results/startup.json`."""
    with tempfile.TemporaryDirectory(prefix="dsh-bench-startup-") as folder:
        home = Path(folder) / "home"
        asyncio.run(_build_home(home))
        result = _measure(home, Path(folder) / "pycache")
    wall, cpu = result["wall"], result["cpu"]
    ratios = _ratios(wall, "dsh agents", "baseline")
    cpu_ratios = _ratios(cpu, "dsh agents", "baseline")
    cli_ratios = _ratios(wall, "dsh agents", "cli baseline")
    cli_cpu_ratios = _ratios(cpu, "dsh agents", "cli baseline")
    json_ratios = _ratios(wall, "agents --json", "baseline")
    ratio = statistics.median(ratios)
    cli_ratio = statistics.median(cli_ratios)
    ms = {name: statistics.median(values) * 1e3 for name, values in wall.items()}
    cpu_ms = {name: statistics.median(values) * 1e3 for name, values in cpu.items()}
    rows = [
        [round_ + 1, *(wall[name][round_] * 1e3 for name in wall), ratios[round_], cli_ratios[round_]]
        for round_ in range(len(ratios))
    ]
    print_table(
        f"start-up, wall ms per fresh process ({ROUNDS} rotated rounds; a parent with {CHILDREN} children)",
        ["round", *wall, "agents/baseline", "agents/cli baseline"],
        rows,
    )
    print_table(
        "medians",
        ["command", "wall ms", "cpu ms"],
        [[name, ms[name], cpu_ms[name]] for name in wall],
    )
    row = target(
        "agents",
        f"`dsh agents` on a small home (a parent, {CHILDREN} children, JSONL) / "
        f"`python -c '{BASELINE_IMPORTS}'`, wall time per process",
        ratio,
        TARGET,
        higher_is_better=False,
        spread_=spread(ratios),
    )
    print(f"\nmedian ratio dsh agents / baseline: {ratio:.3g} (target <= {TARGET}): {row['verdict']}")
    print(f"median ratio dsh agents / cli baseline: {cli_ratio:.3g} (earlier target <= {CLI_TARGET})")
    print(
        f"median CPU ratios: {statistics.median(cpu_ratios):.3g} / {statistics.median(cli_cpu_ratios):.3g}; "
        f"import dsh: {ms['import dsh']:.1f} ms wall"
    )
    write_json(
        "startup",
        {
            "rounds": ROUNDS,
            "children": CHILDREN,
            "baseline": BASELINE_IMPORTS,
            "cli_baseline": CLI_BASELINE_IMPORTS,
            "wall_ms": {name: [value * 1e3 for value in values] for name, values in wall.items()},
            "cpu_ms": {name: [value * 1e3 for value in values] for name, values in cpu.items()},
            "ratios": ratios,
            "cpu_ratios": cpu_ratios,
            "cli_ratios": cli_ratios,
            "json_ratios": json_ratios,
            "median_ratio": ratio,
            "median_cli_ratio": cli_ratio,
            "target": TARGET,
            "verdict": row["verdict"],
            "targets": [
                row,
                info(
                    "agents-cpu",
                    "the same ratio in child CPU time (user + system)",
                    statistics.median(cpu_ratios),
                    unit="x",
                ),
                info(
                    "agents-cli",
                    f"`dsh agents` / `python -c '{CLI_BASELINE_IMPORTS}'`, wall (earlier target <= {CLI_TARGET:g}x)",
                    cli_ratio,
                    unit="x",
                ),
                info(
                    "agents-cli-cpu",
                    "the same ratio in child CPU time (user + system)",
                    statistics.median(cli_cpu_ratios),
                    unit="x",
                ),
                info(
                    "agents-json",
                    "`dsh agents --json` (JSON instead of the table) / the baseline, wall",
                    statistics.median(json_ratios),
                    unit="x",
                ),
                info("import-dsh", "`python -c 'import dsh'`, wall time per process", ms["import dsh"], unit=" ms"),
                info(
                    "import-dsh-own",
                    "`import dsh` minus the bare interpreter (`python -c pass`), wall",
                    ms["import dsh"] - ms["python"],
                    unit=" ms",
                ),
                info("baseline", "the baseline imports, wall time per process", ms["baseline"], unit=" ms"),
                info("cli-baseline", "the CLI baseline imports, wall time per process", ms["cli baseline"], unit=" ms"),
                info("agents-ms", "`dsh agents`, wall time per process", ms["dsh agents"], unit=" ms"),
            ],
        },
    )


if __name__ == "__main__":
    main()
