"""The web UI in a real browser: the demo home served, read, prompted and followed live."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dsh.agent.messages import UserSource
from dsh.testing.stored_logs import append_closed_turn
from tests.server.helpers import continuable_child
from tests.ui.helpers import HANG_GUARD_MS, DemoHome, Served, browser_session, playwright_api, serve_home, ui_script

pytestmark = pytest.mark.slow  # each test drives a real browser: `make test` only

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

_playwright = playwright_api()  # outside CI, no Playwright package skips this module with the reason
expect = _playwright.expect
PlaywrightError = _playwright.Error


async def test_the_token_url_opens_the_session_its_conversation_and_a_marked_diagnostic_row(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """The fragment is removed, P is listed alone with its title and token total, its messages show, and the
    damaged child is a marked row."""
    async with serve_home(demo_home, ui_script()) as served, browser_session(chromium, tmp_path / "shots") as ui:
        page = ui.page
        await page.goto(served.token_url)
        sessions = page.locator("#session-list .session")
        await expect(sessions).to_have_count(1)
        await expect(sessions.first).to_have_attribute("data-id", demo_home.parent)
        await expect(sessions.first.locator(".session-title")).to_have_text("Research the teapot with three")
        await expect(sessions.first.locator(".session-tokens")).to_contain_text(re.compile(r"^[0-9,]+ tokens"))
        assert "token" not in page.url
        assert await page.evaluate("location.hash") == ""
        assert await page.evaluate("sessionStorage.getItem('dsh.token')") == served.server.token

        await sessions.first.click()
        conversation = page.locator("#conversation-scroll")
        await expect(conversation).to_contain_text("Research the teapot with three helpers.")
        await expect(conversation).to_contain_text("One helper is unreadable. PARENT_DONE")

        rows = page.locator("#tree .tree-row")
        await expect(rows).to_have_count(3)
        damaged = page.locator(f'#tree .tree-row[data-id="{demo_home.damaged}"]')
        await expect(damaged).to_have_attribute("data-kind", "diagnostic")
        await expect(damaged).to_contain_text("diagnostic: corrupt")
        await expect(damaged).to_have_attribute("aria-label", re.compile("diagnostic: corrupt"))
        await ui.screenshot("p-open")
        assert ui.network.foreign == []
        assert ui.dialogs == []


def _row(page: Page, session_id: str) -> Locator:
    return page.locator(f'#tree .tree-row[data-id="{session_id}"]')


async def _open_parent(page: Page, served: Served) -> None:
    await page.goto(served.token_url)
    await page.locator(f'#session-list .session[data-id="{served.home.parent}"]').click()
    await expect(page.locator("#tree .tree-row")).to_have_count(3)


async def test_a_child_turns_running_and_back_to_inactive_without_a_reload(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """With P open, a follow-up the test sends in-process makes the child's row pulse `running`, then `inactive`."""
    step = {"match": {"lastUser": "Add a closing line."}, "hold": "closing-line", "text": "CLOSING_OK"}
    async with (
        serve_home(demo_home, ui_script(Draft_outline=[step])) as served,
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await _open_parent(page, served)
        outline = _row(page, demo_home.outline)
        await expect(outline).to_have_attribute("data-activity", "inactive")
        navigations = 0

        def navigated(frame: object) -> None:
            nonlocal navigations
            navigations += 1

        page.on("framenavigated", navigated)
        parent = await served.rt.resume_agent(demo_home.parent)
        await served.rt.subagents.followup(parent, demo_home.outline, "Add a closing line.", source=UserSource())
        await expect(outline).to_have_attribute("data-activity", "running")
        await expect(outline.locator(".activity")).to_have_attribute("data-activity", "running")
        await served.model.wait_held("closing-line")
        served.model.release("closing-line")
        await expect(outline).to_have_attribute("data-activity", "inactive")
        await expect(page.locator("#conversation-scroll")).to_contain_text("CLOSING_OK")
        assert navigations == 0
        assert ui.network.foreign == []


HOSTILE_LABEL = "<img src=x onerror=alert(1)>"
HOSTILE_TEXT = '<script>alert(2)</script> then <b onerror="alert(3)">bold</b> and <img src=y onerror=alert(4)>'


async def test_hostile_labels_and_messages_render_as_text_and_nothing_leaves_loopback(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """A label and a message full of markup show as literal text, no dialog fires, and no request leaves loopback."""
    async with serve_home(demo_home, ui_script()) as served, browser_session(chromium, tmp_path / "shots") as ui:
        rt = served.rt
        parent = rt.sessions.create("hostile-parent")
        append_closed_turn(parent, 1, text=HOSTILE_TEXT)
        await rt.sessions.flush(parent)
        rt.sessions.dispose(parent)
        await continuable_child(rt, "hostile-parent", "hostile-child", label=HOSTILE_LABEL)

        page = ui.page
        await page.goto(served.token_url)
        await page.locator('#session-list .session[data-id="hostile-parent"]').click()
        conversation = page.locator("#conversation-scroll")
        await expect(conversation).to_contain_text(HOSTILE_TEXT)
        row = _row(page, "hostile-child")
        await expect(row.locator(".row-label")).to_have_text(HOSTILE_LABEL)
        await row.click()
        await expect(page.locator("#child-heading")).to_have_text(HOSTILE_LABEL)
        await expect(page.locator("#child-body")).to_contain_text("hello")
        await ui.screenshot("hostile")

        assert await page.locator("main img, main script, main b").count() == 0
        assert ui.dialogs == []
        assert ui.console_errors == []
        assert ui.network.foreign == []
        # The page itself cannot reach another host (its content security policy stops the fetch) ...
        outcome = await page.evaluate("fetch('http://192.0.2.1/probe').then(() => 'reached', () => 'blocked')")
        assert outcome == "blocked"
        assert ui.network.foreign == []
        # ... and the routing guard is armed: a navigation elsewhere is aborted and counted.
        probe = await page.context.new_page()
        with pytest.raises(PlaywrightError):
            await probe.goto("http://192.0.2.1/probe")
        assert ui.network.foreign == ["http://192.0.2.1/probe"]


async def test_a_child_is_prompted_through_its_resumed_parent_and_a_dropped_stream_catches_up(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """Diagnostic row, raw log, a child prompt that resumes the parent first, then an outage the stream replays."""
    step = {"match": {"lastUser": "Add a summary line."}, "hold": "summary-line", "text": "SUMMARY_LINE_OK"}
    async with (
        serve_home(demo_home, ui_script(Draft_outline=[step])) as served,
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await _open_parent(page, served)
        assert "token" not in page.url
        await expect(page.locator("#conversation-scroll")).to_contain_text("One helper is unreadable. PARENT_DONE")

        # The damaged child: marked, explained, no controls; its raw log is one observation away.
        damaged = _row(page, demo_home.damaged)
        await expect(damaged).to_have_attribute("data-kind", "diagnostic")
        await expect(damaged).to_contain_text("diagnostic: corrupt")
        await damaged.click()
        panel = page.locator("#child-panel")
        await expect(panel).to_contain_text("This subagent could not be read.")
        await ui.screenshot("diagnostic")
        await expect(page.locator("#child-actions")).to_be_hidden()
        await expect(panel.get_by_role("button", name="Interrupt")).to_be_hidden()
        await panel.get_by_role("button", name="View raw log (observation only)").click()
        await expect(page.locator("#child-body")).to_contain_text("Collect sources on the teapot.")
        await expect(page.locator("#child-body")).to_contain_text("user/message")

        # The continuable child: its history, a prompt box and an Interrupt button.
        outline = _row(page, demo_home.outline)
        await outline.click()
        body = page.locator("#child-body")
        await expect(body).to_contain_text("OUTLINE_V2_OK")
        await expect(panel.get_by_role("button", name="Interrupt")).to_be_visible()
        await page.locator("#child-text").fill("Add a summary line.")
        await panel.get_by_role("button", name="Send", exact=True).click()
        resume = panel.get_by_role("button", name="Resume parent and send")
        await expect(page.locator("#child-notice")).to_contain_text("not live")
        await resume.click()
        await expect(outline).to_have_attribute("data-activity", "running")
        await served.model.wait_held("summary-line")
        await expect(page.locator("#session-list .session").first).to_have_attribute("data-status", "idle")
        await ui.screenshot("child-running")
        assert "SUMMARY_LINE_OK" not in await body.inner_text()

        # The outage: the server ends every stream and the browser cannot reconnect for a while.
        ui.network.block_stream = True
        assert served.end_streams() >= 1
        connection = page.locator("#connection")
        await expect(connection).to_have_attribute("data-state", "reconnecting")
        await expect(connection).to_contain_text("reconnecting")
        await ui.screenshot("reconnecting")
        await asyncio.wait_for(ui.network.stream_refused.wait(), HANG_GUARD_MS / 1000)
        settled = asyncio.Event()

        def on_subagent(event: Mapping[str, Any]) -> None:
            if event.get("type") == "subagent/end" and event.get("childSessionId") == demo_home.outline:
                settled.set()

        unsubscribe = served.rt.subagents.on_event(on_subagent)
        before_outage = served.server.hub.last_id
        served.model.release("summary-line")
        await asyncio.wait_for(settled.wait(), HANG_GUARD_MS / 1000)
        unsubscribe()
        assert served.server.hub.last_id > before_outage
        subscriptions = len(served.last_event_ids)

        # Recovery: the streams come back with Last-Event-ID and replay what happened meanwhile.
        ui.network.block_stream = False
        await expect(connection).to_have_attribute("data-state", "live")
        await expect(body).to_contain_text("SUMMARY_LINE_OK")
        await expect(outline).to_have_attribute("data-activity", "inactive")
        await expect(page.locator("#conversation-scroll")).to_contain_text("SUMMARY_LINE_OK")
        resumed = [last for last in served.last_event_ids[subscriptions:] if last is not None]
        assert resumed, served.last_event_ids
        assert min(resumed) <= before_outage
        assert ui.network.blocked_streams >= 1

        await ui.screenshot("wide")
        await page.set_viewport_size({"width": 420, "height": 860})
        await page.get_by_role("button", name="Conversation").click()
        await expect(page.locator("#pane-conversation")).to_be_visible()
        await expect(page.locator("#pane-sessions")).to_be_hidden()
        await ui.screenshot("narrow-conversation")
        await page.get_by_role("button", name="Subagents").click()
        await expect(page.locator("#pane-subagents")).to_be_visible()
        await ui.screenshot("narrow-subagents")
        assert ui.network.foreign == []
        assert ui.dialogs == []


async def test_without_a_token_the_page_asks_for_one_and_refuses_a_wrong_one(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """The bare URL shows the sign-in form; a wrong token is refused there; the right one opens the session list."""
    async with serve_home(demo_home, ui_script()) as served, browser_session(chromium, tmp_path / "shots") as ui:
        page = ui.page
        await page.goto(served.server.base_url + "/")
        form = page.locator("#signin-form")
        await expect(form).to_be_visible()
        await expect(page.locator("#layout")).to_be_hidden()
        await page.locator("#signin-token").fill("not-the-token")
        await form.get_by_role("button", name="Continue").click()
        await expect(page.locator("#signin-error")).to_have_text("The server did not accept the token.")
        await page.locator("#signin-token").fill(served.server.token)
        await form.get_by_role("button", name="Continue").click()
        await expect(page.locator(f'#session-list .session[data-id="{demo_home.parent}"]')).to_be_visible()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "live")
        assert served.server.token not in page.url
        assert ui.network.foreign == []


async def test_long_lists_and_long_conversations_page_on_request(
    chromium: str, demo_home: DemoHome, tmp_path: Path
) -> None:
    """50 sessions, then "Load more" for the rest; a long conversation's tail, then "Load earlier" for its start."""
    async with serve_home(demo_home, ui_script()) as served, browser_session(chromium, tmp_path / "shots") as ui:
        rt = served.rt
        for index in range(55):
            session = rt.sessions.create(f"bulk-{index:02d}")
            for turn in range(1, (31 if index == 54 else 1) + 1):
                append_closed_turn(session, turn, text=f"question {turn}")
            await rt.sessions.flush(session)
            rt.sessions.dispose(session)

        page = ui.page
        await page.goto(served.token_url)
        sessions = page.locator("#session-list .session")
        await expect(sessions).to_have_count(50)
        await page.get_by_role("button", name="Load more").click()
        await expect(sessions).to_have_count(56)
        await expect(page.get_by_role("button", name="Load more")).to_be_hidden()

        await page.locator('#session-list .session[data-id="bulk-54"]').click()
        conversation = page.locator("#conversation-scroll")
        await expect(conversation).to_contain_text("question 31")
        markers = conversation.locator(".turn-marker span")
        first_shown = int((await markers.first.inner_text()).split()[1])
        assert first_shown > 1
        earlier = conversation.get_by_role("button", name="Load earlier")
        await expect(earlier).to_be_visible()
        await earlier.click()
        await expect(conversation.locator(".message.user").first).to_contain_text("question 1")
        await expect(earlier).to_be_hidden()
        turns = [int(text.split()[1]) for text in await markers.all_inner_texts()]
        assert turns == list(range(1, 32))


async def test_the_child_panel_interrupts_a_running_child(chromium: str, demo_home: DemoHome, tmp_path: Path) -> None:
    """Interrupt on a running continuable child ends its turn `aborted` (cause `user`), shown in the panel."""
    step = {"match": {"lastUser": "Take your time."}, "hold": "never-released", "text": "PARTIAL"}
    async with (
        serve_home(demo_home, ui_script(Draft_outline=[step])) as served,
        browser_session(chromium, tmp_path / "shots") as ui,
    ):
        page = ui.page
        await _open_parent(page, served)
        parent = await served.rt.resume_agent(demo_home.parent)
        await served.rt.subagents.followup(parent, demo_home.outline, "Take your time.", source=UserSource())
        await served.model.wait_held("never-released")
        outline = _row(page, demo_home.outline)
        await expect(outline).to_have_attribute("data-activity", "running")
        await outline.click()
        panel = page.locator("#child-panel")
        await expect(panel).to_contain_text("Take your time.")
        await panel.get_by_role("button", name="Interrupt").click()
        await expect(page.locator("#child-body")).to_contain_text("ended: aborted · user")
        await expect(outline).to_have_attribute("data-activity", "inactive")
