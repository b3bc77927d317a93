"""The keyless walkthrough: real scripted agents delegate, continue, restart and meet a damaged child.

Layer: demo (an adapter: it drives the public runtime and reports what it sees; the CLI renders the
report). One `ScriptedModelClient`, loaded from the packaged `script.json`, answers every model
request of both runtimes; ids come from `SequentialIds` and times from a step clock, and both
continue across the restart, so every run prints the same thing. The children's first steps hold on
gates the demo opens one at a time, once the parent is idle, so the order of events never depends
on scheduling. The phases, and why each one matters, are described in docs/demo.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from dsh.abort import AbortController
from dsh.agent.ids import SequentialIds
from dsh.agent.loop import Agent
from dsh.agent.messages import message_text
from dsh.agent.models.scripted import ScriptedModelClient
from dsh.agent.tools import ToolContext
from dsh.config import AgentConfig, CacheConfig, Config, ModelConfig, PersistenceConfig, SubagentConfig
from dsh.demo.damage import Damage, remove_descriptor
from dsh.query.service import SessionQuery
from dsh.runtime import Runtime
from dsh.session.events import SessionEvent
from dsh.session.session import Session
from dsh.subagent.listing import ListingReport
from dsh.subagent.rows import SubagentChildRow, SubagentListEntry
from dsh.testing.counting import CountingPersistence
from dsh.testing.stored_logs import StepClock
from dsh.tools.subagent_control import ListAgentsTool

__all__ = [
    "DEMO_START_MS",
    "CatalogView",
    "DemoPhaseError",
    "DemoReporter",
    "DemoResult",
    "TurnFailedError",
    "demo_config",
    "load_script",
    "run_demo",
]

DEMO_START_MS: Final = 1_789_000_000_000
"""The step clock's first reading (epoch ms); every later reading adds 1."""

HANG_GUARD_S: Final = 60.0
"""How long one wait may take before the demo gives up: a guard against a hang, never a timing."""

PARENT_PROMPT: Final = "Research the teapot with three helpers."
FOLLOW_UP_PROMPT: Final = "Ask the outline helper to add a conclusion."
RESTART_PROMPT: Final = "Call list_agents once and report what it shows."

NOTES: Final = "Summarize notes"
SOURCES: Final = "Collect sources"
OUTLINE: Final = "Draft outline"

_GATES: Final = {SOURCES: "collect-sources", OUTLINE: "draft-outline"}
"""The gate each background helper's first step holds on (see script.json)."""
_FOLLOW_UP_GATE: Final = "outline-followup"

_RUNG_NAMES: Final = {1: "live", 2: "cache", 3: "log"}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CatalogView:
    """One printed catalog: the rows, and per row the rung that served it and the log reads it cost.

    A row without a rung (a diagnostic row) was decided by a log read, so it counts as rung 3.
    """

    title: str
    rows: list[SubagentListEntry]
    rungs: Mapping[str, int]
    reads: Mapping[str, int]

    def rung(self, row_id: str) -> int:
        """The rung that served a row."""
        return self.rungs.get(row_id, 3)

    def per_rung(self) -> dict[int, tuple[int, int]]:
        """Rung -> (rows, log reads), for the rungs that served at least one row, in rung order."""
        out: dict[int, tuple[int, int]] = {}
        for row in self.rows:
            rows, reads = out.get(self.rung(row.id), (0, 0))
            out[self.rung(row.id)] = (rows + 1, reads + self.reads.get(row.id, 0))
        return dict(sorted(out.items()))


@dataclass(slots=True)
class DemoResult:
    """What the walkthrough saw: for the summary, the closing hint and the tests."""

    home: Path
    parent: str = ""
    children: dict[str, str] = field(default_factory=dict)
    """Label -> child session id."""
    live: CatalogView | None = None
    live_listing: str = ""
    """The `list_agents` text the parent would have seen while Draft outline ran."""
    damage: Damage | None = None
    cold: CatalogView | None = None
    cold_listing: str = ""
    """The `list_agents` result the parent got after the restart."""
    answer: str = ""
    """The parent's final answer."""


