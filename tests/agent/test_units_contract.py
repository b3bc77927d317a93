"""The `title` and `tokens` units keep the projection-unit contract and fold what the docs say."""

from __future__ import annotations

from typing import Any

import pytest

from dsh.agent.units import title_unit, tokens_unit
from dsh.projection.unit import ProjectionUnit
from dsh.session.events import make_event
from dsh.testing import check_unit
from tests.helpers import examples


def _usage(turn: int, model: str, **usage: int) -> dict[str, Any]:
    message = {
        "id": f"m{turn}",
        "role": "assistant",
        "content": [],
        "source": {"kind": "model", "provider": "p", "model": model},
    }
    return {
        "type": "assistant/message",
        "data": {"turn": turn, "step": 1, "message": message, "usage": usage},
        "time": 1,
    }


_REPRESENTATIVE: list[dict[str, Any]] = [
    {"type": "turn/start", "data": {"turn": 1}, "time": 1},
    {
        "type": "session/title",
        "data": {"title": "First", "messageSeqs": [1], "source": {"kind": "fallback"}},
        "time": 1,
    },
    _usage(1, "a", inputTokens=10, outputTokens=2),
    _usage(1, "b", inputTokens=5, outputTokens=1, cacheReadTokens=7),
    {"type": "compaction/summary", "data": {"model": "a", "usage": {"inputTokens": 3, "outputTokens": 4}}, "time": 1},
    {"type": "session/title", "data": {"title": 7}, "time": 1},
    {"type": "turn/start", "data": {"turn": 2}, "time": 1},
    _usage(2, "a", inputTokens=-1, outputTokens=2),
    {"type": "session/end-seed", "data": {}, "time": 1},
    _usage(2, "a", inputTokens=1, outputTokens=1),
    {
        "type": "session/title",
        "data": {"title": "Model's", "messageSeqs": [1], "source": {"kind": "provider"}},
        "time": 1,
    },
]


@pytest.mark.parametrize("unit", [title_unit(), tokens_unit()], ids=["title", "tokens"])
def test_both_units_keep_the_unit_contract(unit: ProjectionUnit[Any, Any]) -> None:
    """`check_unit`: pure init, no raise, same object for undeclared types, restore == live fold."""
    check_unit(unit, _REPRESENTATIVE, max_examples=examples(40))


def _fold(unit: ProjectionUnit[Any, Any], records: list[dict[str, Any]]) -> Any:
    state = unit.init()
    for seq, record in enumerate(records):
        state = unit.apply(state, make_event(record["type"], seq, record["time"], record["data"]))
    return state


def test_tokens_sum_per_model_and_turn_skip_bad_usage_and_restart_after_a_seed() -> None:
    """Totals add each usage per model and for the latest turn; a negative count is ignored; an end-seed starts the
    count of the session's own requests again."""
    state = _fold(tokens_unit(), _REPRESENTATIVE[:8])
    assert state["total"] == {
        "inputTokens": 18,
        "outputTokens": 7,
        "cacheReadTokens": 7,
        "cacheWriteTokens": 0,
        "reasoningTokens": 0,
        "requests": 3,
    }
    assert state["byModel"]["a"]["requests"] == 2
    assert state["lastTurn"] == {"turn": 2, **dict.fromkeys(state["total"], 0)}
    after_seed = _fold(tokens_unit(), _REPRESENTATIVE)
    assert after_seed["total"]["requests"] == 1
    assert after_seed["lastTurn"]["turn"] == 2


def test_the_latest_usable_title_wins() -> None:
    """A title without text is skipped; the last usable `session/title` is the view."""
    unit = title_unit()
    assert unit.view is not None
    assert unit.view.render(_fold(unit, _REPRESENTATIVE[:6])) == "First"
    assert unit.view.render(_fold(unit, _REPRESENTATIVE)) == "Model's"
    assert unit.view.render(unit.init()) is None
