"""Session titles: the `title` projection unit, the fallback rule and the model-written title.

Layer: agent. A title is a log-only `session/title` event `{title, messageSeqs, source}`, latest wins
(the harness's vocabulary). The loop writes the **fallback** title in a session's first turn, right
after the first user message: its first five words, at most 60 characters, controls and runs of
whitespace removed. When `agent.model_titles` is on, the agent also asks the model
for a short title in the background: it records the exact request as `session/title-llm-request`
(the harness's shape) and, when the model answers with usable text, a second `session/title` whose
source is `{kind: "provider", provider: "pydsh/model-title", model: {provider, model}}`. That task
never delays a turn and its failure only logs (docs/agent.md#titles).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from dsh.abort import AbortController
from dsh.agent.assembler import MessageAssembler
from dsh.agent.ids import IdFactory
from dsh.agent.messages import text, text_of_blocks
from dsh.agent.model import ModelClient, ModelRequest, RequestMeta
from dsh.session.events import SessionEvent
from dsh.session.session import Session

__all__ = [
    "FALLBACK_MAX_CHARS",
    "FALLBACK_MAX_WORDS",
    "MODEL_TITLE_PROVIDER",
    "TITLE_SYSTEM_PROMPT",
    "TitleWriter",
    "fallback_title",
    "normalize_title",
]

_log = logging.getLogger("dsh.agent")

FALLBACK_MAX_WORDS: Final = 5
FALLBACK_MAX_CHARS: Final = 60
MODEL_TITLE_MAX_CHARS: Final = 80
MODEL_TITLE_PROVIDER: Final = "pydsh/model-title"
MODEL_TITLE_MAX_TOKENS: Final = 32

TITLE_SYSTEM_PROMPT: Final = (
    "You name conversations. Reply with a title of at most six words for the conversation the user "
    "starts with the message below: plain text on one line, no quotes, no trailing punctuation, in the "
    "language of the message. Reply with the title only."
)

_CONTROLS: Final = re.compile(
    r"(?:\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$))|(?:\x1b\[[0-?]*[ -/]*[@-~])|(?:\x1b[@-_])"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
)
_SPACE: Final = re.compile(r"\s+")


def _clean(text: str) -> str:
    return _SPACE.sub(" ", _CONTROLS.sub("", text)).strip()


def normalize_title(text: str, max_chars: int = MODEL_TITLE_MAX_CHARS) -> str:
    """One clean line of at most `max_chars` characters (terminal escapes and controls removed)."""
    return _clean(text)[:max_chars].rstrip()


def fallback_title(text: str) -> str:
    """The first five words of `text`, at most 60 characters ("" when it has no words)."""
    words = _clean(text).split(" ")
    return " ".join(word for word in words[:FALLBACK_MAX_WORDS] if word)[:FALLBACK_MAX_CHARS].rstrip()


def _is_prompt(event: SessionEvent) -> bool:
    """A `user/message` someone sent: not a tool result, not a plugin's context message."""
    if event.type != "user/message":
        return False
    data: Any = event.data
    source = data.get("source") if isinstance(data, Mapping) else None
    return isinstance(source, Mapping) and source.get("kind") not in ("plugin", "tool")


def title_event(title: str, message_seqs: list[int], source: Mapping[str, Any]) -> dict[str, Any]:
    """The data of a `session/title` event."""
    return {"title": title, "messageSeqs": message_seqs, "source": dict(source)}


# ---------------------------------------------------------------------------- the writer


class TitleWriter:
    """One agent's titles: the fallback in the first turn and, when asked, the model-written one.

    The model-written title runs as a background task that never delays a turn; `aclose()` cancels
    it. Every failure of that task is logged, never raised: a title is a nicety.
    """

    def __init__(
        self,
        session: Session,
        ids: IdFactory,
        route: Callable[[], tuple[ModelClient, str]],
    ) -> None:
        self._session = session
        self._ids = ids
        self._route = route
        self._titled: bool | None = None  # whether the log has a title, scanned once
        self._task: asyncio.Task[None] | None = None

    def first_message(self, item: Any, seq: int, *, model_titles: bool = False) -> None:
        """Title the session when it has no title yet: from its first message someone sent (a session
        written before titles existed is titled from that one, not from the newest)."""
        if self._titled is None:
            self._titled = any(event.type == "session/title" for event in self._session.events)
        if self._titled:
            return
        source = item.source if isinstance(item.source, Mapping) else {}
        if source.get("kind") == "plugin":
            return
        first = next((event for event in self._session.events if _is_prompt(event)), None)
        if first is not None and first.seq != seq:
            data: Any = first.data
            seq, content = first.seq, text_of_blocks(data.get("content") or ())
        else:
            content = text_of_blocks(item.content)
        title = fallback_title(content)
        if not title:
            return
        self._titled = True
        self._session.append("session/title", title_event(title, [seq], {"kind": "fallback"}))
        if model_titles and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._model_title(content, seq), name=f"dsh-title-{self._session.id}"
            )

    async def wait(self) -> None:
        """Wait for the background title request, if one runs (tests and `dsh run` use it)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the background title request, if one still runs."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _model_title(self, content: str, seq: int) -> None:
        client, model = self._route()
        message = {"id": self._ids.message(), "role": "user", "content": [text(content)], "source": {"kind": "user"}}
        request = ModelRequest(
            model=model,
            system=TITLE_SYSTEM_PROMPT,
            messages=[message],
            tools=[],
            meta=RequestMeta(self._session.id, "title", 0, 0),
            max_tokens=MODEL_TITLE_MAX_TOKENS,
        )
        route = {"provider": client.provider, "model": model}
        try:
            self._session.append(
                "session/title-llm-request",
                {
                    "titleProvider": MODEL_TITLE_PROVIDER,
                    "messageSeqs": [seq],
                    "route": route,
                    "system": TITLE_SYSTEM_PROMPT,
                    "messages": [message],
                    "maxTokens": MODEL_TITLE_MAX_TOKENS,
                },
            )
            assembler = MessageAssembler()
            stream = client.stream(request, signal=AbortController().signal)
            try:
                async for chunk in stream:
                    assembler.feed(chunk)
            finally:
                close = getattr(stream, "aclose", None)
                if close is not None:
                    await close()
            title = normalize_title(assembler.text().strip().strip("\"'`").rstrip(".!?。"))
            if not title or assembler.finish not in ("stop", "length"):
                _log.info('session "%s": the model wrote no usable title', self._session.id)
                return
            source = {"kind": "provider", "provider": MODEL_TITLE_PROVIDER, "model": route}
            self._session.append("session/title", title_event(title, [seq], source))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            _log.info('session "%s": the model title failed: %s', self._session.id, error)
