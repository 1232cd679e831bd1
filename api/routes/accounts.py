"""Account endpoints (account token): workspaces, members, programs, keys, partners."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.auth import account_program, require_account, state
from api.http import body_model, ok, query_int
from api.openapi import ACCOUNT_TOKEN, Doc, Param, document
from api.state import read_store, read_tables
from ingest import control, partners
from ingest.domain.errors import (
    Conflict,
    NotFound,
    OwnerRequired,
    ProgramNotFound,
    StripeAccountInUse,
    ValidationFailed,
)
from ingest.domain.inputs import MemberIn, PartnerIn, ProgramCreateIn, SettingsPatch
from ingest.domain.records import Program
from reports import statements


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


def _owner_and_program(request: Request) -> tuple[str, Program]:
    """The acting owner's account id and the program of the path, which it owns."""
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return account.account_id, program


def _owned_program(request: Request) -> Program:
    return _owner_and_program(request)[1]


async def patch_program(request: Request) -> Response:
    owner, program = _owner_and_program(request)
    _, inp = await body_model(request, SettingsPatch)
    st = state(request)
    updated = await control.update_program(st.store, st.writer, program, inp, owner)
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
    return ok(request, {**control.partner_view(partner), **partners.payout_view(None), "balances": []}, 201)


async def list_partners(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    st = state(request)
    store = st.store
    details = store.payout_details(program.program_id)
    balances = await read_tables(store, statements.balances, program.program_id, None)
    found = [
        {
            **control.partner_view(p),
            **partners.payout_view(details.get(p.code)),
            "balances": balances.get(p.code, []),
        }
        for p in store.partners(program.program_id)
    ]
    return ok(request, found)


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


async def tracking_log(request: Request) -> Response:
    account = require_account(request)
    program = account_program(request, account)
    limit = query_int(request, "limit", 50, 1, 500) or 50
    before = query_int(request, "before", None, 1, 2**62)
    await state(request).writer.sync()
    lines = await read_store(state(request).store.tracking_log, program.program_id, limit, before)
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

PROGRAM_EXAMPLE = {
    "program_id": "prog_3k9a",
    "workspace_id": "ws_7h2c",
    "name": "Brand partners",
    "commission_type": "percent",
    "commission_bps": 3000,
    "commission_flat": 0,
    "recurring_months": None,
    "platform_fee_bps": 0,
    "holding_days": 30,
    "requires_server_side_leads": False,
    "stripe_account_id": None,
    "payout_minimum": {"eur": 5000, "jpy": 5000, "usd": 5000},
    "website_url": "https://brand.test",
    "api_token_masked": "aff_••••••••3f9a",
    "api_key_rotation_deadline": None,
    "created_at": "2026-11-21T10:00:00Z",
    "updated_at": "2026-11-21T10:00:00Z",
}
PARTNER_EXAMPLE = {
    "partner_id": "ptn_4c1d",
    "program_id": "prog_3k9a",
    "code": "alice",
    "name": "Alice",
    "email": "alice@partner.test",
    "created_at": "2026-11-21T10:00:00Z",
    **dict.fromkeys(partners.PAYOUT_FIELDS),
    "balances": [{"currency": "usd", "approved_unpaid": 4200, "pending": 1500, "held": 0}],
}
_MEMBER = "Any member of the program's workspace."
_PER_CURRENCY = (
    " `commission_flat` and `payout_minimum` take an integer of minor units, the same number in every"
    ' currency, or an object by currency (`{"usd": 500, "jpy": 500}`: 5.00 USD and 500 JPY); a flat rule'
    " by currency pays nothing for a sale in a currency it does not name (its warning"
    " `no_flat_amount_for_currency`), and a payout minimum by currency is 0 for one it does not name."
)
_OWNER = "An owner of the program's workspace."
document(
    {
        add_member: Doc(
            "Add a member (or owner) to a workspace",
            "accounts",
            description="Owner only. The new account's token is shown once.",
            auth=(ACCOUNT_TOKEN,),
            body=MemberIn,
            example={"email": "finance@brand.test", "role": "member"},
            status=201,
            data=schemas.Member,
            result={
                "account_id": "acc_9e",
                "token": "acct_example",
                "workspace_id": "ws_7h2c",
                "role": "member",
            },
            errors=(NotFound, OwnerRequired),
            writes=True,
        ),
        list_programs: Doc(
            "The caller's programs",
            "accounts",
            auth=(ACCOUNT_TOKEN,),
            data=list[schemas.Program],
            result=[PROGRAM_EXAMPLE],
        ),
        create_program: Doc(
            "Create a program (and its key, whose value is never shown: regenerate it)",
            "accounts",
            description="Owner of the workspace only. Settings are optional, with defaults." + _PER_CURRENCY,
            auth=(ACCOUNT_TOKEN,),
            body=ProgramCreateIn,
            example={"workspace_id": "ws_7h2c", "name": "Brand partners", "commission_bps": 3000},
            status=201,
            data=schemas.Program,
            result=PROGRAM_EXAMPLE,
            errors=(NotFound, OwnerRequired, StripeAccountInUse),
            writes=True,
        ),
        get_program: Doc(
            "A program, with its masked key",
            "accounts",
            description=_MEMBER,
            auth=(ACCOUNT_TOKEN,),
            data=schemas.Program,
            result=PROGRAM_EXAMPLE,
            errors=(ProgramNotFound,),
        ),
        patch_program: Doc(
            "Change a program's settings",
            "accounts",
            description=_OWNER + " Only the fields sent change." + _PER_CURRENCY,
            auth=(ACCOUNT_TOKEN,),
            body=SettingsPatch,
            example={
                "commission_type": "flat",
                "commission_flat": {"usd": 500, "jpy": 500},
                "holding_days": 14,
            },
            data=schemas.Program,
            result=PROGRAM_EXAMPLE,
            errors=(ProgramNotFound, NotFound, OwnerRequired, StripeAccountInUse),
            writes=True,
        ),
        regenerate_key: Doc(
            "Generate or regenerate the program API key (the only time it is shown)",
            "accounts",
            description=_OWNER + " The previous key stops working at once; a rotation flag is cleared.",
            auth=(ACCOUNT_TOKEN,),
            status=201,
            data=schemas.ApiKey,
            result={
                "api_key": "aff_0123456789abcdefghijABCDEFGHIJ3f9a",
                "api_token_masked": "aff_••••••••3f9a",
                "created_at": "2026-11-21T10:00:00Z",
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired, Conflict),
            writes=True,
        ),
        add_partner: Doc(
            "Add a partner",
            "accounts",
            description=_OWNER,
            auth=(ACCOUNT_TOKEN,),
            body=PartnerIn,
            example={"code": "alice", "name": "Alice", "email": "alice@partner.test"},
            status=201,
            data=schemas.PartnerOut,
            result={**PARTNER_EXAMPLE, "balances": []},  # a new partner is owed nothing yet
            errors=(ProgramNotFound, NotFound, OwnerRequired, Conflict),
            writes=True,
        ),
        list_partners: Doc(
            "A program's partners",
            "accounts",
            description=_MEMBER,
            auth=(ACCOUNT_TOKEN,),
            data=list[schemas.PartnerOut],
            result=[PARTNER_EXAMPLE],
            errors=(ProgramNotFound,),
        ),
        checklist: Doc(
            "The integration checklist",
            "reads",
            description=_MEMBER,
            auth=(ACCOUNT_TOKEN,),
            data=schemas.Checklist,
            result={
                "steps": [
                    {"key": k, "done": k == "api_key_generated", "done_at": None}
                    if k != "api_key_generated"
                    else {"key": k, "done": True, "done_at": "2026-11-21T10:00:00Z"}
                    for k in CHECKLIST_STEPS
                ]
            },
            errors=(ProgramNotFound,),
        ),
        tracking_log: Doc(
            "The tracking log, newest first",
            "reads",
            description=_MEMBER + " Page with `before` = the previous page's `next_before`.",
            auth=(ACCOUNT_TOKEN,),
            params=(
                Param("limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}),
                Param("before", {"type": "integer", "minimum": 1, "maximum": 2**62}),
            ),
            data=schemas.TrackingLog,
            result={
                "entries": [
                    {
                        "id": 12,
                        "at": "2026-11-21T10:00:00Z",
                        "endpoint": "track/sale",
                        "status": 200,
                        "outcome": "accepted",
                        "detail": "sale in_1 4900 usd",
                        "request_id": "req_5e",
                    }
                ],
                "next_before": None,
            },
            errors=(ProgramNotFound, ValidationFailed),
        ),
    }
)
