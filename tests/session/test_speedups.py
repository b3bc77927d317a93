"""The optional C helpers of the read path (`dsh._speedups`): records handed out in place, the text
hazards, the switch back to pure Python, and that CI always runs with the helpers built."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._accel import speedups
from dsh._lazy_json import LazyFrozenDict, LazyFrozenList
from dsh.json import SAFE_INT_MAX, FrozenDict
from dsh.session.events import KNOWN_EVENT_TYPES, SessionEvent
from dsh.session.fastcheck import fast_check
from dsh.session.stored import may_hold_negative_zero
from tests.helpers import examples

_ROOT = Path(__file__).resolve().parents[2]

needs_c = pytest.mark.skipif(speedups is None, reason="dsh._speedups is not built: the pure-Python twins run")


def _records() -> list[dict[str, Any]]:
    """Four freshly parsed records: certain, certain with a list payload, unsure (ignorable), certain."""
    text = (
        b"["
        + b",".join(
            [
                b'{"type":"turn/start","seq":0,"time":5,"data":{"turn":1}}',
                b'{"type":"session/title","seq":1,"time":5,"data":[1,{"a":[2]}]}',
                b'{"type":"x/custom","seq":2,"time":5,"data":{"n":1},"ignorable":true}',
                b'{"type":"step/start","seq":3,"time":5,"data":{"turn":1,"step":1}}',
            ]
        )
        + b"]"
    )
    records: list[dict[str, Any]] = orjson.loads(text)
    return records


@needs_c
def test_freezing_turns_each_certain_record_into_its_event_without_a_copy() -> None:
    """With `freeze`, a certain record becomes a `SessionEvent` (the same object) whose payload is a lazy
    view; a record the check is unsure of stays a plain dict; nothing changes value."""
    assert speedups is not None
    records = _records()
    before = [orjson.dumps(record) for record in records]
    objects = list(records)
    verdicts, types = speedups.check_records(records, 0, True)
    assert verdicts == bytes([1, 1, 0, 1])
    assert [a is b for a, b in zip(records, objects, strict=True)] == [True] * 4
    assert [type(record) for record in records] == [SessionEvent, SessionEvent, dict, SessionEvent]
    assert [type(record["data"]) for record in records] == [LazyFrozenDict, LazyFrozenList, dict, LazyFrozenDict]
    assert [orjson.dumps(record) for record in records] == before
    # The shared type strings are the library's own objects for known types.
    known = {kind: kind for kind in KNOWN_EVENT_TYPES}
    assert types[0] is known["turn/start"]
    assert types[2] == "x/custom"


@needs_c
def test_events_made_in_place_are_immutable_all_the_way_down() -> None:
    """Every mutator of an event made in place, and of each child reached through it, raises."""
    assert speedups is not None
    records = _records()
    speedups.check_records(records, 0, True)
    event: Any = records[1]
    with pytest.raises(TypeError):
        event["type"] = "x"
    data = event.data
    with pytest.raises(TypeError):
        data.append(3)
    child = data[1]
    assert type(child) is LazyFrozenDict
    assert data[1] is child  # the child became its view in place: the same object every time
    with pytest.raises(TypeError):
        child["a"] = 1
    with pytest.raises(TypeError):
        child["a"].append(1)
    assert isinstance(event, FrozenDict)
    assert event == {"type": "session/title", "seq": 1, "time": 5, "data": [1, {"a": [2]}]}


@needs_c
def test_events_made_in_place_hold_their_type_and_are_released() -> None:
    """Each event made in place holds one reference to its class, given back when it is released."""
    assert speedups is not None
    gc.collect()
    events_before = sys.getrefcount(SessionEvent)
    views_before = sys.getrefcount(LazyFrozenDict)
    batch = [_records() for _ in range(200)]
    for records in batch:
        speedups.check_records(records, 0, True)
    assert sys.getrefcount(SessionEvent) == events_before + 3 * 200
    assert sys.getrefcount(LazyFrozenDict) == views_before + 2 * 200
    del batch, records
    gc.collect()
    assert sys.getrefcount(SessionEvent) == events_before
    assert sys.getrefcount(LazyFrozenDict) == views_before


@needs_c
def test_the_c_safe_integer_bound_is_the_libraries() -> None:
    """The C check's safe-integer bound is `dsh.json.SAFE_INT_MAX`."""
    assert speedups is not None
    assert speedups.SAFE_INT_MAX == SAFE_INT_MAX