class DemoPhaseError(Exception):
    """A phase failed.

    Attributes:
        phase: The failed phase, e.g. `4 "Follow-up"`.
        cause: The original error.
        code: The stable error code behind the failure (a `DshError`'s, or the one a failed turn
            recorded), or None when there is none (an unexpected error).
        reason: What went wrong, in one line.
    """

    def __init__(self, phase: str, cause: BaseException) -> None:
        code = getattr(cause, "code", None)
        self.code: str | None = code if isinstance(code, str) else None
        message = getattr(cause, "message", None)
        self.reason = message if isinstance(message, str) and message else str(cause) or type(cause).__name__
        super().__init__(f"demo phase {phase} failed: {self.reason}")
        self.phase = phase
        self.cause = cause


class TurnFailedError(Exception):
    """A turn of the walkthrough did not complete (the script and the run disagree).

    Attributes:
        code: The code of the turn's `turn/end` error, when it has one.
        message: What happened.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class _TurnEnds:
    """Records every turn that ended other than `completed`, in any session of a runtime."""

    def __init__(self) -> None:
        self.failures: list[TurnFailedError] = []
        self.failed = asyncio.Event()

    def __call__(self, session: Session, event: SessionEvent) -> None:
        data = event.data
        if event.type != "turn/end" or not isinstance(data, Mapping):
            return
        reason = data.get("reason")
        kind = reason.get("kind") if isinstance(reason, Mapping) else None
        if kind == "completed":
            return
        error = reason.get("error") if isinstance(reason, Mapping) else None
        code = error.get("code") if isinstance(error, Mapping) else None
        detail = error.get("message") if isinstance(error, Mapping) else None
        text = f"turn {data.get('turn')} of session {session.id} ended {kind}"
        message = f"{text}: {detail}" if detail else text
        self.failures.append(TurnFailedError(message, code if isinstance(code, str) else None))
        self.failed.set()

    def check(self) -> None:
        """Raise the first recorded failure."""
        if self.failures:
            raise self.failures[0]


class DemoReporter(Protocol):
    """What the walkthrough tells its renderer."""

    def phase(self, title: str) -> None:
        """A new phase heading."""

    def info(self, text: str) -> None:
        """One line of narration (escaping untrusted text is the renderer's job)."""

    def catalog(self, view: CatalogView) -> None:
        """A catalog table with the rung and the log reads of every row."""

    def busy(self, label: str) -> contextlib.AbstractContextManager[Any]:
        """Entered while the demo waits on agents (a spinner on a terminal); nothing is reported inside."""


def load_script() -> ScriptedModelClient:
    """A fresh client on the packaged script `dsh/demo/script.json`."""
    source = resources.files("dsh.demo").joinpath("script.json")
    data = json.loads(source.read_text(encoding="utf-8"))
    return ScriptedModelClient.from_dict(data, source="dsh/demo/script.json")


def demo_config(home: Path) -> Config:
    """JSONL logs and the SQLite projection cache under `home`, every other setting at its default.

    Each section is passed explicitly, so no `DSH_*` variable of the caller's shell changes the run.
    """
    return Config(
        home=home,
        database_url=None,
        persistence=PersistenceConfig(),
        cache=CacheConfig(),
        subagent=SubagentConfig(),
        model=ModelConfig(),
        agent=AgentConfig(),
    )


async def run_demo(home: Path, reporter: DemoReporter, *, home_note: str = "") -> DemoResult:
    """Run the walkthrough in `home` (an empty folder) and return what it saw.

    `home_note` follows the home's path in the first phase (the command line says there whether
    a temporary home is deleted at the end).

    Raises:
        DemoPhaseError: A phase failed; it names the phase and carries the original error.
    """
    walk = _Walk(home, reporter, home_note)
    try:
        await walk.run()
    except Exception as error:
        raise DemoPhaseError(walk.phase_name, _leaf(error)) from error
    return walk.result


def _leaf(error: BaseException) -> BaseException:
    """The first error inside a group (a runtime's close reports its failures as one group)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


class _Ends:
    """`subagent/end` notifications by child id, to await as events."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def _event(self, child_id: str) -> asyncio.Event:
        return self._events.setdefault(child_id, asyncio.Event())

    def __call__(self, event: Mapping[str, Any]) -> None:
        if event.get("type") == "subagent/end":
            self._event(str(event.get("childSessionId"))).set()

    async def wait(self, child_id: str) -> None:
        event = self._event(child_id)
        await event.wait()
        event.clear()


class _Walk:
    """The ten phases, in order; `phase_name` is the running one, so a failure can name it."""

    def __init__(self, home: Path, reporter: DemoReporter, home_note: str = "") -> None:
        self.home = home
        self.home_note = home_note
        self.say = reporter.info
        self.reporter = reporter
        self.result = DemoResult(home)
        self.phase_name = '1 "Prepare"'
        self.config = demo_config(home)
        self.ids = SequentialIds()
        self.clock = StepClock(start=DEMO_START_MS)
        self.client = load_script()
        self.ends = _Ends()
        self.turns = _TurnEnds()

    def phase(self, number: int, title: str) -> None:
        self.phase_name = f'{number} "{title}"'
        self.reporter.phase(f"{number}. {title}")

    def runtime(self) -> Runtime:
        return Runtime.open(self.config, model=self.client, ids=self.ids, clock=self.clock)

    async def wait(self, awaitable: Awaitable[T], what: str) -> T:
        """Await `awaitable`; stop early when a turn fails, and give up after the hang guard."""
        task = asyncio.ensure_future(awaitable)
        failed = asyncio.ensure_future(self.turns.failed.wait())
        try:
            async with asyncio.timeout(HANG_GUARD_S):
                await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError as error:
            raise TimeoutError(f"gave up after {HANG_GUARD_S:g} s waiting for {what}") from error
        finally:
            for waiter in (task, failed):
                if not waiter.done():
                    waiter.cancel()
            await asyncio.gather(task, failed, return_exceptions=True)
        self.turns.check()
        return task.result()

    async def run(self) -> None:
        self.phase(1, "Prepare")
        self.say(f"home: {self.home}{self.home_note}")
        self.say("session logs: JSONL+zstd in sessions/; projection cache: cache.sqlite3")
        self.say("model: the scripted client on dsh/demo/script.json (no key, no network)")
        self.phase(2, "Start children (runtime R1)")
        async with self.runtime() as r1:
            r1.subagents.on_event(self.ends)
            r1.sessions.on_event(self.turns)
            counting = _count_reads(r1)
            parent = await self.start_children(r1)
            await self.settle(r1, parent)
            await self.follow_up(r1, parent)
            await self.live_catalog(r1, counting, parent)
            self.phase(6, "Close")
            with self.reporter.busy("Draft outline finishes"):
                self.client.release(_FOLLOW_UP_GATE)
                await self.wait(self.ends.wait(self.result.children[OUTLINE]), "Draft outline to settle")
                await self.wait(r1.settle(timeout=None), "R1 to settle")
            self.report_notice(OUTLINE, parent)
        self.say("R1 closed: every log flushed, the projection cache written")
        await self.damage()
        self.phase(8, "Cold catalog (runtime R2, same home, nothing live)")
        async with self.runtime() as r2:
            r2.sessions.on_event(self.turns)
            cold = await _catalog(r2, _count_reads(r2), self.result.parent, "list_children(P), cold")
            self.result.cold = cold
            self.reporter.catalog(cold)
            damaged = self.result.children[SOURCES]
            self.say(
                f"log reads for the damaged child {SOURCES}: {cold.reads.get(damaged, 0)} "
                "(one observation, then the corrupt verdict)"
            )
            await self.model_view(r2)
        self.phase(10, "Finish")
        self.say("R2 closed")
        for view in (self.result.live, self.result.cold):
            if view is not None:
                self.summary(view)

    async def start_children(self, r1: Runtime) -> Agent:
        with self.reporter.busy("P delegates"):
            parent = await r1.create_agent(cwd=str(self.home))
            self.result.parent = parent.id
            first = await self.wait(r1.run(PARENT_PROMPT, parent.id), "P's first turn")
            await self.wait(parent.wait_idle(), "P to become idle")
        self.say(f"parent P = {parent.id}")
        self.say(f"user -> P: {PARENT_PROMPT}")
        self.report_calls(parent)
        self.say(f"P says: {first.output}")
        rows = await r1.subagents.list_children(parent.id)
        self.result.children = {row.label or row.id: row.id for row in rows if isinstance(row, SubagentChildRow)}
        children = self.result.children
        self.say("the helpers:")
        self.say(f"  {NOTES:<16} {children.get(NOTES, '?')}  one-shot, foreground")
        for label in (SOURCES, OUTLINE):
            self.say(f"  {label:<16} {children.get(label, '?')}  continuable, background")
        self.say(f"{SOURCES} and {OUTLINE} hold on their gates until P is idle")
        return parent

    async def settle(self, r1: Runtime, parent: Agent) -> None:
        self.phase(3, "Settle")
        self.say(f"P is idle: the gates open one at a time ({', '.join(_GATES.values())})")
        for label in (SOURCES, OUTLINE):
            child = self.result.children[label]
            with self.reporter.busy(f"{label} answers"):
                self.client.release(_GATES[label])
                await self.wait(self.ends.wait(child), f"{label} to settle")
                await self.wait(parent.wait_idle(), "P to answer the notice")
            self.report_notice(label, parent)
        with self.reporter.busy("settling"):
            await self.wait(r1.settle(timeout=None), "R1 to settle")

    async def follow_up(self, r1: Runtime, parent: Agent) -> None:
        self.phase(4, "Follow-up")
        with self.reporter.busy("P follows up"):
            answer = await self.wait(r1.run(FOLLOW_UP_PROMPT, parent.id), "the follow-up turn")
            await self.wait(self.client.wait_held(_FOLLOW_UP_GATE), "Draft outline to take the message")
        self.say(f"user -> P: {FOLLOW_UP_PROMPT}")
        self.report_calls(parent)
        self.say(f"P says: {answer.output}")
        self.say(f"{OUTLINE} was resumed; the message is its next turn, which holds on gate {_FOLLOW_UP_GATE}")

    async def live_catalog(self, r1: Runtime, counting: CountingPersistence, parent: Agent) -> None:
        self.phase(5, "Live catalog")
        live = await _catalog(r1, counting, parent.id, "list_children(P), live")
        self.result.live = live
        self.reporter.catalog(live)
        self.result.live_listing = await _list_agents_text(r1, parent)
        self.say("list_agents({}) as P's model would see it now:")
        for line in self.result.live_listing.splitlines():
            self.say(f"  {line}")
        outline = self.result.children[OUTLINE]
        self.say(f"log reads for the running child {OUTLINE}: {live.reads.get(outline, 0)} (live rung)")

    async def damage(self) -> None:
        self.phase(7, "Damage on purpose")
        sources = self.result.children[SOURCES]
        damage = await remove_descriptor(self.config.sessions_dir, self.config.cache_path, sources)
        self.result.damage = damage
        removed = ", ".join(str(seq) for seq in damage.removed_seqs) or "none"
        self.say(f"rewrote the log of {SOURCES} ({sources}) with the JSONL backend's own codec:")
        self.say(f"  its subagent/descriptor (seq {removed}) removed, later seqs renumbered so the log stays valid")
        self.say(f"  {damage.events_before} events -> {damage.events_after}")
        evicted = "evicted" if damage.cache_evicted else "none to evict"
        self.say(f"  its projection-cache row: {evicted} (derived data must not mask the damage)")
        self.say("this is what a one-shot child cancelled before its first step leaves behind")

    async def model_view(self, r2: Runtime) -> None:
        self.phase(9, "Model view after restart")
        with self.reporter.busy("P resumes"):
            final = await self.wait(r2.run(RESTART_PROMPT, self.result.parent), "the resumed parent's turn")
        self.say(f"user -> P: {RESTART_PROMPT}  (P is resumed from its log)")
        resumed = r2.agents.get(self.result.parent)
        if resumed is not None:
            calls = _calls(resumed, _latest_turn(resumed))
            self.report_calls(resumed)
            self.result.cold_listing = calls[-1][1] if calls else ""
        self.result.answer = final.output
        self.say(f"P says: {final.output}")
        self.client.assert_consumed()
        self.say("every step of the script was used (assert_consumed)")

    def report_notice(self, label: str, parent: Agent) -> None:
        """The newest settlement notice in P's log, line by line, and P's answer to it."""
        self.say(f"{label} answered and settled; its notice became P's next turn:")
        for line in _last_notice(parent).splitlines():
            self.say(f"  | {line}")
        self.say(f"P says: {_last_answer(parent)}")

    def report_calls(self, agent: Agent) -> None:
        for call, result in _calls(agent, _latest_turn(agent)):
            self.say(f"P calls {call}")
            for line in result.splitlines() or [""]:
                self.say(f"  -> {line}")

    def summary(self, view: CatalogView) -> None:
        self.say(f"{view.title}: {_plural(len(view.rows), 'row')}")
        for rung, (rows, reads) in view.per_rung().items():
            name = f"rung {rung} {_RUNG_NAMES.get(rung, '?')}"
            self.say(f"  {name:<13} {_plural(rows, 'row'):<7} {_plural(reads, 'log read')}")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _count_reads(rt: Runtime) -> CountingPersistence:
    """Route the runtime's query service through a read counter (the catalog reads logs through it)."""
    counting = CountingPersistence(rt.persistence)
    rt.services.query = SessionQuery(rt.sessions, counting, projections=rt.projections)
    return counting


async def _catalog(rt: Runtime, counting: CountingPersistence, parent: str, title: str) -> CatalogView:
    counting.reset()
    reports: list[ListingReport] = []
    rows = await rt.subagents.list_children(parent, report=reports.append)
    rungs = {str(key): value for key, value in reports[0].rungs.items()} if reports else {}
    return CatalogView(title, rows, rungs, dict(counting.reads))


async def _list_agents_text(rt: Runtime, caller: Agent) -> str:
    """What `list_agents({})` shows the caller's model: the real tool, run with the caller as calling agent."""
    tool = ListAgentsTool()
    ctx = ToolContext(agent=caller, call_id="demo", signal=AbortController().signal, services=rt.services)
    args = tool.args_model.model_validate({})
    blocks = tool.render(args, await tool.execute(args, ctx))
    return "".join(str(block.get("text", "")) for block in blocks)


def _latest_turn(agent: Agent) -> int:
    for event in reversed(agent.session.events):
        if event.type == "turn/start" and isinstance(event.data, Mapping):
            turn = event.data.get("turn")
            return turn if isinstance(turn, int) else 0
    return 0


def _calls(agent: Agent, turn: int) -> list[tuple[str, str]]:
    """`(name(arguments), result text)` for every tool call of one turn, in order."""
    calls: list[tuple[str, str]] = []
    for event in agent.session.events:
        data = event.data
        if not isinstance(data, Mapping) or data.get("turn") != turn:
            continue
        if event.type == "tool/call":
            calls.append((f"{data['name']}({data['arguments']})", ""))
        elif event.type == "tool/result" and calls:
            message = data.get("message")
            calls[-1] = (calls[-1][0], message_text(message) if isinstance(message, Mapping) else "")
    return calls


def _last_notice(agent: Agent) -> str:
    """The text of the newest settlement notice in the agent's log."""
    for event in reversed(agent.session.events):
        if event.type != "user/message" or not isinstance(event.data, Mapping):
            continue
        source = event.data.get("source")
        if isinstance(source, Mapping) and source.get("kind") == "subagent-settled":
            return message_text(event.data)
    return ""


def _last_answer(agent: Agent) -> str:
    for event in reversed(agent.session.events):
        message = event.data.get("message") if isinstance(event.data, Mapping) else None
        if event.type == "assistant/message" and isinstance(message, Mapping):
            return message_text(message)
    return ""
