"""Operator endpoints (TALLY_OPERATOR_TOKEN): accounts, agent keys, key rotation, legacy keys."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import require_operator, state
from api.http import body_model, ok
from api.streaming import progress_stream, summary_view
from ingest import control
from ingest.errors import ProgramNotFound
from ingest.inputs import AccountIn, AgentKeyIn, LegacyKeyIn, RotationIn
from ingest.records import Program


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
    st = state(request)
    data = await control.regenerate_key(st.store, st.writer, program, value=inp.api_key)
    data.pop("api_key")
    return ok(request, data, 201)


async def reconcile(request: Request) -> Response:
    require_operator(request)
    reconciler = state(request).reconciler
    if "application/x-ndjson" in request.headers.get("accept", ""):
        return progress_stream(reconciler.run)
    summary = await asyncio.to_thread(reconciler.run)
    return ok(request, summary_view(summary))


routes = [
    Route("/api/v1/operator/reconcile", reconcile, methods=["POST"]),
    Route("/api/v1/operator/accounts", create_account, methods=["POST"]),
    Route("/api/v1/operator/agent-keys", create_agent_key, methods=["POST"]),
    Route("/api/v1/operator/programs/{program_id}/api-key/rotation", flag_rotation, methods=["POST"]),
    Route("/api/v1/operator/programs/{program_id}/legacy-key", import_legacy_key, methods=["POST"]),
]
