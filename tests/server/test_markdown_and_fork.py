"""History views render assistant markdown safely; `forkSession` makes a new top-level session.

Layer: server. The rendering is presentation only: the stored event is answered unchanged beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

from dsh.server.markdown import render_markdown
from tests.server.helpers import HANG_GUARD_S, Api, api, assert_error, scripted, stored_session

HOSTILE = (
    "Here is **bold** and `code`.\n\n"
    "<script>alert(1)</script>\n\n"
    '<img src=x onerror="alert(2)"> and ![pic](x" onerror="alert(3))\n\n'
    "[click me](javascript:alert(4)) or [ok](https://example.org/?a=1&b=2)\n\n"
    "<iframe src=https://example.org></iframe>\n\n"
    "```python\nprint('<b>hi</b>')\n```\n"
)


def test_markdown_renders_structure_and_leaves_no_active_markup() -> None:
    """Emphasis, code and links render; scripts, handlers, iframes and `javascript:` links never become markup."""
    html = render_markdown(HOSTILE)
    assert "<strong>bold</strong>" in html
    assert '<pre><code class="language-python">' in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html
    assert '<a href="https://example.org/?a=1&amp;b=2" target="_blank" rel="noopener noreferrer">ok</a>' in html
    tags = set(re.findall(r"<([a-zA-Z0-9]+)", html))
    assert tags <= {"p", "strong", "code", "pre", "a"}, tags
    assert "javascript:" not in re.sub(r"<[^>]*>", "", html).replace("[click me](javascript:alert(4))", "")
    assert not re.search(r"<[^>]*\bon[a-z]+=", html)
    assert not re.search(r'href="javascript', html)


def test_markdown_images_become_links_that_load_nothing() -> None:
    """`![alt](url)` is a link with the alt text, never an `<img>`."""
    assert render_markdown("![a teapot](https://example.org/t.png)") == (
        '<p><a href="https://example.org/t.png" target="_blank" rel="noopener noreferrer">a teapot</a></p>\n'
    )


async def test_history_pages_carry_the_rendered_html_beside_the_unchanged_event(tmp_path: Path) -> None:
    """An assistant message gets `view.html` (sanitized); its stored text and other events are untouched."""
    async with api(tmp_path / "home", model=scripted(main=[{"text": HOSTILE}])) as served:
        created = (await served.http.post("/api/v1/sessions", json={"prompt": "show me"})).json()
        session_id = created["session"]["id"]
        await served.rt.settle(HANG_GUARD_S)
        page = (await served.http.get(f"/api/v1/sessions/{session_id}/history")).json()
        answers = [entry for entry in page["events"] if entry["event"]["type"] == "assistant/message"]
        assert len(answers) == 1
        message = answers[0]["event"]["data"]["message"]
        assert message["content"] == [{"type": "text", "text": HOSTILE}]
        assert answers[0]["view"] == {"html": render_markdown(HOSTILE)}
        assert all("view" not in entry for entry in page["events"] if entry["event"]["type"] != "assistant/message")


async def test_fork_answers_a_new_live_session_seeded_with_the_source(served: Api) -> None:
    """A stored session forked: 201, `Location`, parentSession is the source, and its turn is in the fork's history."""
    await stored_session(served.rt, "source", turns=2)
    response = await served.http.post("/api/v1/sessions/source/fork")
    assert response.status_code == 201, response.text
    session = response.json()["session"]
    assert session["parentSession"] == "source"
    assert session["isSeeded"] is True
    assert session["status"] == "idle"
    assert "origin" not in session
    assert response.headers["location"] == f"/api/v1/sessions/{session['id']}"
    source = (await served.http.get("/api/v1/sessions/source/history")).json()
    fork = (await served.http.get(f"/api/v1/sessions/{session['id']}/history")).json()
    assert [entry["event"] for entry in fork["events"]] == [entry["event"] for entry in source["events"]]
    assert fork["inheritedEventCount"] > 0


async def test_fork_through_a_seq_keeps_whole_turns_only(served: Api) -> None:
    """`throughSeq` inside a turn is 409 `agent-busy`; a seq the session lacks is 400; a turn's end forks."""
    await stored_session(served.rt, "source", turns=2)
    events = [entry["event"] for entry in (await served.http.get("/api/v1/sessions/source/history")).json()["events"]]
    first_end = next(event["seq"] for event in events if event["type"] == "turn/end")
    inside = next(event["seq"] for event in events if event["type"] == "user/message")
    fork = "/api/v1/sessions/source/fork"
    assert_error(await served.http.post(fork, json={"throughSeq": inside}), 409, "agent-busy")
    assert_error(await served.http.post(fork, json={"throughSeq": 10_000}), 400, "bad-request")
    response = await served.http.post(fork, json={"throughSeq": first_end})
    assert response.status_code == 201, response.text
    fork_id = response.json()["session"]["id"]
    page = (await served.http.get(f"/api/v1/sessions/{fork_id}/history")).json()
    kept = [entry["event"] for entry in page["events"]]
    assert kept[: first_end + 1] == events[: first_end + 1]
    assert [event["type"] for event in kept[first_end + 1 :]] == ["session/end-seed"]


async def test_fork_of_an_unknown_session_is_not_found(served: Api) -> None:
    """An id no session has is 404 `session-not-found`."""
    assert_error(await served.http.post("/api/v1/sessions/nobody/fork"), 404, "session-not-found")
