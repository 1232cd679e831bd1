"""sdk errors: mapping from the error envelope, and rotation warnings and deadlines.

Against the real app (`RealApp`): real refusals, and a key really flagged for rotation. Envelopes
the app does not produce on demand (future codes, other statuses) are built by the app's own error
map, and rotation signals another tally version could send are the app's real answer altered; only
what no tally answers (non-JSON bodies, success without an envelope) is written here."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from ingest.domain import errors as app_errors
from tally_sdk import (
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
from tests.conftest import OP, World, make_world
from tests.sdk.helpers import APP_URL, RealApp, Refusal, real_async_client, real_client, reshaped

DEADLINE_DT = (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0)
DEADLINE = DEADLINE_DT.isoformat().replace("+00:00", "Z")


def flag_rotation(world: World, deadline: datetime = DEADLINE_DT) -> None:
    r = world.client.post(
        f"/api/v1/operator/programs/{world.program_id}/api-key/rotation",
        json={"deadline": deadline.isoformat()},
        headers=OP,
    )
    assert r.status_code == 200, r.text


def rotation_headers(world: World) -> dict[str, str]:
    """The Deprecation, Sunset and Link headers the app sends for the world's flagged key."""
    flag_rotation(world)
    r = world.client.post(
        "/api/v1/track/sale", json={"additional_data": {"test_mode": True}}, headers=world.key
    )
    return {name: r.headers[name] for name in ("Deprecation", "Sunset", "Link")}


def sale(app: RealApp, invoice_id: str = "in_1") -> TrackResult:
    tally = real_client(app, retries=0)
    return tally.track_sale(customer_external_id="user_42", amount=100, invoice_id=invoice_id)


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
def test_error_class_from_code_then_status(
    world: World, status: int, code: str, cls: type[Exception]
) -> None:
    app = RealApp(world)
    app.faults = [app.error(Refusal(code, status, "the message", extra_key=[1]))]
    with pytest.raises(TallyAPIError) as info:
        sale(app)
    error = info.value
    assert type(error) is cls
    assert (error.code, error.message, error.status) == (code, "the message", status)
    assert error.request_id == app.requests[0].headers["x-request-id"]
    assert error.doc_url == f"{APP_URL}/docs/errors#{code}"
    assert error.details == {"extra_key": [1]}
    assert error.after_retry is False
    assert str(error) == f"{code}: the message (request {error.request_id})"


def test_validation_error_exposes_fields(world: World) -> None:
    with pytest.raises(ValidationError) as info:  # the SDK lets any non-empty currency through
        real_client(RealApp(world), retries=0).track_sale(
            customer_external_id="u", amount=100, invoice_id="in_1", currency="dollars"
        )
    [field] = info.value.fields
    assert field["field"] == "currency" and field["message"]


def test_non_json_error_body_falls_back_to_status(world: World) -> None:
    with pytest.raises(ServerError) as info:
        sale(RealApp(world, httpx.Response(500, text="<html>oops</html>")))
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
def test_success_without_envelope_is_invalid_response(world: World, response: httpx.Response) -> None:
    with pytest.raises(InvalidResponseError) as info:
        sale(RealApp(world, response))
    assert info.value.code == "invalid_response"


def test_rate_limit_carries_retry_after(world: World) -> None:
    app = RealApp(world)
    app.faults = [app.error(app_errors.RateLimited("slow down", retry_after=120))]  # beyond the policy's max
    with pytest.raises(RateLimitError) as info:
        real_client(app).track_test_sale()
    assert info.value.retry_after == 120.0
    assert len(app.requests) == 1


