"""`dsh demo`: the keyless walkthrough of real scripted agents, its report, its home folder and its failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dsh.agent.models.scripted import ScriptedModelClient
from dsh.cli.main import app
from dsh.demo import scenario
from dsh.demo.scenario import CatalogView, DemoResult, run_demo
from dsh.subagent.rows import SubagentChildRow, SubagentDiagnosticRow
from tests.unprivileged import require_permission_checks, run_dsh

runner = CliRunner()


class _Recorder:
    """A reporter that keeps what the demo reports."""

    def __init__(self) -> None:
        self.phases: list[str] = []
        self.lines: list[str] = []
        self.catalogs: list[CatalogView] = []
        self.busy_labels: list[str] = []

    def phase(self, title: str) -> None:
        """Keep the heading."""
        self.phases.append(title)

    def info(self, text: str) -> None:
        """Keep the line."""
        self.lines.append(text)

    def catalog(self, view: CatalogView) -> None:
        """Keep the view."""
        self.catalogs.append(view)

    def busy(self, label: str) -> contextlib.AbstractContextManager[Any]:
        """Keep the label; no spinner."""
        self.busy_labels.append(label)
        return contextlib.nullcontext()


def _run(home: Path) -> tuple[DemoResult, _Recorder]:
    recorder = _Recorder()
    home.mkdir()
    return asyncio.run(run_demo(home, recorder)), recorder


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, _Recorder]:
    """One walkthrough, shared by the tests that only read its report."""
    return _run(tmp_path_factory.mktemp("demo") / "home")


def _row(view: CatalogView, row_id: str) -> Any:
    return next(row for row in view.rows if row.id == row_id)


def test_the_ten_phases_run_in_order(walked: tuple[DemoResult, _Recorder]) -> None:
    """The walkthrough reports ten numbered phase headings, Prepare first and Finish last."""
    _, recorder = walked
    numbers = [int(title.split(".", 1)[0]) for title in recorder.phases]
    assert numbers == list(range(1, 11))
    assert recorder.phases[0] == "1. Prepare"
    assert recorder.phases[-1] == "10. Finish"


def test_the_parent_delegates_three_helpers_through_the_agent_tool(walked: tuple[DemoResult, _Recorder]) -> None:
    """P's first turn calls `agent` three times: a foreground one-shot answered NOTES_OK, two background children."""
    result, recorder = walked
    assert list(result.children) == ["Summarize notes", "Collect sources", "Draft outline"]
    calls = [line for line in recorder.lines if line.startswith("P calls agent(")]
    assert len(calls) == 3
    assert '"run_in_background":true' not in calls[0]
    assert all('"run_in_background":true' in call for call in calls[1:])
    results = [line for line in recorder.lines if line.startswith("  -> ")]
    assert results[:3] == [
        "  -> NOTES_OK",
        f"  -> started subagent {result.children['Collect sources']}",
        f"  -> started subagent {result.children['Draft outline']}",
    ]
    assert "P says: HELPERS_STARTED" in recorder.lines


def test_settlement_notices_become_turns_answered_noted(walked: tuple[DemoResult, _Recorder]) -> None:
    """Each background helper's notice (finished, closing message) becomes a turn of P, which says NOTED."""
    result, recorder = walked
    for child, closing in (
        (result.children["Collect sources"], "SOURCES_OK"),
        (result.children["Draft outline"], "OUTLINE_OK"),
    ):
        first = f"  | Subagent {child} finished and will do no further work unless it is sent more."
        at = recorder.lines.index(first)
        assert recorder.lines[at + 1 : at + 4] == ["  | Its closing message:", f"  | {closing}", "P says: NOTED"]


def test_the_follow_up_answer_reaches_the_parent_when_the_last_gate_opens(
    walked: tuple[DemoResult, _Recorder],
) -> None:
    """Closing, Draft outline answers the follow-up OUTLINE_V2_OK; that notice is P's next turn, answered NOTED."""
    result, recorder = walked
    first = (
        f"  | Subagent {result.children['Draft outline']} finished and will do no further work unless it is sent more."
    )
    notices = [at for at, line in enumerate(recorder.lines) if line == first]
    assert len(notices) == 2
    second = notices[1]
    assert recorder.lines[second + 1 : second + 4] == ["  | Its closing message:", "  | OUTLINE_V2_OK", "P says: NOTED"]
    assert recorder.lines[second + 4] == "R1 closed: every log flushed, the projection cache written"


