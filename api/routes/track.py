"""Track endpoints: click and browser-mode lead are public; sale, refund and server-mode lead
need the program key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import refusals as refusal_limit
from api import schemas
from api.auth import bearer, program_from_key, require_program_key, state
from api.http import (
    CORS_HEADERS,
    Answer,
    answer,
    body_model,
    header,
    header_names,
    kept_headers,
    recall,
    remember,
    request_id,
)
from api.openapi import PROGRAM_KEY, Doc, document
from api.proxies import client_address
from ingest import refusals, tracking
from ingest.domain.clock import utcnow
from ingest.domain.errors import (
    DuplicateRefund,
    DuplicateTransaction,
    PartnerNotFound,
    ProgramMismatch,
    ProgramNotFound,
    RateLimited,
    RefundExceedsSale,
    TallyError,
)
from ingest.domain.inputs import ClickIn, LeadIn, RefundIn, SaleIn
from ingest.domain.records import Credential, Program
from ingest.storage.contract import KeyRead
from ingest.tracking import Call, Outcome
from ingest.writer import KeyChanged

KEPT_HEADERS = frozenset(
    {b"content-type", b"user-agent", b"origin", b"referer", b"x-request-id", b"x-forwarded-for"}
)


def _call(request: Request, endpoint: str, received_at: datetime, raw: bytes = b"") -> Call:
    return Call(
        endpoint=endpoint,
        received_at=received_at,
        body=raw.decode("utf-8", errors="replace"),
        headers=kept_headers(request, KEPT_HEADERS),
        request_id=request_id(request),
    )


Work = Callable[[datetime], Awaitable[Outcome]]


KEY_RETRIES = 3  # decisions of one call whose program key keeps changing under it


async def _handle(request: Request, endpoint: str, status: int, work: Work, cors: bool = False) -> Answer:
    """Run one track call received now; a refusal for a known program is logged (a bounded note). A
    call the writer hands back because its program key changed meanwhile (`KeyChanged`: a
    replica read it from its cache) is decided again, key and all."""
    received_at = utcnow()
    if cors:
        remember(request, cors=True)
    try:
        for attempt in range(KEY_RETRIES):
            try:
                outcome = await work(received_at)
                break
            except KeyChanged:
                if attempt == KEY_RETRIES - 1:
                    raise
    except TallyError as exc:
        refusal_limit.check(request, exc)  # over its client's refusal rate: 429, nothing logged
        program_id = recall(request, "program_id")
        if program_id is not None and not exc.logged:
            call = _call(request, endpoint, received_at)
            await tracking.log_refusal(state(request).writer, call, program_id, exc, _note(request, exc))
        raise
    return answer(request, outcome.data, status, outcome.warnings, CORS_HEADERS if cors else None)


def _note(request: Request, exc: TallyError) -> str:
    """A refusal's tracking-log detail: bounded, nothing of the body but its size and hash; the
    error's message only when the call's program key was valid (the tenant's own words)."""
    return refusals.note(
        f"{exc.code}: {exc.check}" if exc.check else exc.code,
        getattr(request, "_body", None),  # kept by read_body, when the body was read
        header(request, b"content-type"),
        header_names(request),
        message=exc.message if recall(request, "authenticated") else None,
    )


def _key(request: Request, program: Program) -> KeyRead:
    """The program key this call was let in with (`program_from_key` kept it) and its program."""
    credential: Credential = recall(request, "credential")
    return credential, program


def _client(request: Request) -> str:
    """The address the public rate limit keys on (the peer's, or past trusted proxies)."""
    return client_address(request.scope, state(request).settings.trusted_proxies)


async def preflight(request: Request) -> Response:
    return Response(status_code=204, headers=CORS_HEADERS)


async def click(request: Request) -> Answer:
    async def work(received_at: datetime) -> Outcome:
        st = state(request)
        st.limiter.check(_client(request))
        raw, inp = await body_model(request, ClickIn)
        if st.store.program(inp.program_id) is not None:
            remember(request, program_id=inp.program_id)
        return await tracking.record_click(
            st.store, st.writer, _call(request, "track/click", received_at, raw), inp
        )

    return await _handle(request, "track/click", 201, work, cors=True)


async def track_click(request: Request) -> Response:
    if request.method == "OPTIONS":
        return await preflight(request)
    return (await click(request)).response()


async def lead(request: Request) -> Answer:
    async def work(received_at: datetime) -> Outcome:
        st = state(request)
        token = bearer(request)
        if token is None:
            st.limiter.check(_client(request))
        program = program_from_key(request, token) if token is not None else None
        raw, inp = await body_model(request, LeadIn)
        if program is None and inp.program_id and st.store.program(inp.program_id) is not None:
            remember(request, program_id=inp.program_id)
        call = _call(request, "track/lead", received_at, raw)
        key = _key(request, program) if program is not None else None
        return await tracking.record_lead(st.store, st.writer, call, inp, program, key)

    return await _handle(request, "track/lead", 200, work, cors=True)


async def track_lead(request: Request) -> Response:
    if request.method == "OPTIONS":
        return await preflight(request)
    return (await lead(request)).response()


async def sale(request: Request) -> Answer:
    async def work(received_at: datetime) -> Outcome:
        st = state(request)
        program = require_program_key(request)
        raw, inp = await body_model(request, SaleIn)
        call = _call(request, "track/sale", received_at, raw)
        return await tracking.record_sale(st.store, st.writer, call, inp, program, _key(request, program))

    return await _handle(request, "track/sale", 200, work)


async def track_sale(request: Request) -> Response:
    return (await sale(request)).response()


async def refund(request: Request) -> Answer:
    async def work(received_at: datetime) -> Outcome:
        st = state(request)
        program = require_program_key(request)
        raw, inp = await body_model(request, RefundIn)
        call = _call(request, "track/refund", received_at, raw)
        return await tracking.record_refund(st.store, st.writer, call, inp, program, _key(request, program))

    return await _handle(request, "track/refund", 200, work)


async def track_refund(request: Request) -> Response:
    return (await refund(request)).response()


# Served by api.hotpath.TallyApp ahead of the middleware stack (the routes below answer the same).
HOT = {
    ("POST", "/api/v1/track/click"): click,
    ("POST", "/api/v1/track/lead"): lead,
    ("POST", "/api/v1/track/sale"): sale,
    ("POST", "/api/v1/track/refund"): refund,
}

routes = [
    Route("/api/v1/track/click", track_click, methods=["POST", "OPTIONS"]),
    Route("/api/v1/track/lead", track_lead, methods=["POST", "OPTIONS"]),
    Route("/api/v1/track/sale", track_sale, methods=["POST"]),
    Route("/api/v1/track/refund", track_refund, methods=["POST"]),
]

_PUBLIC = "Public: no credential. Rate limited per client (`TALLY_PUBLIC_RATE_PER_SECOND`)."
# Every track endpoint: refusals of calls without a valid program key are rate limited per client.
document(
    {
        track_click: Doc(
            "Record a click",
            "track",
            description=_PUBLIC,
            body=ClickIn,
            example={
                "program_id": "prog_3k9a",
                "partner_code": "alice",
                "url": "https://brand.test/?aff=alice",
            },
            status=201,
            data=schemas.Click,
            result={"click_id": "clk_8f2b", "program_id": "prog_3k9a", "partner_code": "alice"},
            errors=(ProgramNotFound, PartnerNotFound, RateLimited),
            writes=True,
        ),
        track_lead: Doc(
            "Record a lead",
            "track",
            description="Browser mode (no credential, `program_id` in the body) or server mode (the "
            "program key; a different `program_id` is 422 `program_mismatch`). " + _PUBLIC,
            auth=(PROGRAM_KEY,),
            auth_optional=True,
            body=LeadIn,
            example={"customer_external_id": "cust_42", "email": "c@example.com", "click_id": "clk_8f2b"},
            data=schemas.Lead,
            warnings=True,
            result={
                "lead_id": "lead_1b7c",
                "customer_external_id": "cust_42",
                "status": "settled",
                "provisional": False,
            },
            errors=(ProgramNotFound, ProgramMismatch, RateLimited),
            writes=True,
        ),
        track_sale: Doc(
            "Record a sale",
            "track",
            description="`additional_data.test_mode: true` records a test sale (never commissioned).",
            auth=(PROGRAM_KEY,),
            body=SaleIn,
            example={"transaction_id": "in_1", "customer_external_id": "cust_42", "amount": 4900},
            data=schemas.Sale,
            warnings=True,
            result={
                "sale_id": "sale_5d1e",
                "transaction_id": "in_1",
                "test_mode": False,
                "attributed": True,
                "partner_code": "alice",
                "customer_external_id": "cust_42",
                "amount": 4900,
                "currency": "usd",
            },
            errors=(DuplicateTransaction, RateLimited),
            writes=True,
        ),
        track_refund: Doc(
            "Record a refund",
            "track",
            auth=(PROGRAM_KEY,),
            body=RefundIn,
            example={"transaction_id": "in_1", "refund_id": "re_1", "amount": 1000},
            data=schemas.Refund,
            warnings=True,
            result={"refund_id": "re_1", "transaction_id": "in_1", "amount": 1000, "sale_found": True},
            errors=(DuplicateRefund, RefundExceedsSale, RateLimited),
            writes=True,
        ),
    }
)
