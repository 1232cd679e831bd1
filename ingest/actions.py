"""Engineer actions on the raw log: metadata fixes, backfill applications, period closes, payout
batches and their payment, changes of a program's money terms, promo codes assigned to partners,
finance actions on a sale's commission lines (hold, release, void) and the ledger's bookings
(reconcile/bookings.py).

Each is appended as its own raw-log row (source `backfill`), never edited into earlier rows; the
reconciler orders these human actions by `seq` (see reconcile/fixes.py, reconcile/periods.py and
reconcile/payouts.py), so the ledger stays a function of the log. A backfill also picks up the
unroutable processor events that route to its program now (reconcile/unroutable.py): each is
appended again, routed to the program (source `backfill`, outcome `accepted`, the original body),
before the backfill's own row, which lists them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from ingest.deliveries import CHECKLIST_STEP
from ingest.domain.clock import utcnow
from ingest.domain.inputs import MetadataFixesIn
from ingest.domain.keys import processor_sale_keys, sale_claims
from ingest.domain.records import MONEY_TERMS, Program, ProgramSettings
from ingest.domain.tokens import new_id
from ingest.storage.contract import Tx
from ingest.writer import Writer

BACKFILL_ENDPOINT = "backfill"


def _row(program: Program | str, kind: str, actor: str, body: dict[str, Any], **typed: Any) -> dict[str, Any]:
    now = utcnow()
    return {
        "received_at": now,
        "source": "backfill",
        "kind": kind,
        "program_id": program if isinstance(program, str) else program.program_id,
        "outcome": "accepted",
        "event_type": kind,
        "occurred_at": now,
        "actor": actor,
        "body": json.dumps(body, sort_keys=True),
        "headers": "{}",
        **typed,
    }


async def add_metadata_fixes(
    writer: Writer, program: Program, inp: MetadataFixesIn, actor: str
) -> list[dict[str, Any]]:
    rows = []
    for fix in inp.fixes:
        fix_id = new_id("fix")
        rows.append(
            _row(
                program,
                "metadata_fix",
                actor,
                fix.model_dump(exclude_none=True),
                event_id=fix_id,
                subscription_id=fix.subscription_id,
                transaction_id=fix.transaction_id,
                customer_key=fix.svc_customer_key,
                click_id=fix.svc_click_id,
            )
        )

    def op(tx: Tx) -> None:
        for row in rows:
            tx.append(row)

    await writer.run(op)
    return [
        {
            "fix_id": row["event_id"],
            **json.loads(row["body"]),
            "recorded_at": row["received_at"],
            "recorded_by": actor,
        }
        for row in rows
    ]


def backfill_row(program: Program, start: date | None, end: date | None, actor: str) -> dict[str, Any]:
    """The raw-log row of a backfill application over [start, end] (dates inclusive, None = open).
    A dry run previews with this row without appending it."""
    body = {"from": start.isoformat() if start else None, "to": end.isoformat() if end else None}
    return _row(program, "backfill", actor, body, event_id=new_id("bf"))


def picked_up(backfill: dict[str, Any], events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The raw-log rows by which `backfill` (a `backfill_row`) picks up the unroutable `events`
    (their raw rows): each a copy routed to the backfill's program, received with the backfill.
    The backfill's body lists their event ids (`picked_up`)."""
    rows = [
        {
            **{k: v for k, v in event.items() if k != "seq"},
            "received_at": backfill["received_at"],
            "source": "backfill",
            "program_id": backfill["program_id"],
            "outcome": "accepted",
            "actor": backfill["actor"],
        }
        for event in events
    ]
    if rows:
        body = json.loads(backfill["body"])
        body["picked_up"] = [row["event_id"] for row in rows]
        backfill["body"] = json.dumps(body, sort_keys=True)
    return rows


def apply_backfill(tx: Tx, backfill: Mapping[str, Any], picked: Sequence[Mapping[str, Any]]) -> int:
    """Append the picked-up events (as a delivery routed to the program would be: its sale ids
    claimed, checklist steps, a tracking-log line), then the backfill's row; its seq."""
    program_id = str(backfill["program_id"])
    at = backfill["received_at"]
    for row in picked:
        seq = tx.append(row)
        keys = processor_sale_keys(row)
        tx.claim_keys(program_id, sale_claims(keys), seq)
        tx.check(program_id, CHECKLIST_STEP, at)
        if keys:
            tx.check(program_id, "sale_received", at)
        detail = (
            f"{row['event_type'] or 'event'} {row['event_id']} picked up by backfill {backfill['event_id']}"
        )
        tx.log(program_id, at, BACKFILL_ENDPOINT, 200, "picked_up", detail, None, seq)
    return tx.append(backfill)


