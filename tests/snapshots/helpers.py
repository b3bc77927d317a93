"""Helpers of the headless snapshot tests: the snapshot folders, stored-log reading and the normalizer.

A snapshot compares what a keyless run leaves behind with an expected file in
`examples/headless-agent/snapshots/<name>/`. Before the comparison the normalizer removes what
legitimately differs between machines and runs: the working directory and the home folder become
`{{cwd}}` and `{{home}}`; every event `time` and the header's `createdAt` become `{{time}}`; and
every UUID-shaped id (message ids, random or sequential) becomes `{{id-N}}`, numbered by first
appearance, except the fixed session ids a scenario pins. Whatever survives that is behaviour, so a
difference fails with a unified diff (`assert_golden`); `DSH_SNAPSHOT=refresh` rewrites the files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from dsh.persistence.jsonl import JsonlBackend
from tests.tools.helpers import assert_golden

__all__ = ["SNAPSHOTS", "assert_golden", "normalize_log", "normalize_text", "stored_log"]

SNAPSHOTS = Path(__file__).resolve().parents[2] / "examples" / "headless-agent" / "snapshots"
"""`examples/headless-agent/snapshots/`: one folder per scenario (script, expected files)."""

_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_TIME_KEYS = frozenset({"time", "createdAt"})


async def stored_log(sessions_dir: Path, session_id: str) -> list[dict[str, Any]]:
    """The stored header record, then every event record, as the JSONL backend reads them."""
    backend = JsonlBackend(sessions_dir)
    await backend.open()
    try:
        stored = await backend.load(session_id)
    finally:
        await backend.close()
    assert stored is not None, f"no stored session {session_id}"
    return [dict(stored.header), *(dict(record) for record in stored.events)]


def normalize_text(text: str, paths: Mapping[str, str]) -> str:
    """Replace each path (longest first) by its placeholder and strip trailing blanks of every line."""
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, paths[path])
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


class _Ids:
    def __init__(self, keep: Collection[str]) -> None:
        self.keep = frozenset(keep)
        self.seen: dict[str, str] = {}

    def __call__(self, match: re.Match[str]) -> str:
        value = match.group(0)
        if value in self.keep:
            return value
        return self.seen.setdefault(value, f"{{{{id-{len(self.seen) + 1}}}}}")


# The per-turn context names the local time and zone: both depend on the machine, not on the run.
_NOW = re.compile(r"(at the start of turn \d+: )[^\n]*?\)\.")


def _walk(value: Any, paths: Mapping[str, str], ids: _Ids) -> Any:
    if isinstance(value, str):
        for path in sorted(paths, key=len, reverse=True):
            value = value.replace(path, paths[path])
        value = _NOW.sub(r"\1{{now}}.", value)
        return _UUID.sub(ids, value)
    if isinstance(value, Mapping):
        return {
            key: "{{time}}" if key in _TIME_KEYS and isinstance(item, int) else _walk(item, paths, ids)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_walk(item, paths, ids) for item in value]
    return value


def normalize_log(records: Sequence[Mapping[str, Any]], paths: Mapping[str, str], keep_ids: Collection[str]) -> str:
    """One JSON line per record (sorted keys), with paths, times and unpinned ids replaced."""
    ids = _Ids(keep_ids)
    lines = [json.dumps(_walk(record, paths, ids), ensure_ascii=False, sort_keys=True) for record in records]
    return "".join(line + "\n" for line in lines)
