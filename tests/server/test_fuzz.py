"""A schemathesis run against `/openapi.json`: no undocumented status, no 500, no response off its schema,
a 2xx from every operation; and a sweep of generated requests without the token, all 401 but health.

The server runs on its own loop in a background thread (schemathesis calls block), over a seeded home:
a live parent with a continuable, a one-shot and a diagnostic child. Each operation but the stream
gets a fixed-seed, bounded mix of valid requests with random ids, valid requests on the seeded ids
(so every operation can succeed) and invalid requests, all sent with the token.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.helpers import Api, Family, ThreadedServer, seed_family

EXAMPLES_PER_OPERATION = 40
SWEEP_EXAMPLES = 10
WRONG_TOKEN = "x" * 43
SEED = 20261201
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance, response_headers_conformance]


async def _seed(served: Api) -> Family:
    return await seed_family(served.rt, live_parent=True)


def _exercise(
    strategy: st.SearchStrategy[Any], label: str, base_url: str, auth: dict[str, str], seen: collections.Counter[int]
) -> Any:
    @seed(SEED)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=strategy)
    def exercise(case: Any) -> None:
        response = case.call(base_url=base_url, headers=auth, timeout=30)
        seen[response.status_code] += 1
        assert response.status_code < 500 or response.status_code == 503, f"{label}: {response.text}"
        case.validate_response(response, checks=CHECKS)

    return exercise


@pytest.mark.slow
def test_schemathesis_finds_no_undocumented_status_no_500_and_no_schema_violation(tmp_path: Path) -> None:
    """Every operation but the stream: documented statuses only, no 5xx but 503, schema-valid bodies, a 2xx each."""
    statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    with ThreadedServer(tmp_path / "home", _seed) as live:
        raw = httpx.get(f"{live.base_url}/openapi.json", timeout=30).json()
        schema = schemathesis.openapi.from_dict(raw)
        family: Family = live.seeded
        known = {"id": family.parent, "pid": family.parent, "cid": family.continuable}
        auth = {"Authorization": f"Bearer {live.token}"}
        operations = [result.ok() for result in schema.get_all_operations()]
        operations = [operation for operation in operations if operation.path != "/api/v1/stream"]
        assert len(operations) == 17
        for operation in operations:
            names = {parameter.name for parameter in operation.path_parameters}
            seeded = {name: value for name, value in known.items() if name in names}
            strategy = st.one_of(
                operation.as_strategy(GenerationMode.POSITIVE),
                operation.as_strategy(GenerationMode.POSITIVE, path_parameters=seeded or None),
                operation.as_strategy(GenerationMode.NEGATIVE),
            )
            _exercise(strategy, operation.label, live.base_url, auth, statuses[operation.label])()
    assert set(statuses) == {operation.label for operation in operations}
    # Deciding an approval succeeds only while a tool call waits for one, which generated requests
    # cannot bring about: the route is held to its documented statuses (404, 400 ...) only.
    waits = {"POST /api/v1/approvals/{id}"}
    missing = sorted(
        label
        for label, seen in statuses.items()
        if label not in waits and not any(200 <= status < 300 for status in seen)
    )
    assert missing == [], dict(statuses)


def _sweep(strategy: st.SearchStrategy[Any], label: str, base_url: str, answered: collections.Counter[str]) -> Any:
    @seed(SEED)
    @settings(max_examples=SWEEP_EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def sweep(case: Any) -> None:
        # The generated case may carry a random bearer header of its own: drop it, then send none or a wrong one.
        case.headers = {name: value for name, value in (case.headers or {}).items() if name.lower() != "authorization"}
        for auth in ({}, {"Authorization": f"Bearer {WRONG_TOKEN}"}):
            response = case.call(base_url=base_url, headers=auth, timeout=30)
            assert response.request.headers.get("Authorization") == auth.get("Authorization"), label
            if label in ("GET /api/v1/health", "GET /api/v1/ready"):
                assert response.status_code == 200, response.text
            else:
                assert response.status_code == 401, f"{label}: {response.status_code} {response.text}"
                assert response.json()["error"]["code"] == "unauthenticated"
                assert response.headers["www-authenticate"] == ["Bearer"]
            case.validate_response(response, checks=CHECKS)
            answered[label] += 1

    return sweep


@pytest.mark.slow
def test_schemathesis_requests_without_the_token_are_401_on_every_route_but_health_and_ready(tmp_path: Path) -> None:
    """Generated requests to every `/api/v1` operation but health and ready, with no token or a wrong one: 401."""
    answered: collections.Counter[str] = collections.Counter()
    with ThreadedServer(tmp_path / "home", _seed) as live:
        raw = httpx.get(f"{live.base_url}/openapi.json", timeout=30).json()
        operations = [result.ok() for result in schemathesis.openapi.from_dict(raw).get_all_operations()]
        assert len(operations) == 18
        for operation in operations:
            _sweep(operation.as_strategy(GenerationMode.POSITIVE), operation.label, live.base_url, answered)()
    assert set(answered) == {operation.label for operation in operations}
