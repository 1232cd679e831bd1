"""Reads for finance and engineers (account token, any member): sales, explain, commissions."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import account_program, require_account, state
from api.http import ok
from ingest.errors import SaleNotFound, ValidationFailed
from reports import reads

PERIOD = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


def _bad(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", fields=[{"field": field, "message": message}])


def _moment(request: Request, name: str, end: bool) -> datetime | None:
    """A query date (`YYYY-MM-DD`, whole day) or RFC 3339 time; `to` dates include their day."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        if len(raw) == 10:
            day = date.fromisoformat(raw)
            return datetime.combine(day + timedelta(days=1) if end else day, time(), UTC)
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise _bad(name, "must be YYYY-MM-DD or an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise _bad(name, "an RFC 3339 time needs a time zone")
    return moment


def _bool(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if raw not in ("true", "false"):
        raise _bad(name, "must be true or false")
    return raw == "true"


def _int(request: Request, name: str, default: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) > high:
        raise _bad(name, f"must be an integer from 0 to {high}")
    return int(raw)


def period_param(request: Request, required: bool = False) -> str | None:
    raw = request.query_params.get("period")
    if raw is None and not required:
        return None
    if raw is None or not PERIOD.match(raw):
        raise _bad("period", "must be YYYY-MM")
    return raw


async def list_sales(request: Request) -> Response:
    program = account_program(request, require_account(request))
    flt = reads.SaleFilter(
        transaction_id=request.query_params.get("transaction_id") or None,
        start=_moment(request, "from", end=False),
        end=_moment(request, "to", end=True),
        attributed=_bool(request, "attributed"),
        limit=max(1, _int(request, "limit", 100, 1000)),
        offset=_int(request, "offset", 0, 10**9),
    )
    with state(request).store.snapshot() as cur:
        rows = reads.sales(cur, program.program_id, flt)
    return ok(request, rows)


async def explain_sale(request: Request) -> Response:
    program = account_program(request, require_account(request))
    transaction_id = request.path_params["transaction_id"]
    with state(request).store.snapshot() as cur:
        found = reads.explain(cur, program.program_id, transaction_id)
    if found is None:
        raise SaleNotFound(f"no reconciled sale {transaction_id} in program {program.program_id}")
    return ok(request, found)


async def list_commissions(request: Request) -> Response:
    program = account_program(request, require_account(request))
    period = period_param(request)
    with state(request).store.snapshot() as cur:
        rows = reads.commissions(cur, program.program_id, period)
    return ok(request, rows)


routes = [
    Route("/api/v1/programs/{program_id}/sales", list_sales, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/sales/{transaction_id}/explain", explain_sale, methods=["GET"]),
    Route("/api/v1/programs/{program_id}/commissions", list_commissions, methods=["GET"]),
]