def test_the_live_catalog_shows_the_running_child_at_zero_reads(walked: tuple[DemoResult, _Recorder]) -> None:
    """Live: one-shot and continuable inactive, Draft outline running on the live rung with 0 log reads."""
    result, _ = walked
    live = result.live
    assert live is not None
    notes, sources, outline = (result.children[label] for label in result.children)
    assert [row.id for row in live.rows] == [notes, sources, outline]
    expected = {
        notes: ("one-shot", "inactive"),
        sources: ("continuable", "inactive"),
        outline: ("continuable", "running"),
    }
    for row_id, (mode, activity) in expected.items():
        row = _row(live, row_id)
        assert isinstance(row, SubagentChildRow)
        assert (row.mode, row.activity) == (mode, activity)
    assert live.rung(outline) == 1
    assert live.reads.get(outline, 0) == 0


def test_the_model_sees_ready_and_running_lines_before_the_restart(walked: tuple[DemoResult, _Recorder]) -> None:
    """`list_agents` for P, live: the one-shot is dropped, Collect sources is ready and Draft outline running."""
    result, _ = walked
    sources, outline = result.children["Collect sources"], result.children["Draft outline"]
    assert result.live_listing.splitlines() == [
        f"{sources} [ready] — Collect sources",
        f"{outline} [running] — Draft outline",
    ]


def test_the_damaged_child_is_corrupt_after_exactly_one_read(walked: tuple[DemoResult, _Recorder]) -> None:
    """Cold, after the damage: Collect sources is a `corrupt` diagnostic row that cost exactly one log read."""
    result, _ = walked
    cold, damage = result.cold, result.damage
    assert cold is not None
    assert damage is not None
    sources = result.children["Collect sources"]
    assert damage.session_id == sources
    assert damage.removed_seqs == (0,)
    assert damage.events_after == damage.events_before - 1
    row = _row(cold, sources)
    assert isinstance(row, SubagentDiagnosticRow)
    assert row.reason == "corrupt"
    assert cold.reads.get(sources, 0) == 1


def test_the_healthy_children_are_cold_inactive_from_the_cache_or_one_read(
    walked: tuple[DemoResult, _Recorder],
) -> None:
    """Cold: the one-shot and Draft outline are inactive rows, each at 0 reads on a cache hit or 1 on a miss."""
    result, _ = walked
    cold = result.cold
    assert cold is not None
    for label, mode in (("Summarize notes", "one-shot"), ("Draft outline", "continuable")):
        child = result.children[label]
        row = _row(cold, child)
        assert isinstance(row, SubagentChildRow)
        assert (row.mode, row.activity, row.label) == (mode, "inactive", label)
        assert cold.reads.get(child, 0) == (0 if cold.rung(child) == 2 else 1)


def test_the_resumed_parent_lists_the_diagnostic_and_answers(walked: tuple[DemoResult, _Recorder]) -> None:
    """After the restart P calls `list_agents({})`, sees the corrupt row then the ready one, and says PARENT_DONE."""
    result, recorder = walked
    sources, outline = result.children["Collect sources"], result.children["Draft outline"]
    assert result.cold_listing.splitlines() == [
        f"{sources} [diagnostic: corrupt]",
        f"{outline} [ready] — Draft outline",
    ]
    assert result.answer == "One helper is unreadable. PARENT_DONE"
    assert "P calls list_agents({})" in recorder.lines
    assert "every step of the script was used (assert_consumed)" in recorder.lines


def test_the_summary_counts_rows_and_reads_per_rung(walked: tuple[DemoResult, _Recorder]) -> None:
    """The finish phase reports each catalog's rows and the log reads per rung."""
    result, recorder = walked
    assert result.live is not None
    assert result.cold is not None
    assert result.live.per_rung()[1] == (1, 0)
    assert result.cold.per_rung()[3] == (1, 1)
    finish = recorder.lines[recorder.lines.index("R2 closed") + 1 :]
    live_at, cold_at = finish.index("list_children(P), live: 3 rows"), finish.index("list_children(P), cold: 3 rows")
    assert "  rung 1 live   1 row   0 log reads" in finish[live_at:cold_at]
    assert "  rung 3 log    1 row   1 log read" in finish[cold_at:]