def test_rotation_warning_on_success_sets_deadline_and_points_at_caller(world: World) -> None:
    flag_rotation(world)
    with pytest.warns(ApiKeyRotationWarning, match=DEADLINE) as record:
        result = real_client(RealApp(world)).track_test_sale()
    assert result.rotation_deadline == DEADLINE_DT
    assert result.rotation_flagged is True
    [warning] = result.warnings
    assert (warning["code"], warning["deadline"]) == ("api_key_rotation_required", DEADLINE)
    assert result.data["test_mode"] is True
    assert len(record) == 1
    assert record[0].filename == __file__
    assert f"See {APP_URL}/docs/errors#api_key_rotation_required" in str(record[0].message)


def test_rotation_signalled_by_headers_only_uses_sunset(world: World) -> None:
    flag_rotation(world)
    app = RealApp(world)

    def without_warnings(response: httpx.Response) -> httpx.Response:
        assert "sunset" in response.headers and "deprecation" in response.headers
        return reshaped(response, {"data": response.json()["data"]})

    app.faults = [app.altered(without_warnings)]  # the app's own headers, no warning in the body
    with pytest.warns(ApiKeyRotationWarning):
        result = real_client(app).track_test_sale()
    assert (result.rotation_deadline, result.warnings) == (DEADLINE_DT, ())
    assert result.data["test_mode"] is True


def test_other_warnings_do_not_warn(world: World) -> None:
    result = sale(RealApp(world))  # no settled lead for user_42
    assert [w["code"] for w in result.warnings] == ["customer_not_attributed"]
    assert result.data["attributed"] is False
    assert (result.rotation_deadline, result.rotation_flagged) == (None, False)


def test_error_before_deadline_still_warns_and_carries_deadline(world: World) -> None:
    assert world.sale(transaction_id="in_1").status_code == 200
    flag_rotation(world)
    with pytest.warns(ApiKeyRotationWarning), pytest.raises(DuplicateError) as info:
        sale(RealApp(world), invoice_id="in_1")
    assert info.value.rotation_deadline == DEADLINE_DT


def test_rotation_required_after_deadline_raises_without_warning(world: World) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=0)
    flag_rotation(world, past)
    with pytest.raises(ApiKeyRotationRequired) as info:  # filterwarnings=error: no warning
        sale(RealApp(world))
    error = info.value
    assert isinstance(error, AuthenticationError)
    assert error.deadline == past
    assert error.status == 401
    assert error.details == {"deadline": past.isoformat().replace("+00:00", "Z")}


def test_rotation_required_deadline_from_sunset_when_body_has_none(world: World) -> None:
    headers = rotation_headers(world)
    app = RealApp(world)
    refuse = app.error(app_errors.ApiKeyRotationRequired("rotate"))  # no deadline in the body

    def answer(request: httpx.Request) -> httpx.Response:
        response = refuse(request)
        response.headers.update(headers)
        return response

    app.faults = [answer]
    with pytest.raises(ApiKeyRotationRequired) as info:
        sale(app)
    assert info.value.deadline == DEADLINE_DT


def test_async_client_warns_and_maps_errors_the_same_way(world: World) -> None:
    flag_rotation(world)
    app = RealApp(world)

    async def run() -> TrackResult:
        tally = real_async_client(app, retries=0)
        result = await tally.track_test_sale()
        with pytest.raises(DuplicateError):
            for _ in range(2):
                await tally.track_sale(customer_external_id="u", amount=5, invoice_id="in_async")
        return result

    with pytest.warns(ApiKeyRotationWarning) as record:
        result = asyncio.run(run())
    assert result.rotation_deadline == DEADLINE_DT
    assert record[0].filename == __file__


def test_sunset_alone_is_not_a_rotation_flag(world: World) -> None:
    sunset = rotation_headers(make_world(world.client))["Sunset"]  # another program's flagged key
    app = RealApp(world)

    def with_sunset(response: httpx.Response) -> httpx.Response:
        assert "deprecation" not in response.headers  # the world's own key is not flagged
        response.headers["Sunset"] = sunset
        return response

    app.faults = [app.altered(with_sunset)]
    result = sale(app)
    assert (result.rotation_deadline, result.rotation_flagged) == (None, False)
    assert result.data["transaction_id"] == "in_1"
