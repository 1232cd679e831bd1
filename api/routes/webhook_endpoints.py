"""Webhook endpoints (a workspace owner, CONTRACT section 13): create, list, update, delete,
rotate the signing secret, ping, the delivery log and resending. Thin: the work is
ingest/webhooks_out/endpoints.py's, off the event loop; a ping or a resend wakes this process's
delivery worker (api/outbound/worker.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import account_program, require_account, state
from api.http import body_model, ok, query_int
from api.openapi import ACCOUNT_TOKEN, Doc, Param, document
from api.outbound import schemas
from ingest import control
from ingest.domain.clock import utcnow
from ingest.domain.errors import NotFound, OwnerRequired, ProgramNotFound, ValidationFailed
from ingest.domain.records import Program
from ingest.webhooks_out import endpoints
from ingest.webhooks_out.events import DESCRIPTIONS
from ingest.webhooks_out.inputs import EndpointIn, EndpointPatch

T = TypeVar("T")


def _owner(request: Request) -> Program:
    """The program (members get 403 owner_required; another workspace's program is a 404)."""
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return program


async def _off_loop(work: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(work, *args)


def _wake(request: Request) -> None:
    worker = getattr(request.app.state, "webhooks", None)
    if worker is not None:
        worker.wake()


def _allow_private(request: Request) -> bool:
    return state(request).settings.webhooks_allow_private


def status_param(request: Request) -> str | None:
    """`?status=pending|succeeded|failed`, or None for every delivery."""
    value = request.query_params.get("status")
    if value in (None, ""):
        return None
    if value not in endpoints.DELIVERY_STATUSES:
        message = "must be " + ", ".join(endpoints.DELIVERY_STATUSES)
        raise ValidationFailed(f"status {message}", fields=[{"field": "status", "message": message}])
    return value


async def create_endpoint(request: Request) -> Response:
    program = _owner(request)
    _, inp = await body_model(request, EndpointIn)
    found = await _off_loop(
        endpoints.create, state(request).store, program.program_id, inp, _allow_private(request), utcnow()
    )
    return ok(request, found, 201)


async def list_endpoints(request: Request) -> Response:
    program = _owner(request)
    return ok(request, await _off_loop(endpoints.listing, state(request).store, program.program_id, utcnow()))


def _endpoint_id(request: Request) -> str:
    return str(request.path_params["endpoint_id"])


async def get_endpoint(request: Request) -> Response:
    program = _owner(request)
    found = await _off_loop(
        endpoints.get, state(request).store, program.program_id, _endpoint_id(request), utcnow()
    )
    return ok(request, found)


async def update_endpoint(request: Request) -> Response:
    program = _owner(request)
    _, patch = await body_model(request, EndpointPatch)
    found = await _off_loop(
        endpoints.update,
        state(request).store,
        program.program_id,
        _endpoint_id(request),
        patch,
        _allow_private(request),
        utcnow(),
    )
    if patch.enabled:
        _wake(request)  # its waiting deliveries are due
    return ok(request, found)


async def delete_endpoint(request: Request) -> Response:
    program = _owner(request)
    found = await _off_loop(endpoints.delete, state(request).store, program.program_id, _endpoint_id(request))
    return ok(request, found)


async def rotate_secret(request: Request) -> Response:
    program = _owner(request)
    found = await _off_loop(
        endpoints.rotate, state(request).store, program.program_id, _endpoint_id(request), utcnow()
    )
    return ok(request, found)


async def ping(request: Request) -> Response:
    program = _owner(request)
    found = await _off_loop(
        endpoints.ping, state(request).store, program.program_id, _endpoint_id(request), utcnow()
    )
    _wake(request)
    return ok(request, found, 202)


async def list_deliveries(request: Request) -> Response:
    program = _owner(request)
    status = status_param(request)
    limit = query_int(request, "limit", endpoints.DELIVERIES_SHOWN, 1, endpoints.DELIVERIES_MAX)
    found = await _off_loop(
        endpoints.delivery_log, state(request).store, program.program_id, _endpoint_id(request), status, limit
    )
    return ok(request, found)


async def resend(request: Request) -> Response:
    program = _owner(request)
    found = await _off_loop(
        endpoints.resend,
        state(request).store,
        program.program_id,
        _endpoint_id(request),
        str(request.path_params["delivery_id"]),
        utcnow(),
    )
    _wake(request)
    return ok(request, found, 202)


BASE = "/api/v1/programs/{program_id}/webhook-endpoints"
ONE = BASE + "/{endpoint_id}"
routes = [
    Route(BASE, create_endpoint, methods=["POST"]),
    Route(BASE, list_endpoints, methods=["GET"]),
    Route(ONE, get_endpoint, methods=["GET"]),
    Route(ONE, update_endpoint, methods=["PATCH"]),
    Route(ONE, delete_endpoint, methods=["DELETE"]),
    Route(ONE + "/rotate-secret", rotate_secret, methods=["POST"]),
    Route(ONE + "/ping", ping, methods=["POST"]),
    Route(ONE + "/deliveries", list_deliveries, methods=["GET"]),
    Route(ONE + "/deliveries/{delivery_id}/resend", resend, methods=["POST"]),
]

_OWNER = "A workspace owner's account token (members get 403 owner_required)."
_TYPES = "Event types: " + "; ".join(f"`{t}`: {d}" for t, d in DESCRIPTIONS.items()) + "."
_ENDPOINT = {
    "endpoint_id": "we_5e1f0c2b9d7a4e31a8c6f201",
    "program_id": "prog_1a",
    "url": "https://brand.example/hooks/tally",
    "description": "CRM sync",
    "events": ["sale.created", "commission.approved"],
    "enabled": True,
    "secret_masked": "whsec_••••••••Q9c=",
    "previous_secret_expires_at": None,
    "created_at": "2026-02-03T09:00:00Z",
    "updated_at": "2026-02-03T09:00:00Z",
    "failing_since": None,
    "disabled_at": None,
    "disabled_reason": None,
}
_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw1t3wmVbaQ9c="  # noqa: S105 (an example)
_DELIVERY = {
    "delivery_id": "whd_3b0c8f0e9d1a2b3c4d5e_5e1f0c2b9d7a4e31a8c6f201",
    "endpoint_id": "we_5e1f0c2b9d7a4e31a8c6f201",
    "event_id": "evt_3b0c8f0e9d1a2b3c4d5e6f7a8b9c0d1e",
    "type": "sale.created",
    "status": "pending",
    "response_status": 503,
    "duration_ms": 41,
    "attempt": 1,
    "next_attempt_at": "2026-02-03T09:00:31Z",
    "created_at": "2026-02-03T09:00:00Z",
    "last_attempt_at": "2026-02-03T09:00:01Z",
    "error": "HTTP 503",
    "attempt_log": [
        {
            "attempt": 1,
            "attempted_at": "2026-02-03T09:00:01Z",
            "status": "failed",
            "response_status": 503,
            "duration_ms": 41,
            "response_body": "busy",
            "error": "HTTP 503",
            "next_attempt_at": "2026-02-03T09:00:31Z",
        }
    ],
}
_ENDPOINT_ID = Param(
    "endpoint_id", {"type": "string", "minLength": 1}, where="path", example="we_5e1f0c2b9d7a4e31a8c6f201"
)
_ERRORS = (ProgramNotFound, NotFound, OwnerRequired)
document(
    {
        create_endpoint: Doc(
            "Add a webhook endpoint: signed deliveries of the events it names",
            "webhooks-out",
            description=_OWNER + " 201 with the endpoint and its signing secret (`whsec_...`): the only "
            "answer that shows it. `url` must be `https://` and must not reach a private, loopback or "
            "link-local address (`TALLY_WEBHOOKS_ALLOW_PRIVATE=1` allows `http://` and local addresses). "
            "Deliveries are signed per Standard Webhooks (`webhook-id`, `webhook-timestamp`, "
            "`webhook-signature`). " + _TYPES,
            auth=(ACCOUNT_TOKEN,),
            body=EndpointIn,
            example={
                "url": "https://brand.example/hooks/tally",
                "events": ["sale.created", "commission.approved"],
            },
            status=201,
            data=schemas.WebhookEndpointWithSecret,
            result={**_ENDPOINT, "secret": _SECRET},
            errors=_ERRORS,
            writes=True,
        ),
        list_endpoints: Doc(
            "The program's webhook endpoints (secrets masked)",
            "webhooks-out",
            description=_OWNER,
            auth=(ACCOUNT_TOKEN,),
            data=list[schemas.WebhookEndpoint],
            result=[_ENDPOINT],
            errors=_ERRORS,
        ),
        get_endpoint: Doc(
            "One webhook endpoint (secret masked; why it was disabled, if it was)",
            "webhooks-out",
            description=_OWNER,
            auth=(ACCOUNT_TOKEN,),
            params=(_ENDPOINT_ID,),
            data=schemas.WebhookEndpoint,
            result=_ENDPOINT,
            errors=_ERRORS,
        ),
        update_endpoint: Doc(
            "Change a webhook endpoint's url, events or enabled",
            "webhooks-out",
            description=_OWNER + " Enabling an endpoint tally disabled (5 days of failed deliveries) "
            "clears the reason; its waiting deliveries are sent.",
            auth=(ACCOUNT_TOKEN,),
            params=(_ENDPOINT_ID,),
            body=EndpointPatch,
            example={"enabled": False},
            data=schemas.WebhookEndpoint,
            result={**_ENDPOINT, "enabled": False},
            errors=_ERRORS,
            writes=True,
        ),
        delete_endpoint: Doc(
            "Delete a webhook endpoint and its deliveries",
            "webhooks-out",
            description=_OWNER,
            auth=(ACCOUNT_TOKEN,),
            params=(_ENDPOINT_ID,),
            data=schemas.WebhookEndpointDeleted,
            result={"endpoint_id": _ENDPOINT["endpoint_id"], "deleted": True},
            errors=_ERRORS,
            writes=True,
        ),
        rotate_secret: Doc(
            "Rotate an endpoint's signing secret (the old one signs beside the new for 24 h)",
            "webhooks-out",
            description=_OWNER + " 200 with the new secret, shown this once. For 24 hours every delivery "
            "carries two signatures (space-separated in `webhook-signature`), one per secret, so the "
            "receiver can switch over without losing a delivery.",
            auth=(ACCOUNT_TOKEN,),
            params=(_ENDPOINT_ID,),
            data=schemas.WebhookEndpointWithSecret,
            result={**_ENDPOINT, "secret": _SECRET, "previous_secret_expires_at": "2026-02-04T09:00:00Z"},
            errors=_ERRORS,
            writes=True,
        ),
        ping: Doc(
            "Send a test `ping` event to this endpoint",
            "webhooks-out",
            description=_OWNER + " 202 with the queued delivery (due at once, whatever event types the "
            "endpoint takes); `GET .../deliveries` shows how it went.",
            auth=(ACCOUNT_TOKEN,),
            params=(_ENDPOINT_ID,),
            status=202,
            data=schemas.WebhookDelivery,
            result={**_DELIVERY, "type": "ping", "attempt": 0, "attempt_log": [], "status": "pending"},
            errors=_ERRORS,
            writes=True,
        ),
        list_deliveries: Doc(
            "An endpoint's deliveries, newest first, with every attempt",
            "webhooks-out",
            description=_OWNER + " Each delivery (one event to this endpoint): `status` (`pending`: waiting "
            "for an attempt; `succeeded`; `failed`: no 2xx within 3 days of retries), the last "
            "attempt's `response_status` and `duration_ms`, `attempt` (attempts made), "
            "`next_attempt_at`, and `attempt_log`: each attempt with the first 4 KiB of the answer.",
            auth=(ACCOUNT_TOKEN,),
            params=(
                _ENDPOINT_ID,
                Param("status", {"type": "string", "enum": list(endpoints.DELIVERY_STATUSES)}),
                Param(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": endpoints.DELIVERIES_MAX},
                    f"at most this many (default {endpoints.DELIVERIES_SHOWN})",
                ),
            ),
            data=list[schemas.WebhookDelivery],
            result=[_DELIVERY],
            errors=(*_ERRORS, ValidationFailed),
        ),
        resend: Doc(
            "Send a delivery again now (the same event and webhook-id)",
            "webhooks-out",
            description=_OWNER + " 202 with the delivery, due at once, with a new 3-day retry window.",
            auth=(ACCOUNT_TOKEN,),
            params=(
                _ENDPOINT_ID,
                Param(
                    "delivery_id",
                    {"type": "string", "minLength": 1},
                    where="path",
                    example=_DELIVERY["delivery_id"],
                ),
            ),
            status=202,
            data=schemas.WebhookDelivery,
            result=_DELIVERY,
            errors=_ERRORS,
            writes=True,
        ),
    }
)
