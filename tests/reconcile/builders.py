"""Raw-log rows for tests, shaped as ingest writes them (ingest/schema.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from ingest.storage.schema import RAW_EVENT_COLUMNS, RAW_EVENT_FIELDS
from reconcile.schema import setting_text
from reconcile.terms import TERMS

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
PROGRAM = "prog_a"

_POLARS_TYPES: dict[str, pl.DataType] = {
    "BIGINT": pl.Int64(),
    "TIMESTAMPTZ": pl.Datetime("us", "UTC"),
    "VARCHAR": pl.String(),
    "BOOLEAN": pl.Boolean(),
}

RAW_POLARS_SCHEMA: dict[str, pl.DataType] = {
    name: _POLARS_TYPES[sql.split()[0]] for name, sql in RAW_EVENT_COLUMNS
}


def at(days: float = 0, hours: float = 0) -> datetime:
    return T0 + timedelta(days=days, hours=hours)


def row(**fields: Any) -> dict[str, Any]:
    """A raw row with every RAW_EVENT_FIELDS key; unspecified columns are NULL / defaults."""
    unknown = set(fields) - set(RAW_EVENT_FIELDS)
    if unknown:
        raise KeyError(f"not raw_events columns: {sorted(unknown)}")
    base: dict[str, Any] = dict.fromkeys(RAW_EVENT_FIELDS)
    base.update(
        seq=0,
        outcome="accepted",
        test_mode=False,
        program_id=PROGRAM,
        body="{}",
        headers="{}",
    )
    base.update(fields)
    if base["occurred_at"] is None and base["kind"] not in ("metadata_fix", "backfill"):
        base["occurred_at"] = T0
    if base["received_at"] is None:
        base["received_at"] = base["occurred_at"] or T0
    return base


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows to a raw_events frame; seq numbered 1..n in list order (arrival order)."""
    numbered = [{**r, "seq": i} for i, r in enumerate(rows, start=1)]
    return pl.DataFrame(numbered, schema=RAW_POLARS_SCHEMA)


def click(click_id: str, partner: str, **kw: Any) -> dict[str, Any]:
    return row(
        source="track",
        kind="click",
        event_id=click_id,
        event_type="track.click",
        click_id=click_id,
        partner_code=partner,
        **kw,
    )


def lead(
    lead_id: str,
    customer_key: str | None,
    *,
    click_id: str | None = None,
    email: str | None = None,
    settled: bool = True,
    **kw: Any,
) -> dict[str, Any]:
    return row(
        source="track",
        kind="lead",
        event_id=lead_id,
        event_type="track.lead",
        customer_key=customer_key,
        click_id=click_id,
        email=email,
        lead_status="settled" if settled else "provisional",
        **kw,
    )


