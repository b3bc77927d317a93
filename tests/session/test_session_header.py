"""Session headers: creation defaults, validation texts, the stored form and the lifecycle witness."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import pytest

from dsh.session import SESSION_FORMAT_VERSION, HeaderInit, SessionError, SessionHeader, SessionStore
from dsh.session.header import StoredHeaderError, header_problem
from dsh.session.ids import encode_segment, new_session_id

_ULID = re.compile(r"^[0-9a-hjkmnp-tv-z]{26}$")
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def _ulid_ms(value: str) -> int:
    number = 0
    for ch in value[:10]:
        number = number * 32 + _CROCKFORD.index(ch)
    return number


def _invalid_header(store: SessionStore, **fields: Any) -> SessionError:
    with pytest.raises(SessionError) as caught:
        store.create(header=HeaderInit(**fields))
    assert caught.value.code == "INVALID_HEADER"
    return caught.value


def test_thousand_creates_mint_distinct_ulids(clock: Any) -> None:
    """1,000 creates with the real id factory give distinct 26-char ULIDs and default headers."""
    store = SessionStore(clock=clock)
    before_ms = time.time_ns() // 1_000_000
    seen: set[str] = set()
    for _ in range(1000):
        expected_created_at = clock.now
        session = store.create()
        header = session.header
        assert _ULID.match(session.id), session.id
        assert header.id == session.id
        assert header.version == 0 == SESSION_FORMAT_VERSION
        assert header.created_at == expected_created_at
        assert header.is_seeded is False
        assert header.delegation_depth == 0
        assert header.cwd is None
        assert header.parent_session is None
        assert header.origin is None
        assert header.agent_preset is None
        seen.add(session.id)
    after_ms = time.time_ns() // 1_000_000
    assert len(seen) == 1000
    # The 48-bit prefix is the wall-clock millisecond of minting (a ULID, not a counter).
    assert all(before_ms <= _ulid_ms(value) <= after_ms for value in seen)


def test_new_session_id_is_lowercase_crockford() -> None:
    """A minted id is 26 lowercase Crockford base-32 characters."""
    assert _ULID.match(new_session_id())


def test_relative_cwd_is_refused(store: SessionStore) -> None:
    """A relative cwd is refused with the upstream text."""
    error = _invalid_header(store, cwd="rel/dir")
    assert error.message == 'session header cwd must be an absolute path, got "rel/dir"'
    assert store.list() == ()


def test_absolute_cwd_is_kept_verbatim(store: SessionStore) -> None:
    """An absolute cwd is stored exactly as given, never normalised."""
    session = store.create(header=HeaderInit(cwd="/work//x/../y/"))
    assert session.header.cwd == "/work//x/../y/"


@pytest.mark.parametrize("value", [-1, 1.5, True, 2**53])
def test_invalid_created_at_is_refused(store: SessionStore, value: object) -> None:
    """createdAt of -1, 1.5, True or 2**53 is refused with the createdAt text."""
    error = _invalid_header(store, created_at=value)
    assert error.message == "session header createdAt must be a non-negative safe integer"


def test_explicit_created_at_is_used(store: SessionStore) -> None:
    """A supplied createdAt (a safe non-negative int) replaces the store clock."""
    assert store.create(header=HeaderInit(created_at=0)).header.created_at == 0
    assert store.create(header=HeaderInit(created_at=2**53 - 1)).header.created_at == 2**53 - 1


def test_invalid_origin_names_the_field(store: SessionStore) -> None:
    """origin="child" is refused naming origin."""
    error = _invalid_header(store, origin="child")
    assert error.message == 'session header origin must be "subagent"'


@pytest.mark.parametrize("value", [-1, 1.5, True, 2**53, "1"])
def test_invalid_delegation_depth_names_the_field(store: SessionStore, value: object) -> None:
    """A negative (or otherwise unsafe) delegation depth is refused naming delegationDepth."""
    error = _invalid_header(store, delegation_depth=value)
    assert error.message == "session header delegationDepth must be a non-negative safe integer"


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"parent_session": ""}, "session header parentSession must be a string"),
        ({"parent_session": 7}, "session header parentSession must be a string"),
        ({"agent_preset": 7}, "session header agentPreset must be a string"),
        ({"cwd": 5}, "session header cwd must be an absolute path, got 5"),
        ({"cwd": ""}, 'session header cwd must be an absolute path, got ""'),
    ],
)
def test_other_header_fields_use_upstream_texts(store: SessionStore, fields: dict[str, Any], text: str) -> None:
    """parentSession, agentPreset and cwd failures carry the upstream texts."""
    assert _invalid_header(store, **fields).message == text


@pytest.mark.parametrize("field", ["cwd", "parent_session", "agent_preset"])
def test_header_strings_with_lone_surrogates_are_refused(store: SessionStore, field: str) -> None:
    """Header strings cross the JSON boundary: a lone surrogate is refused as INVALID_HEADER."""
    error = _invalid_header(store, **{field: "/bad\ud800"})
    assert "lone surrogate" in error.message


def test_full_header_is_built_from_init(store: SessionStore, clock: Any) -> None:
    """Every HeaderInit field lands in the logical header; isSeeded is derived from the cut."""
    stamp = clock.now
    session = store.create(
        "full",
        header=HeaderInit(cwd="/w", parent_session="p", delegation_depth=2, origin="subagent", agent_preset="coder"),
    )
    assert session.header == SessionHeader(
        version=0,
        id="full",
        created_at=stamp,
        cwd="/w",
        parent_session="p",
        is_seeded=False,
        delegation_depth=2,
        origin="subagent",
        agent_preset="coder",
    )


def test_header_problem_version_and_id_mismatch_texts() -> None:
    """The version and id-mismatch rules use the upstream wording."""
    base: dict[str, Any] = {
        "version": 0,
        "session_id": "a",
        "created_at": 1,
        "cwd": None,
        "parent_session": None,
        "delegation_depth": 0,
        "origin": None,
        "agent_preset": None,
    }
    assert header_problem(**base) is None
    assert header_problem(**{**base, "version": 1}) == "session header version must be 0, got 1"
    assert header_problem(**base, expected_id="b") == 'session header id "a" does not match session id "b"'


@pytest.mark.parametrize(
    ("session_id", "fragment"),
    [
        ("", "must not be empty"),
        ("x" * 129, "at most 128 UTF-16 code units"),
        ("\U0001f600" * 65, "at most 128 UTF-16 code units"),
        ("a\x00b", "control character U+0000"),
        ("a\x1fb", "control character U+001F"),
        ("a\x7fb", "control character U+007F"),
        ("a\ud800b", "lone surrogate"),
        ("\u00e9" * 60, "directory name"),
    ],
)
def test_new_ids_are_validated(store: SessionStore, session_id: str, fragment: str) -> None:
    """A new id must be 1-128 UTF-16 units, free of controls and lone surrogates, and escape to <= 255 bytes."""
    with pytest.raises(SessionError) as caught:
        store.create(session_id)
    assert caught.value.code == "INVALID_HEADER"
    assert fragment in caught.value.message
    assert store.list() == ()


@pytest.mark.parametrize("session_id", ["..", ".", "a/b", "../../etc", "x" * 128, "\U0001f600" * 25, "~tilde"])
def test_traversal_looking_ids_are_legal(store: SessionStore, session_id: str) -> None:
    """Ids that look like paths are legal: the backends' escaping neutralises them."""
    assert store.create(session_id).id == session_id
    assert "/" not in encode_segment(session_id)
    assert encode_segment(session_id) not in {".", ".."}