@needs_c
def test_configure_refuses_classes_that_add_storage() -> None:
    """Only subclasses of dict and list that add no storage may be handed out in place."""
    assert speedups is not None

    class WithDict(dict[str, Any]):
        pass

    with pytest.raises(TypeError, match="add no storage"):
        speedups.configure(tuple(KNOWN_EVENT_TYPES), WithDict, LazyFrozenDict, LazyFrozenList)
    with pytest.raises(TypeError, match="add no storage"):
        speedups.configure(tuple(KNOWN_EVENT_TYPES), SessionEvent, LazyFrozenList, LazyFrozenList)
    with pytest.raises(TypeError, match="add no storage"):
        speedups.retype_view({}, dict, list)


@needs_c
def test_stale_key_objects_only_cost_speed() -> None:
    """Verdicts stay right when the check's key objects are not the parser's (keys built afresh)."""
    assert speedups is not None
    fresh = {"".join(["ty", "pe"]): 0, "".join(["se", "q"]): 0, "".join(["da", "ta"]): 0}
    speedups.learn_keys(fresh)
    try:
        records = _records()
        verdicts, _types = speedups.check_records(records, 0, False)
        assert list(verdicts) == [fast_check(record, index) for index, record in enumerate(records)]
    finally:
        speedups.learn_keys(orjson.loads(orjson.dumps(dict.fromkeys(speedups.KEYS, 0))))


_LONG_RUN = re.compile(rb"[0-9]{19}")


@needs_c
@settings(max_examples=examples(2000), deadline=None)
@given(st.binary(max_size=80).map(lambda raw: bytes(b'-0123456789.eE,{}"x'[byte % 19] for byte in raw)))
def test_text_hazards_agree_with_the_pure_python_searches(text: bytes) -> None:
    """The one-pass C scan reports a 19-digit run exactly when the regex finds one, and a possible
    `-0.0` exactly when the read path's regex does."""
    assert speedups is not None
    hazards = speedups.text_hazards(text)
    assert bool(hazards & speedups.HAZARD_LONG_DIGITS) == (_LONG_RUN.search(text) is not None)
    assert bool(hazards & speedups.HAZARD_NEGATIVE_ZERO) == may_hold_negative_zero(text)


@needs_c
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b'{"a":-0}', 2),
        (b'{"a":-0.0}', 2),
        (b'{"a":-0.5}', 0),
        (b'{"a":-1e-400}', 2),
        (b'{"a":-0.5E-9}', 2),
        (b'{"d":"2024-01-05"}', 0),
        (b'{"a":1234567890123456789}', 1),
        (b'{"a":123456789012345678}', 0),
        (b'{"a":-12345678901234567890e-5}', 3),
        (b"", 0),
        (b"-", 0),
        (b"-0", 2),
    ],
)
def test_text_hazards_examples(text: bytes, expected: int) -> None:
    """Known spellings: `-0` forms and underflowing negative exponents, dates, 18 and 19 digit runs."""
    assert speedups is not None
    assert speedups.text_hazards(text) == expected


def test_ci_runs_with_the_c_helpers_built() -> None:
    """On CI the helpers must be built, so the suite checks the read path users run (locally, a build
    without a compiler may fall back to pure Python)."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("not on CI: the helpers are optional where no compiler is installed")
    assert os.environ.get("DSH_PURE_PYTHON", "") in ("", "0")
    assert speedups is not None


def test_the_environment_switch_turns_the_helpers_off() -> None:
    """`DSH_PURE_PYTHON=1` makes `dsh` run its pure-Python read path."""
    code = "import dsh._accel as accel; print(accel.speedups is None)"
    env = {**os.environ, "DSH_PURE_PYTHON": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"


@pytest.mark.slow
def test_the_read_path_suites_pass_in_pure_python() -> None:
    """The read path's own tests pass with the helpers switched off, so the fallback stays correct."""
    suites = [
        "tests/persistence/test_jsonl_read_path.py",
        "tests/persistence/test_jsonl_damage.py",
        "tests/persistence/test_jsonl_format.py",
        "tests/persistence/test_jsonl_packed_rows.py",
        "tests/persistence/test_coordinator_reads.py",
        "tests/persistence/test_legacy_shapes.py",
        "tests/session/test_session_fastcheck.py",
    ]
    assert all((_ROOT / suite).exists() for suite in suites)
    env = {**os.environ, "DSH_PURE_PYTHON": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *suites]
    done = subprocess.run(command, check=False, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
