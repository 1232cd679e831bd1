"""Partners' statements and balances (CONTRACT 15): every cent owed to a partner, as entries.

A statement is one partner's account in one currency, oldest entry first, each with the balance
after it:

- `commission`, `adjustment`, `clawback`, `manual`: a booked line, when its booking was logged
  (`booked_at`), with its amount (positive when owed to the partner);
- `adjustment` also for each later change of what a booked line owes (a hold, a release, a void,
  a batch letting it go: reconcile/entries.py), when it was logged;
- `payout`: a paid batch's row, minus what it sent, when the batch was marked paid;
- `payout_failed`: that row's payment failing, plus the same amount, when it was logged.

Entries are in the log's order (their log position), never by a clock; none is ever edited. Only
approved money enters: the closing balance is the sum of the partner's approved lines that no
paid batch holds, what the next batch would pay before the minimum (reconcile/entries.py says
why). `from` / `to` bound the entries shown by time; the opening balance is everything before.

Balances (on the partner reads): per currency, `approved_unpaid` (the closing balance),
`pending` (lines not yet booked as approved: within their holding days, or approved since the
last reconcile run) and `held`. Batches made before snapshots pay by their netted rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from ingest.domain.clock import rfc3339
from ingest.storage.contract import Reader
from reports import csvcells, payouts
from reports.money import NO_CURRENCY, units

ENTRY_KINDS = ("commission", "adjustment", "clawback", "manual", "payout", "payout_failed")
ENTRY_FIELDS = ("booked_at", "kind", "amount", "transaction_id", "payout_id", "reason", "balance")
FORMATS = ("json", "csv")
CSV = "text/csv; charset=utf-8"


def _time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _line_reason(line: dict[str, Any]) -> str | None:
    if line["kind"] == "manual":
        return None if line["status_reason"] is None else str(line["status_reason"])
    if line["kind"] in ("adjustment", "clawback"):
        return f"caused by {line['cause']}" if line["cause"] else None
    return None


def _entries(db: Reader, program_id: str, code: str, currency: str) -> list[tuple[int, int, dict[str, Any]]]:
    """(log position, order within it, entry without `balance`) of every entry of the account."""
    out: list[tuple[int, int, dict[str, Any]]] = []
    if db.table_exists("rc_commissions"):
        lines = db.dicts(
            "SELECT sale_id, transaction_id, kind, cause, amount, booked_seq, booked_at, status_reason,"
            " history, payout_id FROM rc_commissions WHERE program_id = ? AND partner_code = ?"
            " AND currency = ? AND booked_seq IS NOT NULL AND amount <> 0",
            [program_id, code, currency],
        )
        for line in lines:
            pid = None if line["transaction_id"] else (line["payout_id"] or str(line["cause"]).split(":")[0])
            out.append(
                (
                    int(line["booked_seq"]),
                    0,
                    {
                        "booked_at": _time(line["booked_at"]),
                        "kind": line["kind"],
                        "amount": int(line["amount"]),
                        "transaction_id": line["transaction_id"],
                        "payout_id": pid,
                        "reason": _line_reason(line),
                    },
                )
            )
            for change in json.loads(line["history"] or "[]"):
                out.append(
                    (
                        int(change["seq"]),
                        1,
                        {
                            "booked_at": _time(change["at"]),
                            "kind": "adjustment",
                            "amount": int(change["amount"]),
                            "transaction_id": line["transaction_id"],
                            "payout_id": pid,
                            "reason": change["reason"],
                        },
                    )
                )
    out += _payout_entries(db, program_id, code, currency)
    return sorted(out, key=lambda e: (e[0], e[1], e[2]["kind"], str(e[2]["transaction_id"]), e[2]["amount"]))


def _payout_entries(
    db: Reader, program_id: str, code: str, currency: str
) -> list[tuple[int, int, dict[str, Any]]]:
    out: list[tuple[int, int, dict[str, Any]]] = []
    found = payouts.netted(db, program_id)
    for batch in found.batches:
        if batch["status"] != "paid" or batch["paid_at"] is None:
            continue
        failed = {(f["partner_code"], f["currency"]): f for f in json.loads(batch.get("failures") or "[]")}
        for row in found.rows[batch["payout_id"]]:
            if (row["partner_code"], row["currency"]) != (code, currency) or row["amount"] == 0:
                continue
            paid_seq = int(batch.get("paid_seq") or 0)
            out.append(
                (
                    paid_seq,
                    2,
                    {
                        "booked_at": _time(batch["paid_at"]),
                        "kind": "payout",
                        "amount": -int(row["amount"]),
                        "transaction_id": None,
                        "payout_id": batch["payout_id"],
                        "reason": f"payout {batch['number']} paid",
                    },
                )
            )
            failure = failed.get((code, currency))
            if failure is not None:
                out.append(
                    (
                        int(failure["seq"]),
                        2,
                        {
                            "booked_at": _time(failure["failed_at"]),
                            "kind": "payout_failed",
                            "amount": int(row["amount"]),
                            "transaction_id": None,
                            "payout_id": batch["payout_id"],
                            "reason": failure["reason"],
                        },
                    )
                )
    return out


def statement(
    db: Reader,
    program_id: str,
    code: str,
    currency: str,
    start: datetime | None = None,
    end: datetime | None = None,
) -> dict[str, Any]:
    """The partner's statement in `currency`: entries logged in [start, end) (either open)."""
    with db.consistent():
        found = _entries(db, program_id, code, currency)
    opening = balance = 0
    shown = []
    for _, _, entry in found:
        if start is not None and entry["booked_at"] < start:
            opening += entry["amount"]
            balance = opening
            continue
        if end is not None and entry["booked_at"] >= end:
            break
        balance += entry["amount"]
        shown.append({**entry, "balance": balance})
    return {
        "partner_code": code,
        "currency": currency,
        "from": start,
        "to": end,
        "opening_balance": opening,
        "entries": shown,
        "closing_balance": balance,
    }


