"""Construction, configuration, the error class and the public surface of `dsh.query`."""

from __future__ import annotations

import pytest

import dsh.query
from dsh.errors import ConfigError, DshError
from dsh.query import QueryConfig, SessionQuery, SessionQueryError
from dsh.session import SessionStore
from tests.query.helpers import FakePersistence


def test_missing_store_is_config_error() -> None:
    """Without a session store, construction raises ConfigError CONFIG_INVALID, not a query error."""
    with pytest.raises(ConfigError) as caught:
        SessionQuery(None)  # type: ignore[arg-type]
    assert caught.value.code == "CONFIG_INVALID"
    assert not isinstance(caught.value, SessionQueryError)


def test_wrong_store_type_is_config_error() -> None:
    """Something that is not a SessionStore is refused at construction."""
    with pytest.raises(ConfigError):
        SessionQuery(object())  # type: ignore[arg-type]


def test_default_above_max_is_config_error() -> None:
    """history_default_messages above history_max_messages raises ConfigError CONFIG_INVALID."""
    with pytest.raises(ConfigError) as caught:
        QueryConfig(history_default_messages=10, history_max_messages=5)
    assert caught.value.code == "CONFIG_INVALID"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"history_default_messages": 0},
        {"history_default_messages": True},
        {"history_default_messages": 2.0},
        {"history_max_messages": 0},
        {"history_max_messages": "200"},
        {"history_max_messages": 1},
    ],
)
def test_invalid_config_values_are_config_invalid(kwargs: dict[str, object]) -> None:
    """Non-integers, bools, values below 1 and a default above the maximum are CONFIG_INVALID."""
    with pytest.raises(ConfigError):
        QueryConfig(**kwargs)  # type: ignore[arg-type]


def test_a_config_of_the_wrong_type_is_refused(store: SessionStore) -> None:
    """A config that is not a QueryConfig is refused at construction."""
    with pytest.raises(ConfigError):
        SessionQuery(store, config={"history_max_messages": 10})  # type: ignore[arg-type]


def test_defaults_are_fifty_per_page_and_two_hundred_at_most(store: SessionStore) -> None:
    """Defaults are 50 per page and 200 at most; persistence and registry are optional."""
    query = SessionQuery(store, FakePersistence())
    assert query.config == QueryConfig(history_default_messages=50, history_max_messages=200)
    assert QueryConfig(history_default_messages=1, history_max_messages=1).history_max_messages == 1


def test_error_codes_are_the_closed_set() -> None:
    """SessionQueryError carries exactly the ten codes; reserved and deleted codes are not carried."""
    assert issubclass(SessionQueryError, DshError)
    assert {
        "SESSION_QUERY_ABORTED",
        "SESSION_QUERY_SESSION_NOT_FOUND",
        "SESSION_QUERY_CORRUPT_SESSION",
        "SESSION_QUERY_UNSUPPORTED_FORMAT",
        "SESSION_QUERY_PERSISTENCE_FAILED",
        "SESSION_QUERY_SOURCE_CONFLICT",
        "SESSION_QUERY_INVALID_WINDOW",
        "SESSION_QUERY_INVALID_LIMIT",
        "SESSION_QUERY_INVALID_LINEAGE",
        "SESSION_QUERY_INVALID_FILTER",
    } == SessionQueryError.codes
    for never in (
        "SESSION_QUERY_PROJECTIONS_UNAVAILABLE",
        "SESSION_QUERY_SEARCH_DISABLED",
        "SESSION_QUERY_INVALID_QUERY",
        "SESSION_QUERY_INVALID_CURSOR",
        "SESSION_QUERY_STALE_CURSOR",
        "SESSION_QUERY_INDEX_FAILED",
    ):
        with pytest.raises(TypeError):
            SessionQueryError("x", code=never)


def test_the_error_carries_code_session_id_reason_and_cause() -> None:
    """The error carries code, session_id and reason, and keeps its cause."""
    cause = OSError("x")
    with pytest.raises(SessionQueryError) as caught:
        raise SessionQueryError("aborted", code="SESSION_QUERY_ABORTED", session_id="s", reason="r") from cause
    error = caught.value
    assert (error.code, error.session_id, error.reason) == ("SESSION_QUERY_ABORTED", "s", "r")
    assert error.__cause__ is cause
    assert error.message == "aborted"


def test_the_public_names_are_pinned() -> None:
    """The public surface of `dsh.query` is pinned."""
    assert dsh.query.__all__ == [
        "HistoryPage",
        "LineageNode",
        "QueryConfig",
        "SessionCorpus",
        "SessionFilter",
        "SessionLineage",
        "SessionObservation",
        "SessionQuery",
        "SessionQueryError",
        "SessionRecord",
    ]
