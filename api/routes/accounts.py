"""Account endpoints (account token): workspaces, members, programs, keys, partners."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import account_program, require_account, state
from api.http import body_model, ok
from ingest import control
from ingest.errors import ValidationFailed
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
    updated = await control.update_program(st.store, st.writer, program, inp)
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


CHECKLIST_STEPS = (
    "api_key_generated",
    "test_sale_received",
    "click_received",
    "lead_received",
    "sale_received",
    "processor_event_received",
)


async def checklist(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    done = state(request).store.checklist(program.program_id)
    steps = [{"key": k, "done": k in done, "done_at": done.get(k)} for k in CHECKLIST_STEPS]
    return ok(request, {"steps": steps})


def _int_param(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ValidationFailed(
            f"{name} must be an integer from {low} to {high}",
            fields=[{"field": name, "message": f"integer from {low} to {high}"}],
        )
    return int(raw)


async def tracking_log(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    limit = _int_param(request, "limit", 50, 1, 500) or 50
    before = _int_param(request, "before", None, 1, 2**62)
    await state(request).writer.sync()
    lines = state(request).store.tracking_log(program.program_id, limit, before)
    entries = [
        {
            "id": line.log_id,
            "at": line.logged_at,
            "endpoint": line.endpoint,
            "status": line.status,
            "outcome": line.outcome,
            "detail": line.detail,
            "request_id": line.request_id,
        }
        for line in lines
    ]
    next_before = lines[-1].log_id if len(lines) == limit else None
    return ok(request, {"entries": entries, "next_before": next_before})


routes = [
    Route("/api/v1/programs/{program_id}/checklist", checklist, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/tracking-log", tracking_log, methods=["GET"]),
    Route("/api/v1/workspaces/{workspace_id}/members", add_member, methods=["POST"]),
    Route("/api/v1/programs", list_programs, methods=["GET"]),
    Route("/api/v1/programs", create_program, methods=["POST"]),
    Route("/api/v1/programs/{program_id}", get_program, methods=["GET"]),
    Route("/api/v1/programs/{program_id}", patch_program, methods=["PATCH"]),
    Route("/api/v1/programs/{program_id}/api-key", regenerate_key, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/partners", add_partner, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/partners", list_partners, methods=["GET"]),
]