def track_sale(sale_id: str, transaction_id: str | None, amount: int | None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("currency", "usd")
    return row(
        source="track",
        kind="sale",
        event_id=sale_id,
        event_type="track.sale",
        transaction_id=transaction_id,
        amount=amount,
        **kw,
    )


def track_refund(refund_id: str, transaction_id: str, amount: int, **kw: Any) -> dict[str, Any]:
    return row(
        source="track",
        kind="refund",
        event_id=f"rfd_{refund_id}",
        event_type="track.refund",
        transaction_id=transaction_id,
        refund_id=refund_id,
        amount=amount,
        **kw,
    )


def stripe_row(event_id: str, event_type: str, object_id: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("livemode", not kw.get("test_mode", False))
    kw.setdefault("stripe_account", "acct_1")
    return row(
        source="stripe",
        kind="stripe",
        event_id=event_id,
        event_type=event_type,
        object_id=object_id,
        **kw,
    )


def session(
    event_id: str,
    session_id: str,
    amount: int,
    *,
    mode: str = "payment",
    event_type: str = "checkout.session.completed",
    **kw: Any,
) -> dict[str, Any]:
    kw.setdefault("currency", "usd")
    kw.setdefault(
        "sub_metadata_present",
        any(kw.get(k) is not None for k in ("click_id", "customer_key", "meta_program_id")),
    )
    return stripe_row(
        event_id,
        event_type,
        session_id,
        checkout_session_id=session_id,
        checkout_mode=mode,
        amount=amount,
        **kw,
    )


def invoice(
    event_id: str,
    invoice_id: str,
    amount: int,
    *,
    billing_reason: str = "subscription_cycle",
    event_type: str = "invoice.payment_succeeded",
    **kw: Any,
) -> dict[str, Any]:
    kw.setdefault("currency", "usd")
    kw.setdefault(
        "sub_metadata_present",
        any(kw.get(k) is not None for k in ("click_id", "customer_key", "meta_program_id")),
    )
    return stripe_row(
        event_id,
        event_type,
        invoice_id,
        invoice_id=invoice_id,
        billing_reason=billing_reason,
        amount=amount,
        **kw,
    )


def charge_refunded(event_id: str, charge_id: str, cumulative: int, **kw: Any) -> dict[str, Any]:
    kw.setdefault("currency", "usd")
    return stripe_row(event_id, "charge.refunded", charge_id, charge_id=charge_id, amount=cumulative, **kw)


def metadata_fix(fix_id: str, **kw: Any) -> dict[str, Any]:
    return row(
        source="backfill",
        kind="metadata_fix",
        event_id=fix_id,
        event_type="metadata_fix",
        actor="operator",
        **kw,
    )


def backfill(backfill_id: str, start: str, end: str, **kw: Any) -> dict[str, Any]:
    return row(
        source="backfill",
        kind="backfill",
        event_id=backfill_id,
        event_type="backfill",
        actor="operator",
        body=json.dumps({"from": start, "to": end}),
        **kw,
    )


def period_close(close_id: str, period: str, **kw: Any) -> dict[str, Any]:
    return row(
        source="backfill",
        kind="period_close",
        event_id=close_id,
        event_type="period_close",
        actor="operator",
        body=json.dumps({"period": period}),
        **kw,
    )


def picked_up(event: dict[str, Any], program_id: str = PROGRAM, **kw: Any) -> dict[str, Any]:
    """A backfill's copy of the unroutable `event`, routed to `program_id` (ingest/engineering.py)."""
    return {
        **event,
        "source": "backfill",
        "program_id": program_id,
        "outcome": "accepted",
        "actor": "operator",
        **kw,
    }


def payout_batch(
    payout_id: str, up_to: str, minimum: Any = None, snapshot: dict[str, Any] | None = None, **kw: Any
) -> dict[str, Any]:
    """A payout batch; `minimum`: the payout minimum it records (left out of the body when None,
    as batches made before the setting existed); `snapshot`: what it pays (`payout_snapshot`;
    None: a batch made before snapshots)."""
    body: dict[str, Any] = {"up_to": up_to, "by": "operator"}
    if minimum is not None:
        body["payout_minimum"] = minimum
    if snapshot is not None:
        body["snapshot"] = snapshot
    return row(
        source="backfill",
        kind="payout_batch",
        event_id=payout_id,
        event_type="payout_batch",
        actor="operator",
        body=json.dumps(body, sort_keys=True),
        **kw,
    )


def payout_cancel(
    cancel_id: str, payout_id: str, reason: str = "made by mistake", **kw: Any
) -> dict[str, Any]:
    return row(
        source="backfill",
        kind="payout_cancel",
        event_id=cancel_id,
        event_type="payout_cancel",
        actor="operator",
        body=json.dumps({"payout_id": payout_id, "reason": reason, "by": "operator"}),
        **kw,
    )


def payout_row_failed(
    fail_id: str, payout_id: str, partner: str, currency: str, reason: str = "bounced", **kw: Any
) -> dict[str, Any]:
    body = {
        "payout_id": payout_id,
        "partner_code": partner,
        "currency": currency,
        "reason": reason,
        "by": "operator",
    }
    return row(
        source="backfill",
        kind="payout_row_failed",
        event_id=fail_id,
        event_type="payout_row_failed",
        actor="operator",
        partner_code=partner,
        body=json.dumps(body),
        **kw,
    )


def manual_entry(
    entry_id: str, partner: str, amount: int, currency: str, reason: str = "bonus", **kw: Any
) -> dict[str, Any]:
    """An owner's manual entry (ingest/actions.py `manual_entry_row`)."""
    body = {
        "partner_code": partner,
        "amount": amount,
        "currency": currency,
        "reason": reason,
        "by": "acct_owner",
    }
    return row(
        source="backfill",
        kind="manual_entry",
        event_id=entry_id,
        event_type="manual_entry",
        actor="acct_owner",
        transaction_id=entry_id,
        partner_code=partner,
        amount=amount,
        currency=currency,
        body=json.dumps(body),
        **kw,
    )


# What the payout services pay, restated for the tests (reports/payfiles.py holds the real lists):
# a currency outside these is `currency_not_supported`; PayPal sends HUF and TWD in whole units.
PAYS = {"paypal": ("usd", "jpy", "huf", "eur"), "wise": ("usd", "jpy", "huf", "eur")}
WHOLE = {("paypal", "huf"): 100, ("paypal", "twd"): 100}


def payout_snapshot(
    rows: list[dict[str, Any]],
    now: datetime,
    people: pl.DataFrame,
    details: dict[str, tuple[str, str] | None],
    up_to: str,
    minimum: int | dict[str, int] = 0,
    **settings: Any,
) -> dict[str, Any]:
    """What a batch made after `rows` at `now` pays (reports/payouts.py `snapshot`, restated on
    the reference's lines): per partner and currency, the approved booked lines no live batch
    holds, dated up to `up_to`; a row for each partner with `details` (method, currency) paying
    that currency in a currency its service pays, at or above the minimum; the others not paid.
    Import-late: the reference is what the test compares with."""
    from tests.reconcile.reference import reconcile_reference

    numbered = frame(rows).to_dicts()
    result = reconcile_reference(numbered, programs(**settings).to_dicts(), people.to_dicts(), now)
    cutoff = datetime.fromisoformat(up_to).replace(tzinfo=UTC) + timedelta(days=1)
    free: dict[tuple[str, str], list[int]] = {}
    for line in result["commissions"]:
        if (
            line["payout_id"] is None
            and line["booked_seq"] is not None
            and line["status"] == "approved"
            and line["amount"] != 0
            and line["dated_at"] < cutoff
        ):
            free.setdefault((line["partner_code"], line["currency"]), []).append(line["amount"])
    paid, not_paid = [], []
    for (code, currency), amounts in sorted(free.items()):
        net = sum(amounts)
        floor = minimum.get(currency, 0) if isinstance(minimum, dict) else minimum
        payee = details.get(code)
        step = WHOLE.get((payee[0], currency), 1) if payee else 1
        sent = net - net % step if net > 0 else net
        if net < max(floor, 1) or sent < 1:
            reason = "below_minimum"
        elif payee is None:
            reason = "no_payout_details"
        elif payee[1] != currency or currency not in PAYS[payee[0]]:
            reason = "currency_not_supported"
        else:
            paid.append(
                {
                    "partner_code": code,
                    "currency": currency,
                    "amount": sent,
                    "net": net,
                    "rounding": net - sent,
                    "lines": len(amounts),
                    "payout_method": payee[0],
                    "payout_email": f"{code}@{payee[0]}.test",
                    "payout_name": code.title(),
                    "payout_currency": payee[1],
                }
            )
            continue
        not_paid.append({"partner_code": code, "currency": currency, "balance": net, "reason": reason})
    return {"payout_minimum": minimum, "rows": paid, "not_paid": not_paid}


def payout_paid(mark_id: str, payout_id: str, **kw: Any) -> dict[str, Any]:
    return row(
        source="backfill",
        kind="payout_paid",
        event_id=mark_id,
        event_type="payout_paid",
        actor="operator",
        body=json.dumps({"payout_id": payout_id, "by": "operator"}),
        **kw,
    )


def promo_code(
    assignment_id: str, code: str | None, partner: str, promotion_code_id: str | None = None, **kw: Any
) -> dict[str, Any]:
    """An owner's assignment of a promo code to a partner (ingest/actions.py `promo_code_row`)."""
    return row(
        source="backfill",
        kind="promo_code",
        event_id=assignment_id,
        event_type="promo_code",
        actor="acct_owner",
        partner_code=partner,
        promo_code=code,
        object_id=promotion_code_id,
        body=json.dumps(
            {
                "code": code,
                "promotion_code_id": promotion_code_id,
                "partner_code": partner,
                "by": "acct_owner",
            }
        ),
        **kw,
    )


def programs(**settings: Any) -> pl.DataFrame:
    """One program `prog_a` with the given settings (unset ones default in the reconciler)."""
    base: dict[str, Any] = {
        "program_id": PROGRAM,
        "commission_type": "percent",
        "commission_bps": 3000,
        "commission_flat": 0,
        "recurring_months": None,
        "platform_fee_bps": 500,
        "holding_days": 30,
        "requires_server_side_leads": False,
        "stripe_account_id": "acct_1",
    }
    base.update(settings)
    return program_frame([base])


PROGRAM_POLARS_SCHEMA: dict[str, pl.DataType] = {
    "program_id": pl.String(),
    "commission_type": pl.String(),
    "commission_bps": pl.Int64(),
    "commission_flat": pl.String(),  # the setting as JSON text (reconcile/schema.py PROGRAM_SCHEMA)
    "recurring_months": pl.Int64(),
    "platform_fee_bps": pl.Int64(),
    "holding_days": pl.Int64(),
    "requires_server_side_leads": pl.Boolean(),
    "stripe_account_id": pl.String(),
}

PARTNER_POLARS_SCHEMA: dict[str, pl.DataType] = {
    "program_id": pl.String(),
    "code": pl.String(),
    "email": pl.String(),
}


def program_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Programs as the reconciler takes them: a per-currency setting (an integer, or an object
    by currency) as its JSON text (reconcile/schema.py `setting_text`)."""
    return pl.DataFrame(
        [{**r, **{k: _setting_text(r[k]) for k in ("commission_flat",) if k in r}} for r in rows],
        schema=PROGRAM_POLARS_SCHEMA,
    )


def _setting_text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else setting_text(value)


def _term(name: str, value: Any) -> Any:
    """A term as ingest logs it in a terms change: a per-currency setting given as JSON text (a
    program frame's) decoded."""
    return json.loads(value) if name == "commission_flat" and isinstance(value, str) else value


def partners(*entries: tuple[str, str | None], program: str = PROGRAM) -> pl.DataFrame:
    return pl.DataFrame(
        [{"program_id": program, "code": c, "email": e} for c, e in entries],
        schema=PARTNER_POLARS_SCHEMA,
    )


def program_terms(change_id: str, before: dict[str, Any], after: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """A change of the program's money terms (ingest/engineering.py `terms_row`): every term
    of reconcile/terms.py TERMS on both sides (unset ones null)."""
    names = TERMS
    return row(
        source="backfill",
        kind="program_terms",
        event_id=change_id,
        event_type="program_terms",
        actor="operator",
        body=json.dumps(
            {
                "from": {n: _term(n, before.get(n)) for n in names},
                "to": {n: _term(n, after.get(n)) for n in names},
                "by": "operator",
            }
        ),
        **kw,
    )


def bookings(
    rows: list[dict[str, Any]], now: datetime, people: pl.DataFrame | None = None, **settings: Any
) -> list[dict[str, Any]]:
    """The booking rows a reconcile run at `now` appends after `rows` (api/jobs.py
    `Reconciler._book`): every line the reconciler shows approved that no booking holds, as of
    the last of `rows`, received at `now`. Import-late: the pipeline is what is being tested."""
    from ingest.actions import booking_rows
    from reconcile import bookings as rules
    from reconcile.pipeline import reconcile

    people = partners(("p1", None), ("p2", None)) if people is None else people
    result = reconcile(frame(rows), programs(**settings), people, now)
    due = rules.due(result.commissions).to_dicts()
    made = booking_rows(due, len(rows))
    # ids made from the log position: a generated log is the same whenever it is generated
    return [
        row(**{**r, "event_id": f"bk_{len(rows)}_{i}", "received_at": now, "occurred_at": now})
        for i, r in enumerate(made)
    ]


def close_bookings(
    rows: list[dict[str, Any]],
    now: datetime,
    people: pl.DataFrame | None = None,
    settings_frame: pl.DataFrame | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """The close-booking rows a run at `now` appends after `rows` (api/jobs.py
    `Reconciler._book`): each close no booking holds yet, booked once; the programs'
    `settings_frame` or one program with `settings`. Import-late, as `bookings`."""
    from ingest.actions import close_booking_rows
    from reconcile.pipeline import close_bookings as to_book

    people = partners(("p1", None), ("p2", None)) if people is None else people
    chosen = programs(**settings) if settings_frame is None else settings_frame
    made = close_booking_rows(to_book(frame(rows), chosen, people, now).to_dicts())
    return [
        row(**{**r, "event_id": f"cb_{len(rows)}_{i}", "received_at": now, "occurred_at": now})
        for i, r in enumerate(made)
    ]


def commission_action(
    action_id: str, sale_id: str, action: str, reason: str = "", **kw: Any
) -> dict[str, Any]:
    return row(
        source="backfill",
        kind="commission_action",
        event_id=action_id,
        event_type="commission_action",
        actor="acct_finance",
        body=json.dumps({"action": action, "sale_id": sale_id, "reason": reason, "by": "acct_finance"}),
        **kw,
    )