def test_two_runs_report_the_same_ids_and_lines(tmp_path: Path, walked: tuple[DemoResult, _Recorder]) -> None:
    """Ids and the clock are deterministic: a second run in another home reports the same lines, home aside."""
    first_result, first = walked
    second_result, second = _run(tmp_path / "home")

    def lines(result: DemoResult, recorder: _Recorder) -> list[str]:
        return [line.replace(str(result.home), "{{home}}") for line in recorder.lines]

    assert lines(second_result, second) == lines(first_result, first)


def test_demo_plain_exits_0_and_leaves_no_home_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --home or --keep the temporary home is removed and no closing hint is printed (nothing to look at)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    result = runner.invoke(app, ["demo", "--plain"])
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []
    assert "dsh --home" not in result.stdout
    assert result.stdout.rstrip().endswith("Done.")
    assert result.stderr == ""


def test_a_given_home_survives_and_the_hint_puts_global_options_first(tmp_path: Path) -> None:
    """With --home the logs stay and the hint reads `dsh --home <home> agents <P>`, naming only existing commands."""
    home = tmp_path / "demo home"
    result = runner.invoke(app, ["demo", "--home", str(home), "--plain"])
    assert result.exit_code == 0, result.output
    assert (home / "sessions").is_dir()
    hints = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("dsh --home")]
    parent = "00000001-0000-4000-8000-000000000001"
    assert f"dsh --home '{home}' agents {parent}" in hints
    commands = {info.name or info.callback.__name__ for info in app.registered_commands if info.callback}
    for hint in hints:
        # `dsh --home '<home with a space>' <command> ...`: the command follows the quoted home.
        command = hint.split(f"'{home}' ", 1)[1].split()[0]
        assert command in commands
    follow = runner.invoke(app, ["--home", str(home), "agents", parent, "--json"])
    assert follow.exit_code == 0, follow.output
    assert [row["kind"] for row in json.loads(follow.stdout)] == ["child", "diagnostic", "child"]


