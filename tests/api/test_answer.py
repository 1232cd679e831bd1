"""The lanes' `Answer` sends exactly what Starlette's `Response` sends for the same envelope:
status, body and raw headers in the same order (rotation headers, content-length, content-type,
then CORS), for plain answers, warnings, a flagged program key and CORS together."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

from api.http import CORS_HEADERS, answer, dumps, ok, rotation_headers, rotation_warnings
from ingest.domain.records import Credential

FLAGGED = Credential(
    token_hash="h",
    kind="program",
    subject_id="prog_1",
    masked="aff_••••••••abcd",
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
    flagged_at=datetime(2026, 11, 1, 12, tzinfo=UTC),
    rotation_deadline=datetime(9999, 12, 1, tzinfo=UTC),
)


def _request(credential: Credential | None) -> Request:
    app = SimpleNamespace(
        state=SimpleNamespace(tally=SimpleNamespace(settings=SimpleNamespace(base_url="http://b")))
    )
    state: dict[str, Any] = {} if credential is None else {"credential": credential}
    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "app": app, "state": state})


def _starlette(
    request: Request, data: Any, status: int, warnings: list[dict[str, Any]], cors: bool
) -> Response:
    """The answer as Starlette builds it: the envelope, `Response(..., headers, media_type)`, and
    CORS headers set on it afterwards."""
    cred = request.scope["state"].get("credential")
    all_warnings = [*rotation_warnings(cred), *warnings]
    payload: dict[str, Any] = {"data": data}
    if all_warnings:
        payload["warnings"] = all_warnings
    headers = rotation_headers(request, cred) if cred is not None else None
    response = Response(dumps(payload), status, headers, media_type="application/json")
    if cors:
        response.headers.update(CORS_HEADERS)
    return response


@pytest.mark.parametrize("credential", [None, FLAGGED])
@pytest.mark.parametrize("warnings", [[], [{"code": "customer_not_attributed", "message": "m"}]])
@pytest.mark.parametrize(("status", "cors"), [(200, False), (201, True), (200, True)])
def test_an_answer_is_what_starlette_sends(
    credential: Credential | None, warnings: list[dict[str, Any]], status: int, cors: bool
) -> None:
    request = _request(credential)
    data = {"sale_id": "sale_1", "amount": 4900, "partner_code": None}
    got = answer(request, data, status, warnings, CORS_HEADERS if cors else None)
    expected = _starlette(request, data, status, warnings, cors)
    assert (got.status, got.body, got.headers) == (expected.status_code, expected.body, expected.raw_headers)
    if not cors:  # the routes' `ok` is the same answer as a Response
        response = ok(request, data, status, warnings)
        assert (response.status_code, response.body, response.raw_headers) == (status, got.body, got.headers)