def test_stored_header_round_trips_with_key_order() -> None:
    """A stored record with seedLength 3 reads as seeded with cut 3 and writes back identically."""
    record = {"type": "session", "version": 0, "id": "s1", "createdAt": 5, "seedLength": 3, "delegationDepth": 1}
    header, count = SessionHeader.from_stored(record)
    assert header.is_seeded is True
    assert count == 3
    assert header.delegation_depth == 1
    stored = header.to_stored(3)
    assert list(stored.items()) == list(record.items())


def test_stored_header_full_key_order() -> None:
    """Every optional stored key is written in the upstream order."""
    header = SessionHeader(
        version=0,
        id="s",
        created_at=1,
        cwd="/c",
        parent_session="p",
        is_seeded=True,
        delegation_depth=2,
        origin="subagent",
        agent_preset="x",
    )
    assert list(header.to_stored(4)) == [
        "type",
        "version",
        "id",
        "createdAt",
        "cwd",
        "parentSession",
        "seedLength",
        "origin",
        "delegationDepth",
        "agentPreset",
    ]
    assert SessionHeader.from_stored(header.to_stored(4)) == (header, 4)


def test_unseeded_header_omits_seed_length() -> None:
    """With count 0, seedLength is absent and delegationDepth is present as 0."""
    header = SessionHeader(version=0, id="s", created_at=1)
    stored = header.to_stored(0)
    assert "seedLength" not in stored
    assert stored["delegationDepth"] == 0
    assert dict(stored) == {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": 0}


def test_to_stored_refuses_a_cut_contradicting_is_seeded() -> None:
    """The cut written must agree with is_seeded."""
    with pytest.raises(ValueError, match="contradicts"):
        SessionHeader(version=0, id="s", created_at=1).to_stored(2)


def test_to_json_wire_form() -> None:
    """The wire form always carries isSeeded and delegationDepth and omits other absent keys."""
    header = SessionHeader(version=0, id="s", created_at=1)
    assert dict(header.to_json()) == {"version": 0, "id": "s", "createdAt": 1, "isSeeded": False, "delegationDepth": 0}
    full = dataclasses.replace(header, cwd="/c", parent_session="p", origin="subagent", agent_preset="x")
    assert list(full.to_json()) == [
        "version",
        "id",
        "createdAt",
        "cwd",
        "parentSession",
        "isSeeded",
        "delegationDepth",
        "origin",
        "agentPreset",
    ]


@pytest.mark.parametrize("key", ["sandboxMode", "approvalPolicy"])
def test_retired_policy_keys_are_rejected(key: str) -> None:
    """A stored header with a retired policy key is rejected with the upstream text."""
    record = {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": 0, key: "x"}
    with pytest.raises(StoredHeaderError, match="session header uses retired policy baseline fields"):
        SessionHeader.from_stored(record)


def test_unknown_keys_are_ignored_and_depth_defaults_to_zero() -> None:
    """An unknown extra key is ignored (not carried forward); a missing delegationDepth reads as 0."""
    record = {"type": "session", "version": 0, "id": "s", "createdAt": 1, "futureField": {"x": 1}}
    header, count = SessionHeader.from_stored(record)
    assert count == 0
    assert header.delegation_depth == 0
    assert "futureField" not in header.to_stored(0)


@pytest.mark.parametrize(
    ("changes", "version_problem"),
    [({"version": 1}, True), ({"version": 0.5}, True), ({"version": "0"}, False), ({"version": None}, False)],
)
def test_stored_version_is_checked_first(changes: dict[str, Any], version_problem: bool) -> None:
    """The version is checked before anything else; another number is a format refusal, not corruption."""
    record = {"type": "nonsense", "id": "", "createdAt": -1, **changes}
    with pytest.raises(StoredHeaderError) as caught:
        SessionHeader.from_stored(record)
    assert caught.value.version_problem is version_problem
    assert str(caught.value).startswith("session header version must be 0, got ")


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"type": "event"}, 'type must be "session"'),
        ({"seedLength": -1}, "seedLength"),
        ({"seedLength": 1.5}, "seedLength"),
        ({"createdAt": 2**53}, "createdAt"),
        ({"delegationDepth": -1}, "delegationDepth"),
        ({"origin": "child"}, "origin"),
        ({"cwd": 3}, "cwd"),
        ({"parentSession": 3}, "parentSession"),
        ({"agentPreset": 3}, "agentPreset"),
        ({"id": ""}, "id"),
    ],
)
def test_stored_header_field_rules(changes: dict[str, Any], fragment: str) -> None:
    """Each stored-header field rule refuses a bad value (as corruption, not a version refusal)."""
    record = {"type": "session", "version": 0, "id": "s", "createdAt": 1, "delegationDepth": 0, **changes}
    with pytest.raises(StoredHeaderError, match=re.escape(fragment)) as caught:
        SessionHeader.from_stored(record)
    assert caught.value.version_problem is False


def test_headers_differing_only_in_is_seeded_are_unequal() -> None:
    """Two headers that differ only in is_seeded are different lifecycles (docs/glossary.md#witness)."""
    a = SessionHeader(version=0, id="s", created_at=1, is_seeded=False)
    b = dataclasses.replace(a, is_seeded=True)
    assert a != b
    assert a.witness_difference(b) == "isSeeded"
    assert a.witness_difference(dataclasses.replace(a)) is None


def test_header_is_frozen() -> None:
    """The logical header is immutable."""
    header = SessionHeader(version=0, id="s", created_at=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        header.id = "t"  # type: ignore[misc]