def _dsh(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real `dsh` entry point in a fresh interpreter, without any `DSH_*` setting or model key."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("DSH_") and key not in {"DEEPSEEK_API_KEY", "OPENAI_API_KEY"}
    }
    command = [sys.executable, "-c", "from dsh.cli.main import main; main()", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_every_hint_of_the_real_entry_point_is_a_command_that_works(tmp_path: Path) -> None:
    """`dsh --home H demo` through the console entry point: each hinted command has `--home H` first and exits 0."""
    home = tmp_path / "home"
    done = _dsh(["--home", str(home), "demo", "--plain"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    hints = [line.strip() for line in lines[lines.index("look further:") + 1 :] if line.startswith("  dsh ")]
    commands = []
    for hint in hints:
        words = shlex.split(hint)
        assert words[:3] == ["dsh", "--home", str(home)], hint
        commands.append(words[3])
        # `serve` runs until Ctrl-C: its help proves the command and every hinted option parse.
        follow = _dsh(words[1:] + (["--help"] if words[3] == "serve" else []), tmp_path)
        assert follow.returncode == 0, f"{hint}: {follow.stderr}"
        if "--json" in words:
            assert [row["kind"] for row in json.loads(follow.stdout)] == ["child", "diagnostic", "child"]
    assert sorted(set(commands)) == ["agents", "serve"]


def test_keep_keeps_the_temporary_home_and_prints_the_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--keep` keeps the temporary home, says where it is, and shows the hint for it."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    result = runner.invoke(app, ["demo", "--keep", "--plain"])
    assert result.exit_code == 0, result.output
    (kept,) = tmp_path.iterdir()
    assert f"kept the home: {kept}" in result.stdout
    assert f"dsh --home {kept} agents " in result.stdout


def test_the_global_home_option_works_like_the_demo_option(tmp_path: Path) -> None:
    """`dsh --home H demo` uses H as the home too."""
    home = tmp_path / "home"
    result = runner.invoke(app, ["--home", str(home), "demo", "--plain"])
    assert result.exit_code == 0, result.output
    assert (home / "sessions").is_dir()


def _one_line_exit_4(result: Any) -> str:
    assert result.exit_code == 4, result.output
    assert result.stdout == ""
    lines: list[str] = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "ExceptionGroup" not in result.stderr
    return lines[0]


def test_a_file_as_home_is_one_clear_line_and_exit_4() -> None:
    """`--home /etc/passwd`: one line saying it is not a directory, exit 4, no traceback."""
    line = _one_line_exit_4(runner.invoke(app, ["demo", "--home", "/etc/passwd", "--plain"]))
    assert "demo home /etc/passwd is not a directory" in line
    assert "CONFIG_INVALID" in line


def test_a_non_empty_home_is_refused(tmp_path: Path) -> None:
    """A folder that already holds something is refused with exit 4 and left untouched."""
    (tmp_path / "notes.txt").write_text("mine")
    line = _one_line_exit_4(runner.invoke(app, ["demo", "--home", str(tmp_path), "--plain"]))
    assert "is not empty" in line
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_a_home_that_cannot_be_created_is_refused() -> None:
    """A home under a path that cannot hold folders is one line and exit 4."""
    line = _one_line_exit_4(runner.invoke(app, ["demo", "--home", "/etc/passwd/home", "--plain"]))
    assert "cannot be created" in line


def test_an_unwritable_home_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder where no file can be written (the write probe fails) is one line and exit 4."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("dsh.demo.home.tempfile.mkstemp", refuse)
    line = _one_line_exit_4(runner.invoke(app, ["demo", "--home", str(tmp_path), "--plain"]))
    assert "is not writable (Permission denied)" in line


@pytest.mark.slow
def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    """A real mode-555 folder (refused by the kernel, even to root) is one line and exit 4, and stays empty."""
    require_permission_checks()
    home = tmp_path / "locked"
    home.mkdir(mode=0o555)
    try:
        done = run_dsh("demo", "--home", str(home), "--plain")
        left = list(home.iterdir())
    finally:
        home.chmod(0o755)
    assert done.returncode == 4, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert "is not writable" in line
    assert left == []


def _broken_script(track: str, step: int) -> ScriptedModelClient:
    source = resources.files("dsh.demo").joinpath("script.json")
    data = json.loads(source.read_text(encoding="utf-8"))
    data["agents"][track]["steps"][step]["match"] = {"lastUser": "a prompt nobody sends"}
    return ScriptedModelClient.from_dict(data)


@pytest.mark.parametrize(
    ("track", "step", "phase"),
    [("main", 2, '4 "Follow-up"'), ("Summarize notes", 0, '2 "Start children (runtime R1)"')],
)
def test_a_failed_phase_exits_with_its_family_code_and_names_the_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, track: str, step: int, phase: str
) -> None:
    """A script that no longer fits fails the phase it hits: exit 6 (model family), one line naming the phase."""
    monkeypatch.setattr(scenario, "load_script", lambda: _broken_script(track, step))
    result = runner.invoke(app, ["demo", "--home", str(tmp_path / "home"), "--plain"])
    assert result.exit_code == 6, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error [SCRIPT_MISMATCH]: demo phase {phase} failed: ")
    assert "Traceback" not in result.stderr


def test_the_demo_ignores_the_callers_storage_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`DSH_DATABASE_URL` and `DSH_AGENT__LOG_CHUNKS` of the caller's shell change nothing: JSONL under the home."""
    monkeypatch.setenv("DSH_DATABASE_URL", "memory:")
    monkeypatch.setenv("DSH_AGENT__LOG_CHUNKS", "true")
    home = tmp_path / "home"
    result = runner.invoke(app, ["demo", "--home", str(home), "--plain"])
    assert result.exit_code == 0, result.output
    assert any((home / "sessions").rglob("*.jsonl*"))


def test_the_script_ships_inside_the_package() -> None:
    """The demo's script is package data (`dsh/demo/script.json`) and loads as a valid script."""
    assert resources.files("dsh.demo").joinpath("script.json").is_file()
    assert scenario.load_script().model == "scripted-demo"


def test_the_spinner_shows_only_on_a_terminal() -> None:
    """The demo's spinner goes to stderr and only when stderr is a terminal; off a terminal nothing is drawn."""
    import io

    from rich.console import Console
    from rich.status import Status

    from dsh.cli.main import _DemoReporter

    out = Console(file=io.StringIO())
    on_terminal = _DemoReporter(out, Console(file=io.StringIO(), force_terminal=True), plain=True)
    off_terminal = _DemoReporter(out, Console(file=io.StringIO(), force_terminal=False), plain=True)
    assert isinstance(on_terminal.busy("waiting"), Status)
    assert isinstance(off_terminal.busy("waiting"), contextlib.nullcontext)
