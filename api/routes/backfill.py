"""Engineer actions (a workspace owner or the operator): metadata fixes, backfill with a dry-run
diff, and closing a month."""

from __future__ import annotations

import asyncio
from typing import Any

import polars as pl
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import schemas
from api.auth import account_program, bearer, is_operator, require_account, state
from api.http import body_model, ok
from api.openapi import ACCOUNT_TOKEN, OPERATOR_TOKEN, Doc, Param, document
from ingest import actions, control
from ingest.domain import bounds
from ingest.domain.clock import utcnow
from ingest.domain.errors import (
    MissingCredentials,
    NotFound,
    OwnerRequired,
    ProgramNotFound,
    ReconcileRunning,
    ValidationFailed,
)
from ingest.domain.inputs import BackfillIn, MetadataFixesIn
from ingest.domain.records import Program
from reconcile.backfill import BackfillDiff


def _owner_or_operator(request: Request) -> tuple[Program, str]:
    """The program and who acts: "operator", or the owner's account id."""
    token = bearer(request)
    if token is None:
        raise MissingCredentials("this endpoint needs an owner's account token or the operator token")
    if is_operator(request, token):
        program = state(request).store.program(request.path_params["program_id"])
        if program is None:
            raise ProgramNotFound(f"program {request.path_params['program_id']} not found")
        return program, "operator"
    account = require_account(request)
    program = account_program(request, account)
    control.require_owner(state(request).store, program.workspace_id, account.account_id)
    return program, account.account_id


async def metadata_fixes(request: Request) -> Response:
    program, actor = _owner_or_operator(request)
    _, inp = await body_model(request, MetadataFixesIn)
    fixes = await actions.add_metadata_fixes(state(request).writer, program, inp, actor)
    return ok(request, {"fixes": fixes, "count": len(fixes)}, 201)


def diff_view(result: BackfillDiff, unnamed: str | None = None) -> dict[str, Any]:
    """The diff as the response gives it. `unnamed`: the id of a backfill only previewed (a dry
    run): the adjustment lines it would cause say `cause` null, since no backfill has that id;
    an applied backfill's lines name it (its `backfill_id`)."""

    def rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
        return frame.to_dicts()

    adjustments = result.adjustments
    if unnamed is not None:
        adjustments = adjustments.with_columns(
            cause=pl.when(pl.col("cause") != unnamed).then(pl.col("cause"))
        )
    return {
        "changed_sales": rows(result.sales),
        "partner_totals": rows(result.partners),
        "adjustments": rows(adjustments),
        "changes": result.sales.height,
    }


def picked_view(event: dict[str, Any]) -> dict[str, Any]:
    """An unroutable event a backfill picks up, as the response lists it."""
    return {
        "event_id": event["event_id"],
        "type": event["event_type"],
        "account": event["stripe_account"],
        "occurred_at": event["occurred_at"],
        "received_at": event["received_at"],
    }


async def run_backfill(request: Request) -> Response:
    program, actor = _owner_or_operator(request)
    _, inp = await body_model(request, BackfillIn)
    row = actions.backfill_row(program, inp.start, inp.end, actor)
    reconciler = state(request).reconciler
    result, picked = await asyncio.to_thread(reconciler.backfill, row, not inp.dry_run, inp.start, inp.end)
    data = {
        "program_id": program.program_id,
        "from": inp.start,
        "to": inp.end,
        "dry_run": inp.dry_run,
        **diff_view(result, row["event_id"] if inp.dry_run else None),
        "picked_up": [picked_view(event) for event in picked],
    }
    if not inp.dry_run:
        data.update(
            applied=True, applied_at=row["received_at"], applied_by=actor, backfill_id=row["event_id"]
        )
    return ok(request, data)


async def close_period(request: Request) -> Response:
    program, actor = _owner_or_operator(request)
    try:
        period = bounds.period(request.path_params["period"])
    except ValueError as exc:
        raise ValidationFailed(f"period {exc}", fields=[{"field": "period", "message": str(exc)}]) from None
    if period > utcnow().strftime("%Y-%m"):
        raise ValidationFailed(
            f"{period} has not started yet", fields=[{"field": "period", "message": "a month that has begun"}]
        )
    st = state(request)
    closed: list[dict[str, Any]] = []  # appended under the run lock: never when the run is refused

    def close() -> None:
        closed.append(actions.close_period(st.writer, program, period, actor))

    summary = await asyncio.to_thread(st.reconciler.run, None, close, program.program_id)
    return ok(request, {**closed[0], "reconcile_run_id": summary.run_id})


routes = [
    Route("/api/v1/programs/{program_id}/metadata-fixes", metadata_fixes, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/backfill", run_backfill, methods=["POST"]),
    Route("/api/v1/programs/{program_id}/periods/{period}/close", close_period, methods=["POST"]),
]

_WHO = "A workspace owner's account token or the operator token."
document(
    {
        metadata_fixes: Doc(
            "Append metadata fixes (they take effect when a backfill covering their sales is applied)",
            "engineering",
            description=_WHO,
            auth=(ACCOUNT_TOKEN, OPERATOR_TOKEN),
            body=MetadataFixesIn,
            example={"fixes": [{"subscription_id": "sub_1", "svc_customer_key": "cust_42"}]},
            status=201,
            data=schemas.Fixes,
            result={
                "fixes": [
                    {
                        "fix_id": "fix_1",
                        "subscription_id": "sub_1",
                        "svc_customer_key": "cust_42",
                        "recorded_at": "2026-11-21T10:00:00Z",
                        "recorded_by": "acc_1a",
                    }
                ],
                "count": 1,
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired),
            writes=True,
        ),
        run_backfill: Doc(
            "Re-run attribution over a date range: the diff (dry run) or applied",
            "engineering",
            description=_WHO,
            auth=(ACCOUNT_TOKEN, OPERATOR_TOKEN),
            body=BackfillIn,
            example={"from": "2026-01-01", "to": "2026-01-31", "dry_run": True},
            data=schemas.Backfill,
            result={
                "program_id": "prog_3k9a",
                "from": "2026-01-01",
                "to": "2026-01-31",
                "dry_run": True,
                "changed_sales": [],
                "partner_totals": [],
                "adjustments": [],
                "changes": 0,
                "picked_up": [],
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired, ReconcileRunning),
            writes=True,
        ),
        close_period: Doc(
            "Close a month: it never changes again (later corrections become adjustment lines)",
            "engineering",
            description=_WHO,
            auth=(ACCOUNT_TOKEN, OPERATOR_TOKEN),
            params=(
                Param(
                    "period",
                    {"type": "string", "pattern": r"^\d{4}-(0[1-9]|1[0-2])$"},
                    where="path",
                    example="2026-01",
                ),
            ),
            data=schemas.Close,
            result={
                "period": "2026-01",
                "closed_at": "2026-02-01T09:00:00Z",
                "closed_by": "operator",
                "close_id": "close_1",
                "reconcile_run_id": "run_2b",
            },
            errors=(ProgramNotFound, NotFound, OwnerRequired, ValidationFailed, ReconcileRunning),
            writes=True,
        ),
    }
)
