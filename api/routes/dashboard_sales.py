"""The dashboard's tracking log, sales (filtered by date, partner, currency and attribution, and
as CSV) and the explain view of one sale. Split from api/routes/dashboard.py (its pages,
sessions and CSRF rules) for size; the reads are the JSON API's own (reports/reads.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import account_program, state
from api.http import query_int
from api.openapi import Param, document
from api.pages import render
from api.routes.dashboard import _PAGE, PROGRAM, _page, page, viewer
from api.routes.reports import CSV, currency_param, moment_param, report_response, sale_not_found
from api.state import read_store, read_tables
from ingest import control
from ingest.domain.errors import ProgramNotFound, SaleNotFound, ValidationFailed
from ingest.storage.contract import Reader
from reports import lineitems, reads
from reports.lineitems import EVERY_ROW

LOG_PAGE_SIZE = 50
SALES_PAGE_SIZE = 50
MAX_PAGE = 10**9


@page
async def tracking_log(request: Request) -> Response:
    who = viewer(request)
    program = account_program(request, who.account)
    before = query_int(request, "before", None, 1, 2**62, blank=True)
    st = state(request)
    await st.writer.sync()
    lines = await read_store(st.store.tracking_log, program.program_id, LOG_PAGE_SIZE, before)
    next_before = lines[-1].log_id if len(lines) == LOG_PAGE_SIZE else None
    view = control.program_view(st.store, program)
    return render("log.html", viewer=who, program=view, lines=lines, before=before, next_before=next_before)


SALE_FILTERS = ("from", "to", "partner_code", "currency", "attributed")


def sale_filter(request: Request, limit: int, offset: int = 0) -> reads.SaleFilter:
    """The sales page's filters, read as the API reads its own (`from`/`to` dates included,
    a partner code, a currency; `attributed` as yes/no)."""
    shown = request.query_params.get("attributed", "")
    return reads.SaleFilter(
        start=moment_param(request, "from", end=False),
        end=moment_param(request, "to", end=True),
        attributed={"yes": True, "no": False}.get(shown),
        partner_code=request.query_params.get("partner_code") or None,
        currency=currency_param(request),
        limit=limit,
        offset=offset,
    )


@page
async def sales(request: Request) -> Response:
    """Reconciled sales, filtered by date, partner, currency and attribution, a page at a time;
    with `format=csv` every sale the filters match, as the API's CSV (reports/lineitems.py)."""
    who = viewer(request)
    program = account_program(request, who.account)
    fmt = request.query_params.get("format") or "html"
    if fmt not in ("html", "csv"):
        message = "must be html or csv"
        raise ValidationFailed(f"format {message}", fields=[{"field": "format", "message": message}])
    st = state(request)
    if fmt == "csv":
        rows = await read_tables(st.store, reads.sales, program.program_id, sale_filter(request, EVERY_ROW))
        body = lineitems.to_csv(rows, reads.SALE_FIELDS, lineitems.SALE_MONEY)
        return report_response(body, CSV, f"sales-{program.program_id}.csv", fmt)
    number = query_int(request, "page", 1, 1, 2**62, blank=True)
    if number > MAX_PAGE:  # the offset must fit the database's integers
        raise ValidationFailed(f"page must be at most {MAX_PAGE}")
    # one more than a page tells whether there is a next page
    flt = sale_filter(request, SALES_PAGE_SIZE + 1, (number - 1) * SALES_PAGE_SIZE)
    reconciled, rows, currencies = await read_tables(st.store, _sales_page, program.program_id, flt)
    chosen = {name: request.query_params.get(name, "") for name in SALE_FILTERS}
    query = urlencode({k: v for k, v in chosen.items() if v})
    return render(
        "sales.html",
        viewer=who,
        program=control.program_view(st.store, program),
        sales=rows[:SALES_PAGE_SIZE] if reconciled else None,
        more=len(rows) > SALES_PAGE_SIZE,
        page_number=number,
        attributed=chosen["attributed"],
        chosen=chosen,
        filtered=any(chosen.values()),
        query=query,
        partners=[control.partner_view(p) for p in st.store.partners(program.program_id)],
        currencies=currencies,
    )


def _sales_page(
    db: Reader, program_id: str, flt: reads.SaleFilter
) -> tuple[bool, list[dict[str, Any]], list[str]]:
    currencies = reads.sale_currencies(db, program_id)
    return db.table_exists("rc_sales"), reads.sales(db, program_id, flt), currencies


@page
async def explain(request: Request) -> Response:
    who = viewer(request)
    program = account_program(request, who.account)
    transaction_id = request.path_params["transaction_id"]
    st = state(request)
    found = await read_tables(st.store, reads.explain, program.program_id, transaction_id)
    view = control.program_view(st.store, program)
    if found is None:
        missing = await sale_not_found(st, program, transaction_id)
        return render(
            "not_reconciled.html",
            404,
            who,
            program=view,
            transaction_id=transaction_id,
            code=missing.code,
            message=missing.message,
            hint=missing.extra["hint"],
            recorded=missing.extra["recorded"],
        )
    done = request.query_params.get("done")
    notice = f"{done.capitalize()} recorded." if done in ("hold", "release", "void") else None
    return render("explain.html", viewer=who, program=view, done=notice, **found)


routes = [
    Route(PROGRAM + "/log", tracking_log, methods=["GET"]),
    Route(PROGRAM + "/sales", sales, methods=["GET"]),
    Route(PROGRAM + "/sales/{transaction_id:id}", explain, methods=["GET"]),
]

document(
    {
        tracking_log: _page(
            "The tracking log",
            params=(Param("before", {"type": "integer", "minimum": 1, "maximum": 2**62}),),
            errors=(ProgramNotFound, ValidationFailed),
        ),
        sales: _page(
            "Sales, filtered by date, partner, currency and attribution (or every match as CSV)",
            params=(
                Param("page", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
                Param("from", {"type": "string"}, "YYYY-MM-DD (whole day) or an RFC 3339 time"),
                Param("to", {"type": "string"}, "YYYY-MM-DD (included) or an RFC 3339 time"),
                Param("partner_code", {"type": "string"}),
                Param("currency", {"type": "string", "pattern": "^[A-Za-z]{3}$"}),
                Param("attributed", {"type": "string", "enum": ["", "yes", "no"]}),
                Param("format", {"type": "string", "enum": ["html", "csv"], "default": "html"}),
            ),
            content={**_PAGE, "text/csv": {"schema": {"type": "string"}}},
            errors=(ProgramNotFound, ValidationFailed),
        ),
        explain: _page("Explain one sale", errors=(ProgramNotFound, SaleNotFound)),
    }
)
