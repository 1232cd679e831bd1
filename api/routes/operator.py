"""Operator endpoints (TALLY_OPERATOR_TOKEN): accounts, agent keys, key rotation, legacy keys."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.auth import is_operator, require_operator, state
from api.http import body_model, ok, query_int
from api.openapi import OPERATOR_TOKEN, Doc, Param, document
from api.state import read_tables
from api.streaming import progress_stream, summary_view
from ingest import control
from ingest.domain.errors import Conflict, NotFound, ProgramNotFound, ReconcileRunning, ValidationFailed
from ingest.domain.inputs import AccountIn, AgentKeyIn, LegacyKeyIn, RotationIn
from ingest.domain.records import Program
from reconcile.run.job import RunSummary
from reports import unroutable


def _program(request: Request) -> Program:
    program_id = request.path_params["program_id"]
    program = state(request).store.program(program_id)
    if program is None:
        raise ProgramNotFound(f"program {program_id} not found")
    return program


async def create_account(request: Request) -> Response:
    require_operator(request)
    _, inp = await body_model(request, AccountIn)
    return ok(request, await control.create_account(state(request).writer, inp), 201)


async def create_agent_key(request: Request) -> Response:
    require_operator(request)
    _, inp = await body_model(request, AgentKeyIn)
    st = state(request)
    return ok(request, await control.create_agent_key(st.store, st.writer, inp), 201)


async def flag_rotation(request: Request) -> Response:
    require_operator(request)
    program = _program(request)
    _, inp = await body_model(request, RotationIn)
    st = state(request)
    return ok(request, await control.flag_rotation(st.store, st.writer, program, inp.deadline))


async def import_legacy_key(request: Request) -> Response:
    require_operator(request)
    program = _program(request)
    _, inp = await body_model(request, LegacyKeyIn)
    if is_operator(request, inp.api_key):
        message = "must not be the operator token: a program key is given to brand servers"
        raise ValidationFailed(f"api_key: {message}", fields=[{"field": "api_key", "message": message}])
    st = state(request)
    data = await control.regenerate_key(st.store, st.writer, program, value=inp.api_key)
    data.pop("api_key")
    return ok(request, data, 201)


async def reconcile(request: Request) -> Response:
    require_operator(request)
    reconciler = state(request).reconciler
    if "application/x-ndjson" in request.headers.get("accept", ""):
        reconciler.check_free()  # busy: the 409 before the stream starts (its status is 200)
        return progress_stream(reconciler.run)
    summary = await asyncio.to_thread(reconciler.run)
    return ok(request, summary_view(summary))


def _cursor(request: Request) -> unroutable.Position | None:
    raw = request.query_params.get("cursor")
    if not raw:
        return None
    try:
        return unroutable.decode(raw)
    except unroutable.BadCursor as exc:
        raise ValidationFailed(f"cursor: {exc}", fields=[{"field": "cursor", "message": str(exc)}]) from None


async def list_unroutable(request: Request) -> Response:
    require_operator(request)
    limit = query_int(request, "limit", unroutable.DEFAULT_LIMIT, 1, unroutable.MAX_LIMIT)
    after = _cursor(request)
    data = await read_tables(state(request).store, unroutable.page, limit, after)
    return ok(request, data)


routes = [
    Route("/api/v1/operator/reconcile", reconcile, methods=["POST"]),
    Route("/api/v1/operator/unroutable", list_unroutable, methods=["GET"]),
    Route("/api/v1/operator/accounts", create_account, methods=["POST"]),
    Route("/api/v1/operator/agent-keys", create_agent_key, methods=["POST"]),
    Route("/api/v1/operator/programs/{program_id}/api-key/rotation", flag_rotation, methods=["POST"]),
    Route("/api/v1/operator/programs/{program_id}/legacy-key", import_legacy_key, methods=["POST"]),
]

document(
    {
        reconcile: Doc(
            "Run the reconciler now",
            "operator",
            description='With `Accept: application/x-ndjson` the answer streams `{"progress": {...}}` '
            'lines, then one `{"data": ...}` line (what `tally reconcile` shows). `unroutable` counts '
            "the processor events routed to no program (`GET /api/v1/operator/unroutable` lists them). "
            "While a run holds the run lock (here or on another replica): 409 `reconcile_running` at "
            "once, with `Retry-After`.",
            auth=(OPERATOR_TOKEN,),
            data=RunSummary,
            result={
                "run_id": "run_2b",
                "events_read": 1200,
                "sales": 310,
                "commissions": 290,
                "duration_ms": 840,
                "high_water_seq": 1200,
                "mode": "incremental",
                "unroutable": 2,
            },
            content={"application/x-ndjson": {"schema": {"type": "string"}}},
            errors=(ReconcileRunning,),
            writes=True,
        ),
        list_unroutable: Doc(
            "Processor events routed to no program, newest first",
            "operator",
            description="As of the last reconcile run: each event once, with why it cannot be routed "
            "(`account_not_connected`, `account_shared`, `no_account`, or `awaiting_backfill` when a "
            "program has the account now: `routes_to` names it, and its next backfill covering the "
            "event's date picks it up). Page with `cursor` = the previous page's `next_cursor`.",
            auth=(OPERATOR_TOKEN,),
            params=(
                Param(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": unroutable.MAX_LIMIT, "default": 50},
                ),
                Param("cursor", {"type": "string"}, "the `next_cursor` of the previous page"),
            ),
            data=schemas.Unroutable,
            result={
                "events": [
                    {
                        "event_id": "evt_1Nq",
                        "type": "invoice.paid",
                        "account": "acct_1Brand",
                        "reason": "account_not_connected",
                        "received_at": "2026-11-21T10:00:00Z",
                        "routes_to": None,
                        "metadata_program_id": None,
                        "object_id": "in_1Nq",
                        "amount": 4900,
                        "currency": "usd",
                        "test_mode": False,
                        "occurred_at": "2026-11-21T09:59:58Z",
                    }
                ],
                "next_cursor": None,
            },
            errors=(ValidationFailed,),
        ),
        create_account: Doc(
            "Create an account owning a new workspace",
            "operator",
            description="The account token is shown once.",
            auth=(OPERATOR_TOKEN,),
            body=AccountIn,
            example={"email": "owner@brand.test", "workspace_name": "Brand"},
            status=201,
            data=schemas.Account,
            result={"account_id": "acc_1a", "workspace_id": "ws_7h2c", "token": "acct_example"},
            writes=True,
        ),
        create_agent_key: Doc(
            "Issue an agent key",
            "operator",
            auth=(OPERATOR_TOKEN,),
            body=AgentKeyIn,
            example={"name": "pricing bot", "scopes": ["programs:read"], "workspace_ids": ["ws_7h2c"]},
            status=201,
            data=schemas.AgentKey,
            result={
                "agent_key": "agt_example",
                "agent_id": "agent_3f",
                "scopes": ["programs:read"],
                "workspace_ids": ["ws_7h2c"],
            },
            writes=True,
        ),
        flag_rotation: Doc(
            "Flag a program key for mandatory rotation",
            "operator",
            description="Until the deadline responses to that key carry warnings and the Deprecation, "
            "Sunset and Link headers; from it on, the key is refused (401 `api_key_rotation_required`).",
            auth=(OPERATOR_TOKEN,),
            body=RotationIn,
            example={"deadline": "2026-12-01T00:00:00Z"},
            data=schemas.Rotation,
            result={
                "program_id": "prog_3k9a",
                "api_token_masked": "aff_••••••••3f9a",
                "flagged_at": "2026-11-21T10:00:00Z",
                "deadline": "2026-12-01T00:00:00Z",
            },
            errors=(ProgramNotFound, NotFound),
            writes=True,
        ),
        import_legacy_key: Doc(
            "Import a legacy (pre-prefix) program key; it replaces the current key",
            "operator",
            auth=(OPERATOR_TOKEN,),
            body=LegacyKeyIn,
            example={"api_key": "legacy0123456789abcdef"},
            status=201,
            data=schemas.LegacyKey,
            result={"api_token_masked": "lega••••••••cdef", "created_at": "2026-11-21T10:00:00Z"},
            errors=(ProgramNotFound, Conflict),
            writes=True,
        ),
    }
)