CSV_COLUMNS = (
    "booked_at",
    "kind",
    "amount",
    "transaction_id",
    "payout_id",
    "reason",
    "balance",
    "currency",
    *csvcells.decimal_columns(("amount", "balance")),
)


def to_csv(found: dict[str, Any]) -> bytes:
    """The statement as CSV (reports/csvcells.py): an `opening_balance` row, the entries, a
    `closing_balance` row; money in minor units and in whole units."""
    currency = found["currency"] or NO_CURRENCY

    def cells(entry: dict[str, Any]) -> list[str]:
        at = entry.get("booked_at")
        return [
            rfc3339(at) if isinstance(at, datetime) else csvcells.value(at),  # as the JSON gives it
            entry["kind"],
            str(entry["amount"]),
            csvcells.value(entry.get("transaction_id")),
            csvcells.value(entry.get("payout_id")),
            csvcells.value(entry.get("reason")),
            str(entry["balance"]),
            currency,
            str(units(entry["amount"], currency)),
            str(units(entry["balance"], currency)),
        ]

    entries = found["entries"]
    # without `from` / `to`, the opening row is dated at the first entry and the closing row at
    # the last (the balances as of then); empty only for a statement with no entry
    opening = {
        "booked_at": found["from"] or (entries[0]["booked_at"] if entries else None),
        "kind": "opening_balance",
        "amount": 0,
        "balance": found["opening_balance"],
    }
    closing = {
        "booked_at": found["to"] or (entries[-1]["booked_at"] if entries else None),
        "kind": "closing_balance",
        "amount": 0,
        "balance": found["closing_balance"],
    }
    rows: Iterable[list[str]] = (cells(e) for e in [opening, *entries, closing])
    return csvcells.document(CSV_COLUMNS, rows)


def balances(
    db: Reader, program_id: str, codes: Sequence[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Per partner code: per currency, `approved_unpaid`, `pending` and `held` (minor units)."""
    if not db.table_exists("rc_commissions"):
        return {}
    rows = db.dicts(
        "SELECT partner_code, currency,"
        " SUM(CASE WHEN status = 'approved' AND booked_seq IS NOT NULL THEN amount ELSE 0 END)"
        " AS approved_unpaid,"
        " SUM(CASE WHEN status = 'pending' OR (status = 'approved' AND booked_seq IS NULL)"
        " THEN amount ELSE 0 END) AS pending,"
        " SUM(CASE WHEN status = 'held' THEN amount ELSE 0 END) AS held"
        " FROM rc_commissions WHERE program_id = ? AND partner_code IS NOT NULL"
        " GROUP BY partner_code, currency ORDER BY partner_code, currency",
        [program_id],
    )
    wanted = None if codes is None else set(codes)
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        code = str(row["partner_code"])
        if wanted is not None and code not in wanted:
            continue
        out.setdefault(code, []).append(
            {
                "currency": row["currency"],
                "approved_unpaid": int(row["approved_unpaid"] or 0),
                "pending": int(row["pending"] or 0),
                "held": int(row["held"] or 0),
            }
        )
    return out
