"""The web UI as a chat: streamed answers, safe markdown, approvals, titles and search, child authors.

Each test drives Debian's chromium against an in-process server and saves a screenshot of every
screen it reaches at 1280x800 and at 390x844 (a phone) in its own temporary folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dsh.agent.ids import SequentialIds
from dsh.agent.models import ScriptedModelClient
from dsh.config import Config
from dsh.projection import ClientView, ProjectionUnit
from dsh.runtime import Runtime
from dsh.testing.server import LiveServer, running_server
from tests.ui.helpers import (
    HANG_GUARD_MS,
    BrowserSession,
    DemoHome,
    browser_session,
    playwright_api,
    serve_home,
    ui_script,
)

pytestmark = pytest.mark.slow  # each test drives a real browser: `make test` only

if TYPE_CHECKING:
    from playwright.async_api import Page

_playwright = playwright_api()
expect = _playwright.expect

WIDE = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
_TABS = {"sessions": "Sessions", "conversation": "Conversation", "subagents": "Subagents"}


async def screens(ui: BrowserSession, name: str, pane: str) -> None:
    """Save `<name>-1280x800.png` and `<name>-390x844.png`; on the phone, `pane` is the tab shown."""
    page = ui.page
    await page.set_viewport_size(WIDE)
    await ui.screenshot(f"{name}-1280x800")
    await page.set_viewport_size(PHONE)
    await page.get_by_role("button", name=_TABS[pane], exact=True).click()
    await expect(page.locator(f"#pane-{pane}")).to_be_visible()
    await ui.screenshot(f"{name}-390x844")
    await page.set_viewport_size(WIDE)


def _shots(tmp_path: Path) -> set[str]:
    return {path.name for path in (tmp_path / "shots").glob("*.png")}


# Records what the conversation showed between frames: every text a streaming answer had, and
# whether the person's prompt was on the page before the log had it.
_RECORDER = """() => {
  const seen = { streamed: [], echo: false };
  window.__states = seen;
  const scroll = document.getElementById("conversation-scroll");
  const look = () => {
    const text = scroll.querySelector('.streaming[data-kind="text"] .text');
    const value = text ? text.textContent : null;
    if (value !== null && seen.streamed[seen.streamed.length - 1] !== value) seen.streamed.push(value);
    if (scroll.querySelector(".pending-prompt")) seen.echo = true;
  };
  new MutationObserver(look).observe(scroll, { childList: true, subtree: true, characterData: true });
}"""

STREAMED = "**Bold start** of an answer that streams in small pieces and renders as markdown at the end."


async def _open(page: Page, url: str, session_id: str) -> None:
    await page.goto(url)
    await page.locator(f'#session-list .session[data-id="{session_id}"]').click()
    await expect(page.locator("#conversation-heading")).to_have_attribute("title", session_id)


async def test_an_answer_streams_before_its_turn_ends_and_then_renders_as_markdown(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """The prompt shows at once, the answer grows as plain text while the turn is held, then renders; Fork copies it."""
    step = {"match": {"lastUser": "Stream it please."}, "hold": "mid-answer", "chunkSize": 7, "text": STREAMED}
    async with (
        serve_home(demo_home, ui_script(main=[step, {"text": "REST_OF_IT"}])) as served,
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await _open(page, served.token_url, demo_home.parent)
        conversation = page.locator("#conversation-scroll")
        await expect(conversation).to_contain_text("PARENT_DONE")
        await page.evaluate(_RECORDER)
        await page.locator("#prompt-text").fill("Stream it please.")
        await page.locator("#prompt-text").press("Enter")  # the keyboard submits

        await asyncio.wait_for(served.model.wait_held("mid-answer"), HANG_GUARD_MS / 1000)
        streaming = conversation.locator(".streaming")
        await expect(streaming).to_contain_text(STREAMED[:7])
        await expect(streaming).to_contain_text("writing…")
        await expect(page.locator("#conversation-working")).to_be_visible()
        await expect(page.locator("#conversation-interrupt")).to_be_visible()
        events = list(served.rt.agents.get(demo_home.parent).session.events)  # type: ignore[union-attr]
        open_turn = max(event.data["turn"] for event in events if event.type == "turn/start")
        assert open_turn not in [event.data["turn"] for event in events if event.type == "turn/end"]
        assert not [event for event in events if event.type == "assistant/message" and event.data["turn"] == open_turn]
        await expect(conversation.locator(".markdown strong", has_text="Bold start")).to_have_count(0)
        await screens(ui, "streaming", "conversation")

        served.model.release("mid-answer")
        rendered = conversation.locator(".entry.assistant:not(.streaming) .markdown")
        await expect(rendered.locator("strong", has_text="Bold start")).to_be_visible()
        await expect(streaming).to_have_count(0)
        await expect(page.locator("#conversation-working")).to_be_hidden()
        await expect(page.locator("#conversation-interrupt")).to_be_hidden()
        await expect(rendered.last).not_to_contain_text("**")

        states = await page.evaluate("window.__states")
        assert states["echo"] is True
        partial = [text for text in states["streamed"] if 0 < len(text) < len(STREAMED)]
        assert partial, states["streamed"]
        assert all(STREAMED.startswith(text) for text in states["streamed"])
        prompts = conversation.locator(".entry.message.user", has_text="Stream it please.")
        await expect(prompts).to_have_count(1)
        await expect(prompts).to_have_attribute("data-seq", re.compile(r"^\d+$"))
        await expect(conversation.locator(".pending-prompt")).to_have_count(0)
        # Token figures: each step's usage on its message, and the session's total in the heading.
        step_usage = rendered.last.locator("xpath=..").locator(".usage")
        await expect(step_usage).to_have_text(re.compile(r"^in \d+ · out \d+ tokens$"))
        # The heading's total is the server's (the `tokens` projection), billed input plus output.
        await served.rt.settle(HANG_GUARD_MS / 1000)
        session = served.rt.agents.get(demo_home.parent).session  # type: ignore[union-attr]
        counts = served.rt.projections.snapshot(session, ("tokens",)).values["tokens"]["total"]
        total = sum(counts[key] for key in ("inputTokens", "cacheReadTokens", "cacheWriteTokens", "outputTokens"))
        assert 0 < total < 1000  # shown in full (no compact notation)
        await expect(page.locator("#conversation-meta .usage-total")).to_have_text(f"{total} tokens")
        await screens(ui, "rendered", "conversation")

        # Fork: a new session with the same conversation opens, and the list gains it.
        await page.get_by_role("button", name="Fork").click()
        heading = page.locator("#conversation-heading")
        await expect(heading).not_to_have_attribute("title", demo_home.parent)
        fork_id = await heading.get_attribute("title")
        assert fork_id
        await expect(page.locator(f'#session-list .session[data-id="{fork_id}"]')).to_be_visible()
        await expect(conversation).to_contain_text("Stream it please.")
        await expect(conversation.locator(".markdown strong", has_text="Bold start")).to_be_visible()
        assert served.rt.sessions.get(fork_id).header.parent_session == demo_home.parent  # type: ignore[union-attr]
        await screens(ui, "forked", "conversation")
        assert ui.network.foreign == []
        assert ui.dialogs == []
        assert ui.console_errors == []
    assert {"streaming-1280x800.png", "streaming-390x844.png", "rendered-390x844.png"} <= _shots(tmp_path)


HOSTILE_MD = (
    "Look: **safe bold**.\n\n"
    "<script>window.__pwned = 'script'</script>\n\n"
    "<img src=x onerror=\"window.__pwned = 'img'\"> and ![pic](x\" onerror=\"window.__pwned='alt')\n\n"
    "[click me](javascript:window.__pwned='link') and [docs](https://example.org/docs)\n\n"
    '<iframe src="https://example.org"></iframe>\n\n'
    "```python\nprint('copy me')\n```\n"
)


_PROBE = """async () => {
  const { renderedMessage } = await import("/static/markup.js");
  const node = renderedMessage(
    '<p onclick="window.__pwned = 1">hi <img src=x onerror="window.__pwned = 2">' +
    '<script>window.__pwned = 3</script><iframe src="/"></iframe> ' +
    '<a href="javascript:window.__pwned = 4">j</a> <a href="https://example.org/" onmouseover="x()">ok</a></p>'
  );
  node.id = "probe";
  document.getElementById("conversation-scroll").append(node);
  const all = [...node.querySelectorAll("*")];
  return {
    tags: all.map((e) => e.localName),
    attrs: all.map((e) => e.getAttributeNames()),
    hrefs: [...node.querySelectorAll("a")].map((a) => a.getAttribute("href")),
    text: node.textContent,
  };
}"""


async def test_hostile_markdown_renders_inert_and_code_blocks_copy(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """A script, an onerror image, a javascript: link and an iframe in an answer run nothing; Copy copies the code."""
    step = {"match": {"lastUser": "Show me markdown."}, "text": HOSTILE_MD}
    async with (
        serve_home(demo_home, ui_script(main=[step])) as served,
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=served.server.base_url)
        await _open(page, served.token_url, demo_home.parent)
        await page.locator("#prompt-text").fill("Show me markdown.")
        await page.get_by_role("button", name="Send", exact=True).click()
        rendered = page.locator("#conversation-scroll .entry.assistant .markdown").last
        await expect(rendered.locator("strong", has_text="safe bold")).to_be_visible()
        await expect(rendered).to_contain_text("<script>window.__pwned = 'script'</script>")
        await expect(rendered).to_contain_text("<iframe")
        main = page.locator("main")
        assert await main.locator("script, img, iframe, object, embed").count() == 0
        assert await main.locator("[onerror], [onclick], [onload]").count() == 0
        assert await main.locator('a[href^="javascript"]').count() == 0
        link = rendered.locator("a", has_text="docs")
        await expect(link).to_have_attribute("href", "https://example.org/docs")
        await expect(link).to_have_attribute("rel", "noopener noreferrer")
        await expect(rendered.locator("a", has_text="click me")).to_have_count(0)
        assert await page.evaluate("window.__pwned === undefined")
        assert ui.dialogs == []

        block = rendered.locator(".code-block")
        await expect(block.locator(".code-language")).to_have_text("python")
        await block.get_by_role("button", name="Copy the code").click()
        await expect(block.locator(".copy-code")).to_have_text("Copied")
        assert await page.evaluate("navigator.clipboard.readText()") == "print('copy me')\n"
        await screens(ui, "markdown", "conversation")
        # The page's own wall: even markup the server never sends is rebuilt from the allow-list.
        before = len(ui.console_errors)
        probe = await page.evaluate(_PROBE)
        assert probe == {
            "tags": ["p", "a", "a"],
            "attrs": [[], [], ["href", "target", "rel"]],
            "hrefs": [None, "https://example.org/"],
            "text": "hi window.__pwned = 3 j ok",
        }
        await expect(page.locator("#probe")).to_be_attached()
        assert await page.evaluate("window.__pwned === undefined")
        # Parsing the probe's handlers is all the browser did with them, and the CSP refused even that.
        refused = ui.console_errors[before:]
        assert all("inline event handler" in error and "blocked" in error for error in refused), refused
        del ui.console_errors[before:]
        # Dark mode follows the system setting.
        light = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        await page.emulate_media(color_scheme="dark")
        dark = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert (light, dark) == ("rgb(244, 246, 249)", "rgb(15, 19, 25)")
        await screens(ui, "markdown-dark", "conversation")
        assert await page.evaluate("window.__pwned === undefined")
        assert ui.network.foreign == []
        assert ui.console_errors == []


_BASH_ONE = {"name": "bash", "arguments": {"command": "echo approved-from-the-page", "description": "Say it"}}
_BASH_TWO = {"name": "bash", "arguments": {"command": "echo never-runs", "description": "Do not"}}


@contextlib.asynccontextmanager
async def _plain_server(
    tmp_path: Path, model: ScriptedModelClient, **config: Any
) -> AsyncIterator[tuple[Runtime, LiveServer, str]]:
    """A runtime on an empty home (sandbox off, a workspace folder) served in-process, with its token URL."""
    workspace = tmp_path / "work"
    workspace.mkdir()
    settings = Config(home=tmp_path / "home", sandbox="off", **config)
    async with (
        Runtime.open(settings, model=model, ids=SequentialIds(), use_cache=False, workspace=workspace) as rt,
        running_server(rt) as server,
    ):
        yield rt, server, f"{server.base_url}/#token={server.token}"


async def test_approvals_decided_in_the_page_reach_the_log(chromium: str, tmp_path: Path) -> None:
    """Both questions show the exact command; Approve runs one, Deny refuses the other, the log says so; cost shows."""
    model = ScriptedModelClient.from_dict(
        {
            "version": 1,
            "model": "scripted-ui",
            "agents": {
                "main": {"steps": [{"toolCalls": [_BASH_ONE]}, {"toolCalls": [_BASH_TWO]}, {"text": "ALL_DONE"}]}
            },
        }
    )
    prices = {"models": {"scripted-ui": {"input": 1000.0, "cache_hit_input": 100.0, "output": 2000.0}}}
    async with (
        _plain_server(tmp_path, model, prices=prices) as (rt, _server, url),
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await page.goto(url)
        await expect(page.locator("#sessions-empty")).to_be_visible()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "live")
        await screens(ui, "empty", "sessions")

        agent = await rt.create_agent()
        await agent.send("run the commands")
        row = page.locator(f'#session-list .session[data-id="{agent.id}"]')
        await row.click()
        card = page.locator("#approval-list .approval")
        await expect(card).to_have_count(1)
        await expect(card.locator(".approval-preview")).to_have_text("$ echo approved-from-the-page")
        await expect(card).to_contain_text("main")
        await expect(card).to_contain_text("bash")
        await screens(ui, "approval", "conversation")
        await card.get_by_role("button", name="Approve").click()

        second = page.locator("#approval-list .approval", has_text="never-runs")
        await expect(second.locator(".approval-preview")).to_have_text("$ echo never-runs")
        await second.get_by_role("button", name="Deny").click()
        conversation = page.locator("#conversation-scroll")
        await expect(conversation).to_contain_text("ALL_DONE")
        await expect(page.locator("#approvals")).to_be_hidden()
        await expect(conversation.locator(".tool-result").first).to_contain_text("approved-from-the-page")
        await rt.settle(HANG_GUARD_MS / 1000)
        events = list(agent.session.events)
        decided = [event.data["outcome"] for event in events if event.type == "approval/decided"]
        assert decided == ["allowed-once", "rejected"]
        results = [event.data["message"]["content"][0] for event in events if event.type == "tool/result"]
        assert results[0]["content"][0]["text"] == "approved-from-the-page\n"
        assert results[1]["isError"] is True
        # Token and cost figures of a priced model: three steps of 10 input and 5 output tokens.
        usages = [event.data["usage"] for event in events if event.type == "assistant/message"]
        assert usages == [{"inputTokens": 10, "outputTokens": 5}] * 3
        await expect(page.locator("#conversation-meta .usage-total")).to_have_text("45 tokens")
        await expect(page.locator("#conversation-meta .cost-total")).to_have_text("$0.06")
        await expect(row.locator(".session-meta")).to_contain_text("45 tokens · $0.06")
        await screens(ui, "approved", "conversation")
        assert ui.network.foreign == []
        assert ui.console_errors == []


def _title_unit() -> ProjectionUnit[Any, Any]:
    """A client-visible `title` projection folding `session/title` events (what the listing reads titles from)."""

    class Passthrough:
        def validate_python(self, value: object, /) -> object:
            return value

    def apply(state: Any, event: Any) -> Any:
        return {"title": event.data["title"]} if event.type == "session/title" else state

    return ProjectionUnit(
        key="title",
        state_version=1,
        init=dict,
        apply=apply,
        state_schema=Passthrough(),
        view=ClientView(render=lambda state: state.get("title"), schema=Passthrough()),
    )


async def test_the_session_list_shows_titles_and_filters_by_search(chromium: str, tmp_path: Path) -> None:
    """Titled sessions are listed by title; typing narrows the list, a miss says so, Escape shows every session."""
    titles = {"s-teapot": "Teapot history", "s-kettle": "Kettle repair", "s-glaze": "Glazing a teapot"}
    async with (
        _plain_server(tmp_path, ui_script()) as (rt, _server, url),
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        dispose = rt.projections.register(_title_unit())
        try:
            for session_id, title in titles.items():
                session = rt.sessions.create(session_id)
                session.append("session/title", {"title": title, "messageSeqs": [], "source": {"kind": "user"}})
            rt.sessions.create("s-untitled")
            page = ui.page
            await page.goto(url)
            rows = page.locator("#session-list .session")
            await expect(rows).to_have_count(4)
            for session_id, title in titles.items():
                await expect(page.locator(f'.session[data-id="{session_id}"] .session-title')).to_have_text(title)
            await expect(page.locator('.session[data-id="s-untitled"] .session-title')).to_have_text("s-untitled")
            await screens(ui, "sessions", "sessions")

            search = page.get_by_role("searchbox", name="Search sessions")
            visible = page.locator("#session-list li:not([hidden]) .session")
            await search.fill("teapot")
            await expect(visible).to_have_count(2)
            shown = await visible.evaluate_all("nodes => nodes.map(n => n.dataset.id)")
            assert sorted(shown) == ["s-glaze", "s-teapot"]
            await expect(page.locator("#sessions-count")).to_have_text("2 of 4")
            await screens(ui, "search", "sessions")
            await search.fill("kettle rep")
            await expect(visible).to_have_count(1)
            await expect(visible).to_have_attribute("data-id", "s-kettle")
            await search.fill("no such words")
            await expect(visible).to_have_count(0)
            await expect(page.locator("#sessions-nomatch")).to_contain_text("No session matches")
            await search.press("Escape")
            await expect(visible).to_have_count(4)
            await expect(page.locator("#sessions-nomatch")).to_be_hidden()
        finally:
            dispose()
        assert ui.network.foreign == []
        assert ui.console_errors == []


def _damage(home: Path) -> None:
    """Put one session folder with an unreadable header beside the demo's sessions (it cannot be listed)."""
    project = next((home / "sessions").iterdir())
    broken = project / "00000009-0000-4000-8000-000000000009"
    broken.mkdir()
    (broken / "session.jsonl").write_bytes(b"this is not a session header\n")


