"""Helpers of the browser tests: Debian's chromium driven by Playwright against an in-process server.

The server runs on the test's own event loop (`dsh.testing.server.running_server`) over a home the
demo scenario filled, with a scripted model and no key, so a test can drive the runtime (resume a
parent, send a follow-up, open a gate, end every push stream) while the browser is on the page.
Playwright's async API shares that loop. The browser is the system's chromium, never a download;
every request it makes to anything but loopback is aborted and counted. Waits are Playwright's
event-based `expect`/`wait_for` under `HANG_GUARD_MS`, never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dsh.agent.models import ScriptedModelClient
from dsh.demo.scenario import DemoResult, demo_config, run_demo
from dsh.runtime import Runtime
from dsh.testing.server import LiveServer, running_server

__all__ = [
    "CHROMIUM_FLAGS",
    "HANG_GUARD_MS",
    "BrowserSession",
    "DemoHome",
    "Network",
    "Served",
    "browser_session",
    "chromium_executable",
    "fill_demo_home",
    "playwright_api",
    "serve_home",
    "ui_script",
]

HANG_GUARD_MS = 30_000
"""How long a browser wait may take before the test fails: a hang guard, never a timing assertion."""

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""Flags for Debian's chromium: headless, no GPU, and nothing that talks to the network on its own."""

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def playwright_api() -> Any:
    """`playwright.async_api`; outside CI a missing package skips the calling module, on CI it fails."""
    try:
        import playwright.async_api as api
    except ImportError:
        reason = "the Playwright Python package is not installed (pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return api


def chromium_executable() -> str:
    """The chromium binary: `DSH_CHROMIUM`, else `chromium` on PATH, else /usr/bin/chromium.

    Outside CI a missing binary skips the test with the reason; with `CI` set it fails, because CI
    installs it (`.ci/run`).
    """
    on_ci = bool(os.environ.get("CI"))
    configured = os.environ.get("DSH_CHROMIUM")
    candidate = configured or shutil.which("chromium") or "/usr/bin/chromium"
    if Path(candidate).is_file() and os.access(candidate, os.X_OK):
        return candidate
    reason = (
        f"no chromium binary at {candidate!r}: install Debian's chromium (apt-get install chromium) "
        "or point DSH_CHROMIUM at one; the browser tests never download a browser"
    )
    if on_ci:
        pytest.fail(reason)
    pytest.skip(reason)


# ---------------------------------------------------------------- the demo home


class _Quiet:
    """A demo reporter that keeps nothing."""

    def phase(self, title: str) -> None:
        """Ignore a heading."""

    def info(self, text: str) -> None:
        """Ignore a line."""

    def catalog(self, view: object) -> None:
        """Ignore a table."""

    def busy(self, label: str) -> contextlib.AbstractContextManager[Any]:
        """No spinner."""
        return contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class DemoHome:
    """A home the demo scenario filled: the parent P and its three children by label."""

    path: Path
    parent: str
    children: Mapping[str, str]

    @property
    def notes(self) -> str:
        """The one-shot child (Summarize notes)."""
        return self.children["Summarize notes"]

    @property
    def damaged(self) -> str:
        """The child whose descriptor the demo removed (a `corrupt` diagnostic row)."""
        return self.children["Collect sources"]

    @property
    def outline(self) -> str:
        """The continuable child (Draft outline)."""
        return self.children["Draft outline"]

    def copy(self, target: Path) -> DemoHome:
        """The same home copied to `target` (each test changes its own copy)."""
        shutil.copytree(self.path, target)
        return DemoHome(target, self.parent, self.children)


def fill_demo_home(path: Path) -> DemoHome:
    """Run the demo scenario into `path` (an absent or empty folder)."""
    path.mkdir(parents=True, exist_ok=True)
    result: DemoResult = asyncio.run(run_demo(path, _Quiet()))
    return DemoHome(path, result.parent, dict(result.children))


# ---------------------------------------------------------------- the server


