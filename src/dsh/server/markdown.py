"""Assistant messages as safe HTML: markdown rendered by `markdown-it-py`, sanitized by `nh3`.

Layer: server (presentation only: nothing stored changes). History pages carry the rendering of each
`assistant/message` as the entry's `view.html` (docs/ui.md#markdown); the web UI shows it once a
message is complete and plain text while it streams.

Two independent walls keep a message from running code in the page:

* the parser is CommonMark with raw HTML **off**: `<script>`, `<img onerror=…>` or `<iframe>` written
  in a message are text, shown as the characters they are; link targets that are not `http`,
  `https` or `mailto` are not links (markdown-it-py's own check refuses `javascript:`, `vbscript:`,
  `file:` and most `data:`);
* the output then goes through `nh3` with a short allow-list of tags and attributes and the same
  URL schemes, so anything the parser might let through is dropped before it leaves the server.

Images are never loaded: `![alt](url)` becomes a link to the URL with the alt text, so a message
cannot make the browser fetch anything (the page's content security policy would refuse a foreign
image anyway). Links open in a new tab with `rel="noopener noreferrer"`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Final

import nh3
from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["ALLOWED_TAGS", "URL_SCHEMES", "assistant_text", "render_markdown"]

ALLOWED_TAGS: Final = frozenset(
    {
        "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li",
        "ol", "p", "pre", "s", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
    }
)  # fmt: skip
"""The tags a rendered message may contain."""

URL_SCHEMES: Final = frozenset({"http", "https", "mailto"})
"""The URL schemes a link may use; anything else loses its `href`."""

_ATTRIBUTES: Final[Mapping[str, set[str]]] = {
    "a": {"href", "title"},
    "code": {"class"},
    "ol": {"start"},
    "td": {"align"},
    "th": {"align"},
}

_CACHED: Final = 2048


def _image_as_link(renderer: Any, tokens: Sequence[Token], index: int, options: Any, env: Any) -> str:
    token = tokens[index]
    src = token.attrGet("src")
    alt = token.content or "image"
    escaped_alt = alt.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    if not isinstance(src, str) or not src:
        return escaped_alt
    href = src.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<a href="{href}">{escaped_alt}</a>'


@functools.cache
def _parser() -> MarkdownIt:
    parser = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    parser.enable(["table", "strikethrough"])
    parser.add_render_rule("image", _image_as_link)
    return parser


@functools.lru_cache(maxsize=_CACHED)
def render_markdown(text: str) -> str:
    """`text` (markdown) as sanitized HTML: only `ALLOWED_TAGS`, no script, handler or foreign scheme."""
    rendered = _parser().render(text)
    return nh3.clean(
        rendered,
        tags=set(ALLOWED_TAGS),
        attributes={tag: set(names) for tag, names in _ATTRIBUTES.items()},
        url_schemes=set(URL_SCHEMES),
        link_rel="noopener noreferrer",
        set_tag_attribute_values={"a": {"target": "_blank"}},
        strip_comments=True,
    )


def assistant_text(event: Mapping[str, Any]) -> str | None:
    """The text blocks of an `assistant/message` event's message, joined; None for any other event."""
    if event.get("type") != "assistant/message":
        return None
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = [
        block["text"]
        for block in content
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
    ]
    return "\n\n".join(parts) if parts else None