def close_period(writer: Writer, program: Program, period: str, actor: str) -> dict[str, Any]:
    """Append the close of `period` and wait until reads see it (blocking: called by the
    reconciler under its run lock, on a worker thread)."""
    row = _row(program, "period_close", actor, {"period": period}, event_id=new_id("close"))

    def op(tx: Tx) -> int:
        return tx.append(row)

    writer.run_sync(op, flush=True)
    return {
        "period": period,
        "closed_at": row["received_at"],
        "closed_by": actor,
        "close_id": row["event_id"],
    }


def payout_batch_row(
    program: Program, up_to: date, actor: str, snapshot: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The raw-log row of a payout batch with cut-off `up_to`: the program's `payout_minimum` then
    and the batch's `snapshot` (what it pays and to whom, reports/payouts.py `snapshot`), which
    the batch keeps for good (reconcile/payouts.py holds its lines by it)."""
    body: dict[str, Any] = {
        "up_to": up_to.isoformat(),
        "by": actor,
        "payout_minimum": program.settings.payout_minimum,
    }
    if snapshot is not None:
        body["snapshot"] = snapshot
    return _row(program, "payout_batch", actor, body, event_id=new_id("po"))


def payout_paid_row(program: Program, payout_id: str, actor: str) -> dict[str, Any]:
    """The raw-log row marking payout batch `payout_id` paid: its lines become `paid`."""
    return _row(program, "payout_paid", actor, {"payout_id": payout_id, "by": actor}, event_id=new_id("paid"))


def payout_cancel_row(program: Program, payout_id: str, reason: str, actor: str) -> dict[str, Any]:
    """The raw-log row cancelling open payout batch `payout_id`: its lines are due again."""
    body = {"payout_id": payout_id, "reason": reason, "by": actor}
    return _row(program, "payout_cancel", actor, body, event_id=new_id("cancel"))


def payout_row_failed_row(
    program: Program, payout_id: str, partner_code: str, currency: str, reason: str, actor: str
) -> dict[str, Any]:
    """The raw-log row saying paid batch `payout_id`'s payment to `partner_code` in `currency`
    failed: that row's lines are due again, from this row's log position on."""
    body = {
        "payout_id": payout_id,
        "partner_code": partner_code,
        "currency": currency,
        "reason": reason,
        "by": actor,
    }
    return _row(program, "payout_row_failed", actor, body, event_id=new_id("fail"), partner_code=partner_code)


MANUAL_ENTRY = "manual_entry"


def manual_entry_row(
    program: Program, partner_code: str, amount: int, currency: str, reason: str, actor: str
) -> dict[str, Any]:
    """The raw-log row of a manual entry (a bonus or a correction) for `partner_code`: a `manual`
    ledger line of `amount` minor units of `currency`, approved and booked by this row itself
    (reconcile/manual.py). Its id is also its `transaction_id`, the id its line goes by."""
    entry_id = new_id("man")
    body = {
        "partner_code": partner_code,
        "amount": amount,
        "currency": currency,
        "reason": reason,
        "by": actor,
    }
    return _row(
        program,
        MANUAL_ENTRY,
        actor,
        body,
        event_id=entry_id,
        transaction_id=entry_id,
        partner_code=partner_code,
        amount=amount,
        currency=currency,
    )


PROMO_CODE = "promo_code"


def promo_code_row(
    program: Program, partner_code: str, code: str, promotion_code_id: str | None, actor: str
) -> dict[str, Any]:
    """The raw-log row assigning promotion code `code` (and the processor's `promotion_code_id`)
    to partner `partner_code`: a sale naming it is the partner's (reconcile/promos.py). Its code in
    `promo_code`, its processor id in `object_id`, the partner in `partner_code`."""
    body = {"code": code, "promotion_code_id": promotion_code_id, "partner_code": partner_code, "by": actor}
    return _row(
        program,
        PROMO_CODE,
        actor,
        body,
        event_id=new_id("promo"),
        partner_code=partner_code,
        promo_code=code,
        object_id=promotion_code_id,
    )


def terms_row(
    program: Program, before: ProgramSettings, after: ProgramSettings, actor: str
) -> dict[str, Any] | None:
    """The raw-log row of a change of `program`'s money terms from `before` to `after` (every
    term on both sides), or None when no term changes. The reconciler values each sale with the
    terms in force when it occurred, so a change applies to sales from its log time on."""
    old, new = before.model_dump(include=set(MONEY_TERMS)), after.model_dump(include=set(MONEY_TERMS))
    if old == new:
        return None
    return _row(
        program, "program_terms", actor, {"from": old, "to": new, "by": actor}, event_id=new_id("terms")
    )


# What a booking records of each line (reconcile/bookings.py LINE_FIELDS).
BOOKED_FIELDS = (
    "sale_id",
    "transaction_id",
    "partner_code",
    "kind",
    "cause",
    "adjusts",
    "period",
    "sale_period",
    "currency",
    "amount",
    "reversed",
    "platform_fee",
    "platform_fee_reversed",
    "refunded",
    "self_referral",
    "occurred_at",
    "available_at",
    "dated_at",
)


# The lines a booking run books (api/jobs.py): shown approved, held by no booking, in no batch.
DUE_LINES_SQL = (
    f"SELECT program_id, {', '.join(BOOKED_FIELDS)} FROM rc_commissions"
    " WHERE status = 'approved' AND booked_seq IS NULL AND payout_id IS NULL"
    " ORDER BY program_id, sale_id, kind, partner_code, cause"
)


def _booked_value(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def booking_rows(lines: Sequence[Mapping[str, Any]], as_of: int) -> list[dict[str, Any]]:
    """The raw-log rows booking `lines` (commission lines as the reconciler shows them, with
    program_id and BOOKED_FIELDS), one row per sale: what was approved, as of log position
    `as_of`, is a fact of the log from then on (reconcile/bookings.py)."""
    per_sale: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for line in lines:
        per_sale.setdefault((str(line["program_id"]), str(line["sale_id"])), []).append(line)
    rows = []
    for (program_id, sale_id), mine in sorted(per_sale.items()):
        body = {
            "sale_id": sale_id,
            "as_of": as_of,
            "lines": [{name: _booked_value(line.get(name)) for name in BOOKED_FIELDS} for line in mine],
        }
        rows.append(
            _row(
                program_id,
                "booking",
                "reconciler",
                body,
                event_id=new_id("bk"),
                transaction_id=mine[0]["transaction_id"],
            )
        )
    return rows


def close_booking_rows(changes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The raw-log rows booking closes (reconcile/periods.py `to_book`: program_id, close_seq,
    the line fields and `gone`): per close, one `close_booking` row per sale holding its lines
    that changed since the close before and those gone, then one `close_booked` row saying the
    booking is whole (read back only once it is: rows of a booking cut short are ignored)."""
    per_close: dict[tuple[str, int], dict[str, list[Mapping[str, Any]]]] = {}
    for change in changes:
        sales = per_close.setdefault((str(change["program_id"]), int(change["close_seq"])), {})
        if change.get("sale_id") is not None:
            sales.setdefault(str(change["sale_id"]), []).append(change)
    rows = []
    for (program_id, close_seq), sales in sorted(per_close.items(), key=lambda item: item[0][1]):
        booking_id = new_id("cb")
        for sale_id, mine in sorted(sales.items()):
            body = {
                "booking_id": booking_id,
                "close_seq": close_seq,
                "sale_id": sale_id,
                "lines": [
                    {name: _booked_value(line.get(name)) for name in (*BOOKED_FIELDS, "standing")}
                    for line in mine
                    if not line["gone"]
                ],
                "gone": [
                    {name: line.get(name) for name in ("partner_code", "kind", "cause", "transaction_id")}
                    for line in mine
                    if line["gone"]
                ],
            }
            rows.append(
                _row(
                    program_id,
                    "close_booking",
                    "reconciler",
                    body,
                    event_id=new_id("cbl"),
                    transaction_id=next(
                        (line["transaction_id"] for line in mine if line.get("transaction_id")), None
                    ),
                )
            )
        body = {"booking_id": booking_id, "close_seq": close_seq}
        rows.append(_row(program_id, "close_booked", "reconciler", body, event_id=new_id("cbk")))
    return rows


def commission_action_row(
    program: Program, sale_id: str, transaction_id: str, action: str, reason: str, actor: str
) -> dict[str, Any]:
    """The raw-log row of a finance action (`hold`, `release` or `void`) on a sale's lines."""
    body = {"action": action, "sale_id": sale_id, "reason": reason, "by": actor}
    return _row(
        program, "commission_action", actor, body, event_id=new_id("act"), transaction_id=transaction_id
    )
