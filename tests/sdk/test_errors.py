"""sdk errors: mapping from the error envelope, and rotation warnings and deadlines."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest

from sdk import (
    ApiKeyRotationRequired,
    ApiKeyRotationWarning,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DuplicateError,
    InvalidResponseError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    TallyAPIError,
    TrackResult,
    ValidationError,
)
from tests.sdk.helpers import BASE_URL, Script, async_client, client, err, ok

DEADLINE = "2026-12-01T00:00:00Z"
DEADLINE_DT = datetime(2026, 12, 1, tzinfo=UTC)
ROTATION_HEADERS = {
    "Deprecation": "@1763700000",
    "Sunset": "Tue, 01 Dec 2026 00:00:00 GMT",
    "Link": f'<{BASE_URL}/docs/errors#api_key_rotation_required>; rel="deprecation"',
}
ROTATION_WARNING = {
    "code": "api_key_rotation_required",
    "deadline": DEADLINE,
    "message": "rotate your key",
}


def sale(script: Script) -> TrackResult:
    return client(script, retries=0).track_sale(customer_external_id="user_42", amount=100, invoice_id="in_1")


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "invalid_json", BadRequestError),
        (413, "payload_too_large", BadRequestError),
        (401, "missing_credentials", AuthenticationError),
        (401, "malformed_authorization", AuthenticationError),
        (401, "invalid_api_key", AuthenticationError),
        (401, "program_key_required", AuthenticationError),
        (403, "owner_required", PermissionDeniedError),
        (404, "program_not_found", NotFoundError),
        (409, "duplicate_transaction", DuplicateError),
        (409, "duplicate_refund", DuplicateError),
        (409, "conflict", ConflictError),
        (422, "validation_error", ValidationError),
        (422, "program_mismatch", ValidationError),
        (422, "refund_exceeds_sale", ValidationError),
        (429, "rate_limited", RateLimitError),
        (500, "internal_error", ServerError),
        (401, "some_future_auth_code", AuthenticationError),
        (409, "some_future_conflict", ConflictError),
        (418, "teapot", BadRequestError),
        (507, "insufficient_storage", ServerError),
    ],
)
def test_error_class_from_code_then_status(status: int, code: str, cls: type[Exception]) -> None:
    with pytest.raises(TallyAPIError) as info:
        sale(Script(err(status, code, "the message", extra_key=[1])))
    error = info.value
    assert type(error) is cls
    assert (error.code, error.message, error.status) == (code, "the message", status)
    assert error.request_id == "req_err"
    assert error.doc_url == f"{BASE_URL}/docs/errors#{code}"
    assert error.details == {"extra_key": [1]}
    assert error.after_retry is False
    assert str(error) == f"{code}: the message (request req_err)"


def test_validation_error_exposes_fields() -> None:
    fields = [{"field": "amount", "message": "must be positive"}]
    with pytest.raises(ValidationError) as info:
        sale(Script(err(422, "validation_error", fields=fields)))
    assert info.value.fields == fields


def test_non_json_error_body_falls_back_to_status() -> None:
    with pytest.raises(ServerError) as info:
        sale(Script(httpx.Response(500, text="<html>oops</html>")))
    assert (info.value.code, info.value.status, info.value.message) == (
        "http_500",
        500,
        "Internal Server Error",
    )


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="not json"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"ok": True}),
        httpx.Response(201, json={"data": "a string"}),
    ],
)
def test_success_without_envelope_is_invalid_response(response: httpx.Response) -> None:
    with pytest.raises(InvalidResponseError) as info:
        sale(Script(response))
    assert info.value.code == "invalid_response"


def test_rate_limit_carries_retry_after() -> None:
    response = err(429, "rate_limited")
    response.headers["Retry-After"] = "120"  # beyond the policy's max: not retried
    script = Script(response)
    with pytest.raises(RateLimitError) as info:
        client(script).track_test_sale()
    assert info.value.retry_after == 120.0
    assert len(script.requests) == 1


def test_rotation_warning_on_success_sets_deadline_and_points_at_caller() -> None:
    script = Script(ok({"test_mode": True}, [ROTATION_WARNING], **ROTATION_HEADERS))
    with pytest.warns(ApiKeyRotationWarning, match="2026-12-01T00:00:00Z") as record:
        result = client(script).track_test_sale()
    assert result.rotation_deadline == DEADLINE_DT
    assert result.rotation_flagged is True
    assert result.warnings == (ROTATION_WARNING,)
    assert result.data == {"test_mode": True}
    assert len(record) == 1
    assert record[0].filename == __file__
    assert "docs/errors#api_key_rotation_required" in str(record[0].message)


def test_rotation_signalled_by_headers_only_uses_sunset() -> None:
    script = Script(ok({"test_mode": True}, None, **ROTATION_HEADERS))
    with pytest.warns(ApiKeyRotationWarning):
        result = client(script).track_test_sale()
    assert (result.rotation_deadline, result.warnings) == (DEADLINE_DT, ())


def test_other_warnings_do_not_warn() -> None:
    note = {"code": "customer_not_attributed", "message": "no settled lead"}
    result = sale(Script(ok({"attributed": False}, [note])))
    assert result.warnings == (note,)
    assert (result.rotation_deadline, result.rotation_flagged) == (None, False)


def test_error_before_deadline_still_warns_and_carries_deadline() -> None:
    response = httpx.Response(
        409,
        json={"error": {"code": "duplicate_transaction", "message": "dup"}, "warnings": [ROTATION_WARNING]},
        headers=ROTATION_HEADERS,
    )
    with pytest.warns(ApiKeyRotationWarning), pytest.raises(DuplicateError) as info:
        sale(Script(response))
    assert info.value.rotation_deadline == DEADLINE_DT


def test_rotation_required_after_deadline_raises_without_warning() -> None:
    response = err(401, "api_key_rotation_required", "key must be rotated", deadline=DEADLINE)
    response.headers.update(ROTATION_HEADERS)
    with pytest.raises(ApiKeyRotationRequired) as info:  # filterwarnings=error: no warning
        sale(Script(response))
    error = info.value
    assert isinstance(error, AuthenticationError)
    assert error.deadline == DEADLINE_DT
    assert error.status == 401
    assert error.details == {"deadline": DEADLINE}


def test_rotation_required_deadline_from_sunset_when_body_has_none() -> None:
    response = err(401, "api_key_rotation_required")
    response.headers.update(ROTATION_HEADERS)
    with pytest.raises(ApiKeyRotationRequired) as info:
        sale(Script(response))
    assert info.value.deadline == DEADLINE_DT


def test_async_client_warns_and_maps_errors_the_same_way() -> None:
    script = Script(
        ok({"test_mode": True}, [ROTATION_WARNING], **ROTATION_HEADERS),
        err(404, "program_not_found"),
    )

    async def run() -> TrackResult:
        tally = async_client(script, retries=0)
        result = await tally.track_test_sale()
        with pytest.raises(NotFoundError):
            await tally.track_test_sale()
        return result

    with pytest.warns(ApiKeyRotationWarning) as record:
        result = asyncio.run(run())
    assert result.rotation_deadline == DEADLINE_DT
    assert record[0].filename == __file__


def test_sunset_alone_is_not_a_rotation_flag() -> None:
    result = sale(Script(ok({}, None, Sunset="Tue, 01 Dec 2026 00:00:00 GMT")))
    assert (result.rotation_deadline, result.rotation_flagged) == (None, False)
