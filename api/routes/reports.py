"""Reads for finance and engineers (account token, any member): sales, explain, commissions, and
the finance and double-counting reports in their formats (`?format=`, default json)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.auth import account_program, require_account, state
from api.http import ok, query_int
from api.openapi import ACCOUNT_TOKEN, Doc, Param, document
from api.state import State, read_store, read_tables
from ingest.domain import bounds
from ingest.domain.errors import ProgramNotFound, SaleNotFound, ValidationFailed
from ingest.domain.records import Program
from reports import lineitems, load, reads
from reports.html import DOCUMENT_CSP
from reports.render import DOUBLE_COUNTING_FORMATS, FINANCE_FORMATS, render


def _bad(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", fields=[{"field": field, "message": message}])


def moment_param(request: Request, name: str, end: bool) -> datetime | None:
    """A query date (`YYYY-MM-DD`, whole day) or RFC 3339 time; `to` dates include their day.
    Years 1970..9999 (`ingest.bounds`)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return bounds.query_moment(raw, end)
    except ValueError as exc:
        raise _bad(name, str(exc)) from None


def currency_param(request: Request, name: str = "currency") -> str | None:
    """A currency filter: three letters, any case (sales are kept in lower case)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not (len(raw) == 3 and raw.isascii() and raw.isalpha()):
        raise _bad(name, "must be a three-letter currency code")
    return raw.lower()


def _bool(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if raw not in ("true", "false"):
        raise _bad(name, "must be true or false")
    return raw == "true"


def _page(request: Request) -> tuple[int, int]:
    """`limit` (default 100, at most 1000) and `offset` of a list read (sales, commissions)."""
    return max(1, query_int(request, "limit", 100, 0, 1000)), query_int(request, "offset", 0, 0, 10**9)


def period_param(request: Request, required: bool = False) -> str | None:
    raw = request.query_params.get("period")
    if raw is None and not required:
        return None
    try:
        return bounds.period(raw or "")
    except ValueError as exc:
        raise _bad("period", str(exc)) from None


async def list_sales(request: Request) -> Response:
    program = account_program(request, require_account(request))
    limit, offset = _page(request)
    flt = reads.SaleFilter(
        transaction_id=request.query_params.get("transaction_id") or None,
        start=moment_param(request, "from", end=False),
        end=moment_param(request, "to", end=True),
        attributed=_bool(request, "attributed"),
        partner_code=request.query_params.get("partner_code") or None,
        currency=currency_param(request),
        limit=limit,
        offset=offset,
    )
    fmt = format_param(request, LINE_FORMATS)
    rows = await read_tables(state(request).store, reads.sales, program.program_id, flt)
    if fmt == "csv":
        body = lineitems.to_csv(rows, reads.SALE_FIELDS, lineitems.SALE_MONEY)
        return report_response(body, CSV, f"sales-{program.program_id}.csv", fmt)
    return ok(request, rows)


async def explain_sale(request: Request) -> Response:
    program = account_program(request, require_account(request))
    transaction_id = request.path_params["transaction_id"]
    found = await read_tables(state(request).store, reads.explain, program.program_id, transaction_id)
    if found is None:
        raise await sale_not_found(state(request), program, transaction_id)
    return ok(request, found)


async def sale_not_found(st: State, program: Program, transaction_id: str) -> SaleNotFound:
    """Why explain has no sale `transaction_id`: recorded in the log but not reconciled yet (a
    sale since the last reconcile run: `recorded: true` and a hint saying when it will be), or
    not recorded at all (`recorded: false`, a hint about which id a sale is known by). The code
    stays `sale_not_found` (CONTRACT section 9); the rest is extra keys of `error`."""
    await st.writer.sync()  # what was acknowledged so far is visible to the lookup
    ledger = await read_store(st.store.sale, program.program_id, [transaction_id])
    pid = program.program_id
    if ledger is None:
        return SaleNotFound(
            f"no sale {transaction_id} in program {pid}",
            recorded=False,
            hint="No sale with this transaction id was recorded for this program. A connect sale is "
            "known by its invoice id, else its payment intent id, else its checkout session id; a "
            "self-hosted one by the transaction_id its track call sent.",
        )
    every = st.settings.reconcile_interval_seconds
    when = (
        f"the next scheduled reconcile run (every {every} s)"
        if every
        else "the next reconcile run (the schedule is off: TALLY_RECONCILE_INTERVAL_SECONDS=0)"
    )
    return SaleNotFound(
        f"sale {transaction_id} is recorded in program {pid} but not reconciled yet: it shows after {when}",
        recorded=True,
        hint=f"The sale is in the log; attribution and commissions come with {when}. To see it "
        "now, start a run: `tally reconcile` (operator token) or POST /api/v1/operator/reconcile.",
    )


async def list_commissions(request: Request) -> Response:
    program = account_program(request, require_account(request))
    period = period_param(request)
    page = _page(request)
    fmt = format_param(request, LINE_FORMATS)
    rows = await read_tables(state(request).store, reads.commissions, program.program_id, period, *page)
    if fmt == "csv":
        body = lineitems.to_csv(rows, reads.COMMISSION_FIELDS, lineitems.COMMISSION_MONEY)
        suffix = f"-{period}" if period else ""
        return report_response(body, CSV, f"commissions-{program.program_id}{suffix}.csv", fmt)
    return ok(request, rows)


def format_param(request: Request, allowed: tuple[str, ...]) -> str:
    raw = request.query_params.get("format") or "json"
    if raw not in allowed:
        raise _bad("format", f"must be one of {', '.join(allowed)}")
    return raw


def report_response(body: bytes, content_type: str, filename: str, fmt: str) -> Response:
    """A rendered report: json as is; csv/xlsx as downloads; html inline under its own CSP."""
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    if fmt in ("csv", "xlsx"):
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    elif fmt == "html":
        headers["Content-Disposition"] = f'inline; filename="{filename}"'
        headers["Content-Security-Policy"] = DOCUMENT_CSP
    return Response(body, 200, headers, media_type=content_type)


def _finance(st: State, program_id: str, name: str, period: str, fmt: str) -> tuple[bytes, str, str]:
    with st.store.reader() as db:
        if fmt == "xlsx":  # with the month's line items on sheets of their own
            report, lines = lineitems.finance_with_lines(db, program_id, period, program_name=name)
            return render(report, fmt, lines)
        report = load.finance(db, program_id, period, program_name=name)
    return render(report, fmt)


async def finance_report(
    st: State, program_id: str, name: str, period: str, fmt: str
) -> tuple[bytes, str, str]:
    """Read and render off the event loop: a large month takes a moment (see bench/report.py)."""
    return await asyncio.to_thread(_finance, st, program_id, name, period, fmt)


async def get_finance_report(request: Request) -> Response:
    program = account_program(request, require_account(request))
    period = period_param(request, required=True)
    assert period is not None
    fmt = format_param(request, FINANCE_FORMATS)
    body, content_type, filename = await finance_report(
        state(request), program.program_id, program.name, period, fmt
    )
    return report_response(body, content_type, filename, fmt)


def _double_counting(st: State, program_id: str, period: str | None, fmt: str) -> tuple[bytes, str, str]:
    with st.store.reader() as db:
        report = load.double_counting(db, program_id, period)
    return render(report, fmt)


async def get_double_counting_report(request: Request) -> Response:
    program = account_program(request, require_account(request))
    period = period_param(request)
    fmt = format_param(request, DOUBLE_COUNTING_FORMATS)
    found = await asyncio.to_thread(_double_counting, state(request), program.program_id, period, fmt)
    return report_response(*found, fmt)


routes = [
    Route("/api/v1/programs/{program_id}/sales", list_sales, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/sales/{transaction_id:id}/explain", explain_sale, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/commissions", list_commissions, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/reports/finance", get_finance_report, methods=["GET"]),
    Route(
        "/api/v1/programs/{program_id}/reports/double-counting", get_double_counting_report, methods=["GET"]
    ),
]

_READ = "Any member of the program's workspace."
LINE_FORMATS = ("json", "csv")
CSV = "text/csv; charset=utf-8"
_LINE_FORMAT = Param(
    "format",
    {"type": "string", "enum": list(LINE_FORMATS), "default": "json"},
    "csv: the same rows and columns (money in minor units), then each money column's `_decimal` twin "
    "in whole units of the row's currency; UTF-8 with a BOM (the format of every CSV)",
)
_PAGE = (
    Param("limit", {"type": "integer", "minimum": 0, "maximum": 1000, "default": 100}),
    Param("offset", {"type": "integer", "minimum": 0, "maximum": 10**9, "default": 0}),
)
PERIOD = Param(
    "period", {"type": "string", "pattern": r"^\d{4}-(0[1-9]|1[0-2])$"}, "A month, YYYY-MM", example="2026-01"
)
DOWNLOADS: dict[str, dict[str, Any]] = {
    "text/csv": {"schema": {"type": "string"}},
    "text/html": {"schema": {"type": "string"}},
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": {
        "schema": {"type": "string", "contentMediaType": "application/octet-stream"}
    },
}
_SALE_EXAMPLE = {
    "sale_id": "sale_5d1e",
    "transaction_id": "in_1",
    "source": "self_hosted",
    "amount": 4900,
    "currency": "usd",
    "is_recurring": False,
    "test_mode": False,
    "partner_code": "alice",
    "attribution_rule": "click",
    "unattributed_reason": None,
    "commission": 1470,
    "platform_fee": 0,
    "refunded": 0,
    "occurred_at": "2026-01-02T10:00:00Z",
}
document(
    {
        list_sales: Doc(
            "Reconciled sales with their attribution and commission",
            "reads",
            description=_READ,
            auth=(ACCOUNT_TOKEN,),
            params=(
                Param("transaction_id", {"type": "string"}),
                Param(
                    "from",
                    {"type": "string"},
                    "YYYY-MM-DD (whole day) or an RFC 3339 time",
                    example="2026-01-01",
                ),
                Param(
                    "to",
                    {"type": "string"},
                    "YYYY-MM-DD (included) or an RFC 3339 time",
                    example="2026-01-31",
                ),
                Param("attributed", {"type": "string", "enum": ["true", "false"]}),
                Param("partner_code", {"type": "string"}, "Sales attributed to this partner"),
                Param(
                    "currency",
                    {"type": "string", "pattern": "^[A-Za-z]{3}$"},
                    "Sales in this currency (any case)",
                    example="usd",
                ),
                *_PAGE,
                _LINE_FORMAT,
            ),
            data=list[schemas.SaleRow],
            result=[_SALE_EXAMPLE],
            content={"text/csv": {"schema": {"type": "string"}}},
            errors=(ProgramNotFound, ValidationFailed),
        ),
        explain_sale: Doc(
            "The attribution ladder, step by step, for one sale",
            "reads",
            description=_READ,
            auth=(ACCOUNT_TOKEN,),
            data=schemas.Explain,
            result={
                "sale": _SALE_EXAMPLE,
                "steps": [
                    {"step": 1, "rule": "click", "looked_up": "clk_8f2b", "found": True, "result": "alice"}
                ],
                "answer": "attributed to alice by rule click",
                "lines": [
                    {
                        "partner_code": "alice",
                        "kind": "commission",
                        "cause": "",
                        "adjusts": None,
                        "period": "2026-01",
                        "currency": "usd",
                        "amount": 1470,
                        "reversed": 0,
                        "platform_fee": 245,
                        "refunded": 0,
                        "status": "approved",
                        "status_reason": None,
                        "status_by": None,
                        "payout_id": None,
                        "dated_at": "2026-01-05T10:00:00Z",
                        "booking_id": "bk_3c1d",
                        "booked_at": "2026-02-04T09:00:00Z",
                    }
                ],
            },
            errors=(ProgramNotFound, SaleNotFound),
        ),
        list_commissions: Doc(
            "Commission lines (of a month, with `period`)",
            "reads",
            description=_READ,
            auth=(ACCOUNT_TOKEN,),
            params=(PERIOD, *_PAGE, _LINE_FORMAT),
            data=list[schemas.CommissionRow],
            content={"text/csv": {"schema": {"type": "string"}}},
            result=[
                {
                    "transaction_id": "in_1",
                    "partner_code": "alice",
                    "amount": 1470,
                    "currency": "usd",
                    "status": "pending",
                    "period": "2026-01",
                    "kind": "commission",
                }
            ],
            errors=(ProgramNotFound, ValidationFailed),
        ),
        get_finance_report: Doc(
            "The finance report of a month (json, csv, html or xlsx)",
            "reads",
            description=_READ,
            auth=(ACCOUNT_TOKEN,),
            params=(
                Param(PERIOD.name, PERIOD.schema, PERIOD.description, required=True, example="2026-01"),
                Param("format", {"type": "string", "enum": list(FINANCE_FORMATS), "default": "json"}),
            ),
            data=dict[str, Any],
            result={
                "program_id": "prog_3k9a",
                "period": "2026-01",
                "currencies": [],
                "reconciled": True,
                "closed": True,
                "closed_at": "2026-02-01T09:00:00Z",
                "closed_by": "acc_1a",
            },
            content=DOWNLOADS,
            errors=(ProgramNotFound, ValidationFailed),
        ),
        get_double_counting_report: Doc(
            "The double-counting report (json or csv)",
            "reads",
            description=_READ,
            auth=(ACCOUNT_TOKEN,),
            params=(
                PERIOD,
                Param("format", {"type": "string", "enum": list(DOUBLE_COUNTING_FORMATS), "default": "json"}),
            ),
            data=schemas.DoubleCounting,
            result={
                "program_id": "prog_3k9a",
                "period": None,
                "summary": [
                    {
                        "currency": "usd",
                        "kind": "ingest_refused",
                        "count": 2,
                        "amount": 5000,
                        "partner_mismatches": 2,
                    }
                ],
                "totals": [
                    {"currency": "usd", "lines": 2, "sales": 1, "amount": 5000, "partner_mismatches": 2}
                ],
                "double_counts": [
                    {
                        "kind": "ingest_refused",
                        "transaction_id": "in_1Nq",
                        "sale_id": "in_1Nq",
                        "duplicate_id": f"sale_{n}",
                        "duplicate_transaction_id": "in_1Nq",
                        "matched_on": "invoice_id",
                        "amount": 5000,
                        "distinct_amount": 5000 if n == 1 else 0,
                        "currency": "usd",
                        "partner_code": "alice",
                        "duplicate_partner_code": "bob",
                        "partner_mismatch": True,
                        "occurred_at": f"2026-11-21T10:0{n}:00Z",
                        "connect_record_ids": None,
                    }
                    for n in (1, 2)
                ],
            },
            content={"text/csv": {"schema": {"type": "string"}}},
            errors=(ProgramNotFound, ValidationFailed),
        ),
    }
)
