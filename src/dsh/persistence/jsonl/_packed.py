"""Packed chunk rows: how a JSONL line written by the TypeScript harness folds a run of chunk deltas.

Layer: persistence (private to `dsh.persistence.jsonl`). The TypeScript harness writes, by default,
each run of three or more consecutive `assistant/chunk` deltas of one kind and one stream block as
one line (docs/storage-format.md#compatibility-with-the-typescript-harness). Such a line is a
storage record, not an event: its `type` is `text-chunks`, `reasoning-chunks` or
`tool-call-chunks`, it carries `seq0`/`time0` instead of `seq`/`time`, and it stands for exactly
the events it folds. This module checks one parsed row exactly and expands it; the line scanner
(`_format`) decides what a refused row means for the log (a defect of its line, like any other).
dsh reads these rows and never writes them.

A row is accepted only in its exact shape, because a row that decodes "almost" would silently lose
or invent a whole run of deltas:

* envelope: exactly `type`, `seq0` (non-negative safe integer), `time0` (safe integer), `data`;
* data: exactly `turn`, `step`, `index`, `dt` and `texts` (text and reasoning rows), or `turn`,
  `step`, `index`, `id`, `name` (optional), `dt` and `args` (tool-call rows);
* `turn`, `step` and `index` are numbers (the event rules judge them after expansion), `id` and
  `name` strings, `texts`/`args` a non-empty list of strings, `dt` a list of safe integers one
  shorter than the members;
* every reconstructed seq and time stays a safe integer.

Member `k` becomes `{"type": "assistant/chunk", "seq": seq0 + k, "time": time0 + dt[0] + ... +
dt[k-1], "data": {"turn", "step", "chunk"}}`; a gap may be negative (the writer's clock stepped
back). The chunk is `{"type": "text-delta" | "reasoning-delta", "index", "text"}` or
`{"type": "tool-call-delta", "index", "id", "name"?, "argumentsDelta"}`.
"""

from __future__ import annotations

from typing import Any, Final

from dsh.json import SAFE_INT_MAX, is_safe_int

__all__ = ["ROW_TYPES", "MalformedRowError", "expand_row"]

ROW_TYPES: Final = frozenset({"text-chunks", "reasoning-chunks", "tool-call-chunks"})
"""The `type` tags of packed rows; every line carrying one of them is read as a packed row."""

_ENVELOPE: Final = frozenset({"type", "seq0", "time0", "data"})
_TEXT_KEYS: Final = frozenset({"turn", "step", "index", "dt", "texts"})
_CALL_KEYS: Final = frozenset({"turn", "step", "index", "id", "dt", "args"})
_NAMED_CALL_KEYS: Final = _CALL_KEYS | {"name"}
_DELTA_TYPE: Final = {"text-chunks": "text-delta", "reasoning-chunks": "reasoning-delta"}


class MalformedRowError(ValueError):
    """A packed row that is not exactly the shape the writer produces; the message says what is wrong."""


def _is_number(value: object) -> bool:
    # A JSON number: an int or a float, never a bool (JSON `true` is not a number).
    return type(value) is int or type(value) is float


def _members(data: dict[str, Any], payload_key: str) -> list[str]:
    """Check the fields every row shares and return its member payloads."""
    if not (_is_number(data["turn"]) and _is_number(data["step"]) and _is_number(data["index"])):
        raise MalformedRowError("turn, step and index must be numbers")
    payload = data[payload_key]
    if type(payload) is not list or not payload or any(type(item) is not str for item in payload):
        raise MalformedRowError(f"{payload_key} must be a non-empty array of strings")
    gaps = data["dt"]
    if type(gaps) is not list or not all(is_safe_int(gap) for gap in gaps):
        raise MalformedRowError("dt must be an array of safe integers")
    if len(gaps) != len(payload) - 1:
        raise MalformedRowError(f"dt has {len(gaps)} gaps for {len(payload)} members (expected {len(payload) - 1})")
    return payload


def expand_row(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The `assistant/chunk` records a packed row stands for, in order (fresh dicts, canonical key order).

    Args:
        row: One parsed line whose `type` is in `ROW_TYPES`.

    Raises:
        MalformedRowError: The row is not exactly a packed row (see the module docstring).
    """
    kind = row["type"]
    if row.keys() != _ENVELOPE:
        raise MalformedRowError("the row must hold exactly type, seq0, time0 and data")
    seq0 = row["seq0"]
    time0 = row["time0"]
    if not (is_safe_int(seq0) and seq0 >= 0):
        raise MalformedRowError("seq0 must be a non-negative safe integer")
    if not is_safe_int(time0):
        raise MalformedRowError("time0 must be a safe integer")
    data = row["data"]
    if type(data) is not dict:
        raise MalformedRowError("data must be an object")
    if kind == "tool-call-chunks":
        named = data.keys() == _NAMED_CALL_KEYS
        if not named and data.keys() != _CALL_KEYS:
            raise MalformedRowError("data must hold exactly turn, step, index, id, name (optional), dt and args")
        if type(data["id"]) is not str or (named and type(data["name"]) is not str):
            raise MalformedRowError("id (and name, when present) must be strings")
        members = _members(data, "args")
    else:
        if data.keys() != _TEXT_KEYS:
            raise MalformedRowError("data must hold exactly turn, step, index, dt and texts")
        named = False
        members = _members(data, "texts")
    if seq0 + len(members) - 1 > SAFE_INT_MAX:
        raise MalformedRowError("member seqs must stay safe integers")
    times = [time0]
    for gap in data["dt"]:
        times.append(times[-1] + gap)
        if not is_safe_int(times[-1]):
            raise MalformedRowError("member times must stay safe integers")
    turn, step, index = data["turn"], data["step"], data["index"]
    records: list[dict[str, Any]] = []
    for k, member in enumerate(members):
        if kind == "tool-call-chunks":
            chunk: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": data["id"]}
            if named:
                chunk["name"] = data["name"]
            chunk["argumentsDelta"] = member
        else:
            chunk = {"type": _DELTA_TYPE[kind], "index": index, "text": member}
        records.append(
            {
                "type": "assistant/chunk",
                "seq": seq0 + k,
                "time": times[k],
                "data": {"turn": turn, "step": step, "chunk": chunk},
            }
        )
    return records