async def test_the_child_panel_names_the_parent_agent_and_offers_interrupt_only_while_running(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """The task and relayed follow-up are the parent agent's, the person's message is "You"; unlisted counted."""
    _damage(demo_home.path)
    step = {"match": {"lastUser": "One more line, please."}, "hold": "child-line", "text": "CHILD_LINE_OK"}
    async with (
        serve_home(demo_home, ui_script(Draft_outline=[step])) as served,
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await served.rt.resume_agent(demo_home.parent)
        await _open(page, served.token_url, demo_home.parent)
        await expect(page.locator("#tree .tree-row")).to_have_count(3)
        await expect(page.locator("#tree-unlisted")).to_contain_text("1 stored session could not be read")
        await page.locator(f'#tree .tree-row[data-id="{demo_home.outline}"]').click()
        body = page.locator("#child-body")
        task = body.locator(".entry.message.user", has_text="Draft an outline of an essay on the teapot.")
        await expect(task).to_have_attribute("data-author", "parent-agent")
        await expect(task.locator(".who")).to_contain_text("Parent agent")
        relayed = body.locator(".entry.message.user", has_text="Add a conclusion.")
        await expect(relayed.locator(".who")).to_contain_text("Parent agent")
        assert "You" not in await body.locator(".entry.message.user .who").all_inner_texts()
        interrupt = page.locator("#child-panel").get_by_role("button", name="Interrupt")
        await expect(interrupt).to_be_hidden()
        await screens(ui, "child", "subagents")

        await page.locator("#child-text").fill("One more line, please.")
        await page.locator("#child-text").press("Enter")
        await asyncio.wait_for(served.model.wait_held("child-line"), HANG_GUARD_MS / 1000)
        await expect(interrupt).to_be_visible()
        await expect(page.locator("#child-working")).to_be_visible()
        mine = body.locator(".entry.message.user", has_text="One more line, please.")
        await expect(mine.locator(".who")).to_contain_text("You")
        await screens(ui, "child-running", "subagents")
        settled = asyncio.Event()

        def on_subagent(event: Mapping[str, Any]) -> None:
            if event.get("type") == "subagent/end" and event.get("childSessionId") == demo_home.outline:
                settled.set()

        unsubscribe = served.rt.subagents.on_event(on_subagent)
        served.model.release("child-line")
        await asyncio.wait_for(settled.wait(), HANG_GUARD_MS / 1000)
        unsubscribe()
        await expect(body.locator(".entry.assistant:not(.streaming)").last).to_contain_text("CHILD_LINE_OK")
        await expect(interrupt).to_be_hidden()
        await expect(mine).to_have_count(1)
        await expect(mine.locator(".who")).to_have_text(re.compile("^You"))
        assert ui.network.foreign == []
        assert ui.console_errors == []
