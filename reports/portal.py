"""What a partner's portal shows them of one program (CONTRACT 14), read for that partner only:
every query names the program and the partner's code, so no other partner's row, and no
customer's email or key, is ever read for a portal page.

- `months`: per month (UTC), the partner's clicks, sign-ups (distinct customers whose lead
  carries one of the partner's clicks), real sales attributed to them (count and amount per
  currency) and commissions (their lines' amounts per currency, void ones left out);
- `lines`: their commission lines, newest first, with why a line is held, void, reversed, a
  clawback or an adjustment;
- `payouts`: the rows payout batches pay them (reports/payouts.py), newest first, and a batch's
  lines that are theirs.

Plain SQL both databases speak, `?` parameters (a `Reader`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.storage.contract import Reader
from reports import csvcells, payouts
from reports.money import units

LINE_COLUMNS = (
    "sale_id",
    "transaction_id",
    "kind",
    "cause",
    "adjusts",
    "period",
    "currency",
    "amount",
    "status",
    "status_reason",
    "self_referral",
    "occurred_at",
    "available_at",
    "dated_at",
    "payout_id",
)


@dataclass
class Month:
    period: str
    clicks: int = 0
    signups: int = 0
    sales: int = 0
    sales_amount: dict[str, int] = field(default_factory=dict)
    commission: dict[str, int] = field(default_factory=dict)


def _period(year: Any, month: Any) -> str:
    return f"{int(year):04d}-{int(month):02d}"


def months(db: Reader, program_id: str, code: str) -> list[Month]:
    """The partner's months with anything in them, oldest first."""
    found: dict[str, Month] = {}

    def month(period: str) -> Month:
        return found.setdefault(period, Month(period))

    for year, number, count in db.rows(
        "SELECT EXTRACT(YEAR FROM occurred_at), EXTRACT(MONTH FROM occurred_at), COUNT(*) FROM raw_events"
        " WHERE program_id = ? AND kind = 'click' AND outcome = 'accepted' AND partner_code = ?"
        " GROUP BY 1, 2",
        [program_id, code],
    ):
        month(_period(year, number)).clicks = int(count)
    for year, number, count in db.rows(
        "SELECT EXTRACT(YEAR FROM l.occurred_at), EXTRACT(MONTH FROM l.occurred_at),"
        " COUNT(DISTINCT l.customer_key) FROM raw_events l JOIN raw_events c"
        " ON c.program_id = l.program_id AND c.click_id = l.click_id AND c.kind = 'click'"
        " AND c.outcome = 'accepted'"
        " WHERE l.program_id = ? AND l.kind = 'lead' AND l.outcome = 'accepted' AND c.partner_code = ?"
        " GROUP BY 1, 2",
        [program_id, code],
    ):
        month(_period(year, number)).signups = int(count)
    if db.table_exists("rc_sales"):
        for period, currency, count, amount in db.rows(
            "SELECT period, currency, COUNT(*), SUM(amount) FROM rc_sales"
            " WHERE program_id = ? AND partner_code = ? AND NOT test_mode GROUP BY period, currency",
            [program_id, code],
        ):
            m = month(str(period))
            m.sales += int(count)
            m.sales_amount[str(currency)] = int(amount or 0)
    if db.table_exists("rc_commissions"):
        for period, currency, amount in db.rows(
            "SELECT period, currency, SUM(amount) FROM rc_commissions"
            " WHERE program_id = ? AND partner_code = ? AND status <> 'void' GROUP BY period, currency",
            [program_id, code],
        ):
            month(str(period)).commission[str(currency)] = int(amount or 0)
    return [found[p] for p in sorted(found)]


def why(line: dict[str, Any]) -> str:
    """Why a line is as it is, in words, for the partner: held, void and reversed lines, and
    clawbacks and adjustments, say why; other lines say nothing."""
    status, kind, reason = line["status"], line["kind"], line.get("status_reason")
    if status == "held":
        if reason:
            return f"Held by the brand: {reason}"
        if line.get("self_referral"):
            return "Held: the customer's email is your own (a self-referral)"
        return "Held by the brand"
    if status == "void":
        return f"Void: {reason}" if reason else "Void: the brand voided this sale"
    if kind == "clawback":
        return "Clawback: the sale was refunded after its commission was approved"
    if kind == "adjustment":
        return (
            "Adjustment: the sale came to you after an earlier line was booked"
            if line["amount"] > 0
            else "Adjustment: the sale went to another partner, or changed, after this was booked"
        )
    if status == "reversed":
        return "Reversed: the sale was refunded or is no longer yours"
    if status == "pending":
        return "Pending until the holding period ends"
    return ""


def lines(db: Reader, program_id: str, code: str, limit: int = 500) -> list[dict[str, Any]]:
    """The partner's commission lines, newest first (at most `limit`), each with `why`."""
    if not db.table_exists("rc_commissions"):
        return []
    rows = db.dicts(
        f"SELECT {', '.join(LINE_COLUMNS)} FROM rc_commissions WHERE program_id = ? AND partner_code = ?"
        " ORDER BY dated_at DESC, transaction_id, kind LIMIT ?",
        [program_id, code, limit],
    )
    return [{**row, "why": why(row)} for row in rows]


def payout_rows(db: Reader, program_id: str, code: str) -> list[dict[str, Any]]:
    """The partner's rows of every payout batch (one per currency), newest batch first, each with
    the batch's number, cut-off, status and payment time."""
    found = payouts.netted(db, program_id)
    out = []
    for batch in reversed(found.batches):
        for row in found.rows[batch["payout_id"]]:
            if row["partner_code"] == code:
                out.append(
                    {
                        "payout_id": batch["payout_id"],
                        "number": batch["number"],
                        "up_to": batch["up_to"],
                        "status": batch["status"],
                        "paid_at": batch["paid_at"],
                        **{k: row[k] for k in payouts.ROW_FIELDS if k in row},
                    }
                )
    return out


PAYOUT_FILE_COLUMNS = (
    "payout_id",
    "number",
    "up_to",
    "status",
    "paid_at",
    "currency",
    "amount",
    "amount_decimal",
    "lines",
    "net",
    "carried_in",
    "carried_forward",
)


def payouts_csv(rows: Sequence[dict[str, Any]]) -> bytes:
    """The partner's payout rows in the one CSV format (reports/csvcells.py)."""
    money = ("net", "carried_in", "carried_forward")
    header = (*PAYOUT_FILE_COLUMNS, *csvcells.decimal_columns(money))
    body = (
        [
            *(csvcells.value(row.get(c)) for c in PAYOUT_FILE_COLUMNS),
            *(str(units(int(row[m]), row["currency"])) for m in money),
        ]
        for row in rows
    )
    return csvcells.document(header, body)


def batch_lines(db: Reader, program_id: str, code: str, payout_id: str) -> list[dict[str, Any]]:
    """The partner's lines a batch took (empty when it took none of theirs)."""
    if not db.table_exists("rc_commissions"):
        return []
    return db.dicts(
        f"SELECT {', '.join(LINE_COLUMNS)} FROM rc_commissions"
        " WHERE program_id = ? AND partner_code = ? AND payout_id = ?"
        " ORDER BY dated_at, transaction_id, kind",
        [program_id, code, payout_id],
    )


def lines_csv(rows: Sequence[dict[str, Any]]) -> bytes:
    header = (*LINE_COLUMNS, "amount_decimal")
    body = (
        [
            *(csvcells.value(row.get(c)) for c in LINE_COLUMNS),
            csvcells.decimal(row["amount"], row["currency"]),
        ]
        for row in rows
    )
    return csvcells.document(header, body)
