"""The `title` and `tokens` projection units (docs/projections.md#tokens-and-titles).

Layer: agent, but light on purpose: it imports only the projection contract and the event type, so a
runtime that lists sessions (`dsh agents`, `dsh sessions`) registers these units without loading the
agent loop or the model contract (docs/architecture.md#import-cost). Both are pure folds: JSON-only
state, the same object for events they ignore, and they never raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dsh.projection.unit import ClientView, ProjectionUnit
from dsh.session.events import SessionEvent

__all__ = ["COUNTER_KEYS", "TITLE_KEY", "TOKENS_KEY", "add_counts", "title_unit", "tokens_unit", "usage_counts"]

TITLE_KEY: Final = "title"
TITLE_UNIT_VERSION: Final = 1
TOKENS_KEY: Final = "tokens"
TOKENS_UNIT_VERSION: Final = 1

USAGE_KEYS: Final = ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens", "reasoningTokens")
"""The disjoint usage counts of the harness's `TokenUsage`."""

COUNTER_KEYS: Final = (*USAGE_KEYS, "requests")
"""The counters of one total: the usage counts and the number of requests that reported usage."""

_ZERO: Final[Mapping[str, int]] = dict.fromkeys(COUNTER_KEYS, 0)


def usage_counts(event: Mapping[str, Any]) -> dict[str, int] | None:
    """The usage counts an `assistant/message` or `compaction/summary` carries (absent ones as 0), else None."""
    if event.get("type") not in ("assistant/message", "compaction/summary"):
        return None
    data = event.get("data")
    usage = data.get("usage") if isinstance(data, Mapping) else None
    if not isinstance(usage, Mapping):
        return None
    counts: dict[str, int] = {}
    for key in USAGE_KEYS:
        value = usage.get(key, 0)
        if type(value) is not int or value < 0:
            return None
        counts[key] = value
    return counts


def add_counts(counters: Mapping[str, Any] | None, counts: Mapping[str, int]) -> dict[str, int]:
    """`counters` plus one request's usage `counts` (a new object)."""
    base = counters if isinstance(counters, Mapping) else _ZERO
    out = {key: int(base.get(key, 0)) + counts.get(key, 0) for key in USAGE_KEYS}
    out["requests"] = int(base.get("requests", 0)) + 1
    return out


# ---------------------------------------------------------------------------- tokens


def _tokens_init() -> dict[str, Any]:
    return {}


def _tokens_apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
    try:
        kind = event.type
        if kind == "session/end-seed":
            return state if not state else {}
        data: Any = event.data
        if kind == "turn/start":
            turn = data.get("turn") if isinstance(data, Mapping) else None
            if type(turn) is not int:
                return state
            return {**state, "lastTurn": {"turn": turn, **_ZERO}}
        usage = usage_counts(event)
        if usage is None:
            return state
        if kind == "compaction/summary":
            model = data.get("model")
        else:
            source = data["message"].get("source") if isinstance(data.get("message"), Mapping) else None
            model = source.get("model") if isinstance(source, Mapping) else None
        model = model if isinstance(model, str) else ""
        models = dict(state.get("byModel") or {})
        models[model] = add_counts(models.get(model), usage)
        out = {**state, "total": add_counts(state.get("total"), usage), "byModel": models}
        # A summary request belongs to the session, not to a turn's steps.
        turn = data.get("turn") if kind == "assistant/message" else None
        last = state.get("lastTurn")
        if type(turn) is int:
            if isinstance(last, Mapping) and last.get("turn") == turn:
                out["lastTurn"] = {"turn": turn, **add_counts(last, usage)}
            else:
                out["lastTurn"] = {"turn": turn, **add_counts(None, usage)}
        return out
    except Exception:
        return state  # never raise: an unexpected shape leaves the fold where it was


def _tokens_render(state: object) -> dict[str, Any] | None:
    if not isinstance(state, dict) or not isinstance(state.get("total"), dict):
        return None
    return state


class _Schema:
    """The strict shape of the unit's state (and view): counters are non-negative integers."""

    def __init__(self, nullable: bool) -> None:
        self._nullable = nullable

    def validate_python(self, value: object, /) -> Any:
        if value is None and self._nullable:
            return None
        if not isinstance(value, dict) or not set(value) <= {"total", "byModel", "lastTurn"}:
            raise ValueError("tokens: expected an object with total, byModel and lastTurn")
        for name in ("total", "lastTurn"):
            if name in value:
                _counters(value[name], name, extra=("turn",) if name == "lastTurn" else ())
        models = value.get("byModel", {})
        if not isinstance(models, dict):
            raise ValueError("tokens.byModel: expected an object")
        for model, counters in models.items():
            _counters(counters, f"byModel[{model!r}]")
        return value


def _counters(value: object, where: str, extra: tuple[str, ...] = ()) -> None:
    if not isinstance(value, dict) or set(value) != {*COUNTER_KEYS, *extra}:
        raise ValueError(f"tokens.{where}: expected the counters {', '.join(COUNTER_KEYS)}")
    for key, number in value.items():
        if type(number) is not int or number < 0:
            raise ValueError(f"tokens.{where}.{key}: expected an integer >= 0")


def tokens_unit() -> ProjectionUnit[Any, Any]:
    """The `tokens` unit: `{total, byModel, lastTurn}` counters of the session's own requests (view `null` before)."""
    return ProjectionUnit(
        key=TOKENS_KEY,
        state_version=TOKENS_UNIT_VERSION,
        init=_tokens_init,
        apply=_tokens_apply,
        state_schema=_Schema(nullable=False),
        view=ClientView(render=_tokens_render, schema=_Schema(nullable=True)),
        event_types=frozenset({"assistant/message", "compaction/summary", "turn/start", "session/end-seed"}),
    )


# ---------------------------------------------------------------------------- title


def _title_init() -> dict[str, Any]:
    return {}


def _title_apply(state: dict[str, Any], event: SessionEvent) -> dict[str, Any]:
    if event.type != "session/title":
        return state
    data: Any = event.data
    title = data.get("title") if isinstance(data, Mapping) else None
    if not isinstance(title, str) or not title:
        return state
    source = data.get("source")
    kind = source.get("kind") if isinstance(source, Mapping) else None
    out: dict[str, Any] = {"title": title, "seq": event.seq}
    if isinstance(kind, str):
        out["kind"] = kind
    return out


def _title_render(state: object) -> str | None:
    title = state.get("title") if isinstance(state, dict) else None
    return title if isinstance(title, str) else None


class _StateSchema:
    def validate_python(self, value: object, /) -> Any:
        if not isinstance(value, dict) or not set(value) <= {"title", "seq", "kind"}:
            raise ValueError("title: expected an object with title, seq and kind")
        if value and (not isinstance(value.get("title"), str) or type(value.get("seq")) is not int):
            raise ValueError("title: expected a string title and an integer seq")
        if "kind" in value and not isinstance(value["kind"], str):
            raise ValueError("title.kind: expected a string")
        return value


class _ViewSchema:
    def validate_python(self, value: object, /) -> Any:
        if value is not None and not isinstance(value, str):
            raise ValueError("title: expected a string or null")
        return value


def title_unit() -> ProjectionUnit[Any, Any]:
    """The `title` unit: the latest `session/title`; its view is the title text or `null`."""
    return ProjectionUnit(
        key=TITLE_KEY,
        state_version=TITLE_UNIT_VERSION,
        init=_title_init,
        apply=_title_apply,
        state_schema=_StateSchema(),
        view=ClientView(render=_title_render, schema=_ViewSchema()),
        event_types=frozenset({"session/title"}),
    )