def ui_script(**tracks: Sequence[Mapping[str, Any]]) -> ScriptedModelClient:
    """A scripted model: `main` answers every settlement notice with `NOTED`; named tracks replay their steps."""
    agents: dict[str, Any] = {"main": {"steps": [], "on": [{"match": {"source": "subagent-settled"}, "text": "NOTED"}]}}
    for name, steps in tracks.items():
        agents[name.replace("_", " ")] = {"steps": list(steps)}
    return ScriptedModelClient.from_dict({"version": 1, "model": "scripted-ui", "agents": agents})


@dataclass
class Served:
    """A runtime on a demo home, served in-process."""

    rt: Runtime
    server: LiveServer
    model: ScriptedModelClient
    home: DemoHome
    last_event_ids: list[int | None] = field(default_factory=list)
    """The `Last-Event-ID` of every push stream subscription, in order (None: the header was absent)."""

    @property
    def token_url(self) -> str:
        """The URL `dsh serve` prints on a first start: the UI with the token in its fragment."""
        return f"{self.server.base_url}/#token={self.server.token}"

    def end_streams(self) -> int:
        """End every open push stream from the server side (queued frames first); returns how many."""
        subscriptions = self.server.hub.subscribers()
        for subscription in subscriptions:
            subscription.finish()
        return len(subscriptions)


@contextlib.asynccontextmanager
async def serve_home(home: DemoHome, model: ScriptedModelClient) -> AsyncIterator[Served]:
    """Open a runtime on `home` with `model` and serve it on 127.0.0.1:0; records each stream's Last-Event-ID."""
    async with Runtime.open(demo_config(home.path), model=model) as rt, running_server(rt) as server:
        served = Served(rt, server, model, home)
        hub = server.hub
        subscribe = hub.subscribe

        def recording(session_ids: frozenset[str] | None, last_event_id: int | None) -> Any:
            served.last_event_ids.append(last_event_id)
            return subscribe(session_ids, last_event_id)

        hub.subscribe = recording  # type: ignore[method-assign]
        yield served


# ---------------------------------------------------------------- the browser


@dataclass
class Network:
    """The browser's requests: anything not on loopback is aborted and counted; the stream can be cut off."""

    foreign: list[str] = field(default_factory=list)
    block_stream: bool = False
    blocked_streams: int = 0
    stream_requests: int = 0
    stream_refused: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a stream request was refused while `block_stream` was on."""

    async def route(self, route: Any) -> None:
        """Playwright's route handler for every request of the context."""
        request = route.request
        parts = urlsplit(request.url)
        if parts.scheme not in ("http", "https") or parts.hostname not in _LOOPBACK_HOSTS:
            self.foreign.append(request.url)
            await route.abort("blockedbyclient")
            return
        if parts.path == "/api/v1/stream":
            self.stream_requests += 1
            if self.block_stream:
                self.blocked_streams += 1
                await route.abort("connectionrefused")
                self.stream_refused.set()
                return
        await route.continue_()


@dataclass
class BrowserSession:
    """One page in a fresh browser context, with its network guard and the dialogs that opened."""

    page: Any
    network: Network
    dialogs: list[str]
    console_errors: list[str]
    shots: Path

    async def screenshot(self, name: str) -> Path:
        """Save a PNG of the viewport as `<shots>/<name>.png`."""
        path = self.shots / f"{name}.png"
        await self.page.screenshot(path=str(path))
        return path


@contextlib.asynccontextmanager
async def browser_session(
    executable: str, shots: Path, *, width: int = 1280, height: int = 800
) -> AsyncIterator[BrowserSession]:
    """Launch chromium headless, open one page with every non-loopback request blocked."""
    api = playwright_api()
    api.expect.set_options(timeout=HANG_GUARD_MS)
    shots.mkdir(parents=True, exist_ok=True)
    async with api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS), headless=True)
        try:
            context = await browser.new_context(viewport={"width": width, "height": height}, service_workers="block")
            network = Network()
            await context.route("**/*", network.route)
            page = await context.new_page()
            page.set_default_timeout(HANG_GUARD_MS)
            dialogs: list[str] = []
            errors: list[str] = []

            async def dismiss(dialog: Any) -> None:
                dialogs.append(f"{dialog.type}: {dialog.message}")
                await dialog.dismiss()

            page.on("dialog", dismiss)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            yield BrowserSession(page, network, dialogs, errors, shots)
            await context.close()
        finally:
            await browser.close()
