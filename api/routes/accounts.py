"""Account endpoints (account token): workspaces, members, programs, keys, partners."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import account_program, require_account, state
from api.http import body_model, ok
from ingest import control
from ingest.inputs import MemberIn, PartnerIn, ProgramCreateIn, SettingsPatch
from ingest.records import Program


async def add_member(request: Request) -> Response:
    account = require_account(request)
    _, inp = await body_model(request, MemberIn)
    st = state(request)
    workspace_id = request.path_params["workspace_id"]
    data = await control.add_member(st.store, st.writer, account.account_id, workspace_id, inp)
    return ok(request, data, 201)


async def list_programs(request: Request) -> Response:
    account = require_account(request)
    st = state(request)
    programs = st.store.programs_in(sorted(account.workspace_ids))
    return ok(request, [control.program_view(st.store, p) for p in programs])


async def create_program(request: Request) -> Response:
    account = require_account(request)
    _, inp = await body_model(request, ProgramCreateIn)
    st = state(request)
    program = await control.create_program(st.store, st.writer, account.account_id, inp)
    return ok(request, control.program_view(st.store, program), 201)


async def get_program(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    return ok(request, control.program_view(state(request).store, program))


def _owned_program(request: Request) -> Program:
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return program


async def patch_program(request: Request) -> Response:
    program = _owned_program(request)
    _, inp = await body_model(request, SettingsPatch)
    st = state(request)
    updated = await control.update_program(st.writer, program, inp)
    return ok(request, control.program_view(st.store, updated))


async def regenerate_key(request: Request) -> Response:
    program = _owned_program(request)
    st = state(request)
    return ok(request, await control.regenerate_key(st.store, st.writer, program), 201)


async def add_partner(request: Request) -> Response:
    program = _owned_program(request)
    _, inp = await body_model(request, PartnerIn)
    st = state(request)
    partner = await control.add_partner(st.store, st.writer, program, inp)
    return ok(request, control.partner_view(partner), 201)


async def list_partners(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    partners = state(request).store.partners(program.program_id)
    return ok(request, [control.partner_view(p) for p in partners])


routes = [
    Route("/api/v1/workspaces/{workspace_id}/members", add_member, methods=["POST"]),
    Route("/api/v1/programs", list_programs, methods=["GET"]),
    Route("/api/v1/programs", create_program, methods=["POST"]),
    Route("/api/v1/programs/{program_id}", get_program, methods=["GET"]),
    Route("/api/v1/programs/{program_id}", patch_program, methods=["PATCH"]),
    Route("/api/v1/programs/{program_id}/api-key", regenerate_key, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/partners", add_partner, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/partners", list_partners, methods=["GET"]),
]
