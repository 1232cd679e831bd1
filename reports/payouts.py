"""Payout batches as finance reads them: netted per partner and currency, negatives carried.

Which lines a batch takes is decided by the reconciler from the log (reconcile/payouts.py) and
materialised in `rc_commissions.payout_id`; here a batch's lines are netted per partner and
currency. Batches of a program are taken in order (`number`): per partner and currency, with
`minimum` the program's payout minimum the batch recorded when it was made (`payout_minimum`,
minor units of the row's currency; 0 for batches made before the setting),

    total = the batch's lines (`net`) + what the previous batches carried (`carried_in`)
    amount = total when total >= max(minimum, 1), else 0   (never a payment below the minimum)
    carried_forward = total - amount                        (netted by the partner's next batch)

so a clawback after payment lowers the next payment, a partner whose lines net negative is paid
nothing until later lines make up for it, and one whose balance is below the minimum is paid it
with a later batch. Nothing booked changes: the lines stay in the batch that took them, and
what a row carries is money owed one way or the other, paid or netted by the next batch. Every
query is plain SQL with `?` parameters
over the materialised tables (any backend's `Reader`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import xlsxwriter

from ingest.domain.bounds import PerCurrencyValue
from ingest.domain.records import Partner, PayoutDetails
from ingest.storage.contract import Reader
from reports import csvcells, payfiles
from reports.money import NO_CURRENCY, excel_format, units

BATCH_FIELDS = (
    "payout_id",
    "number",
    "up_to",
    "created_at",
    "created_by",
    "status",
    "paid_at",
    "paid_by",
    "payout_minimum",
)
ROW_FIELDS = (
    "partner_code",
    "partner_name",
    "partner_email",
    "amount",
    "amount_decimal",
    "currency",
    "lines",
    "net",
    "carried_in",
    "carried_forward",
)
FORMATS = ("json", "csv", "xlsx", *payfiles.SERVICES)
Details = Mapping[str, PayoutDetails]
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
CSV = "text/csv; charset=utf-8"


def cutoff(up_to: date) -> datetime:
    """The first instant after the `up_to` day (UTC): lines dated before it are up to then."""
    if up_to == date.max:  # no day after it: every time tally holds is before its end
        return datetime.max.replace(tzinfo=UTC)
    return datetime(up_to.year, up_to.month, up_to.day, tzinfo=UTC) + timedelta(days=1)


def _batches(db: Reader, program_id: str) -> list[dict[str, Any]]:
    if not db.table_exists("rc_payouts"):
        return []
    # every column: tables of a run before `payout_minimum` existed lack it (0 until the next run)
    rows = db.dicts("SELECT * FROM rc_payouts WHERE program_id = ? ORDER BY number", [program_id])
    return [
        {**{k: row.get(k) for k in BATCH_FIELDS}, "payout_minimum": int(row.get("payout_minimum") or 0)}
        for row in rows
    ]


def settle(total: int, minimum: int) -> tuple[int, int]:
    """(amount paid, carried forward) of a partner's balance `total` under `minimum` (the module
    docstring's rule)."""
    amount = total if total >= max(minimum, 1) else 0
    return amount, total - amount


def _nets(db: Reader, program_id: str) -> list[dict[str, Any]]:
    """Per batch, partner and currency: the sum of its lines and their count."""
    if not db.table_exists("rc_commissions"):
        return []
    return db.dicts(
        "SELECT payout_id, partner_code, currency, SUM(amount) AS net, COUNT(*) AS lines"
        " FROM rc_commissions WHERE program_id = ? AND payout_id IS NOT NULL"
        " GROUP BY payout_id, partner_code, currency",
        [program_id],
    )


def _row(
    key: tuple[str, str], amount: int, lines: int, net: int, carried_in: int, forward: int
) -> dict[str, Any]:
    return {
        "partner_code": key[0],
        "currency": key[1],
        "amount": amount,
        "amount_decimal": str(units(amount, key[1])),
        "lines": lines,
        "net": net,
        "carried_in": carried_in,
        "carried_forward": forward,
    }


@dataclass(frozen=True)
class Netted:
    """Every batch of a program with its rows (ROW_FIELDS without the partner's name and email)."""

    batches: list[dict[str, Any]]
    rows: dict[str, list[dict[str, Any]]]
    # what each partner and currency carries after the last batch: owed back (< 0), or not paid
    # yet for being below the minimum (> 0)
    carried: dict[tuple[str, str], int]


def netted(db: Reader, program_id: str) -> Netted:
    """The batches of a program, in order, netted and carried (the module docstring's rules)."""
    with db.consistent():
        batches = _batches(db, program_id)
        nets = _nets(db, program_id)
    by_batch: dict[str, list[dict[str, Any]]] = {}
    for row in nets:
        by_batch.setdefault(str(row["payout_id"]), []).append(row)
    carried: dict[tuple[str, str], int] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for batch in batches:
        out = []
        for row in sorted(
            by_batch.get(batch["payout_id"], []), key=lambda r: (r["partner_code"], r["currency"])
        ):
            key = (str(row["partner_code"]), str(row["currency"] or NO_CURRENCY))
            net = int(row["net"])
            carried_in = carried.pop(key, 0)
            amount, forward = settle(net + carried_in, int(batch["payout_minimum"]))
            if forward:
                carried[key] = forward
            out.append(_row(key, amount, int(row["lines"]), net, carried_in, forward))
        rows[batch["payout_id"]] = out
    return Netted(batches, rows, carried)


def _named(rows: Sequence[dict[str, Any]], partners: Mapping[str, Partner]) -> list[dict[str, Any]]:
    named = []
    for row in rows:
        partner = partners.get(row["partner_code"])
        named.append(
            {
                "partner_code": row["partner_code"],
                "partner_name": partner.name if partner else None,
                "partner_email": partner.email if partner else None,
                **{
                    k: row[k]
                    for k in ROW_FIELDS
                    if k not in ("partner_code", "partner_name", "partner_email")
                },
            }
        )
    return named


def _totals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per currency: what the batch pays and how many lines it takes."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        total = totals.setdefault(row["currency"], {"amount": 0, "lines": 0})
        total["amount"] += row["amount"]
        total["lines"] += row["lines"]
    return [
        {
            "currency": c,
            "amount": t["amount"],
            "amount_decimal": str(units(t["amount"], c)),
            "lines": t["lines"],
        }
        for c, t in sorted(totals.items())
    ]


def view(
    batch: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    partners: Mapping[str, Partner],
    details: Details | None = None,
) -> dict[str, Any]:
    """A batch as the API shows it: its record, its rows per partner and currency, totals, and
    who it cannot pay and why (`not_paid`, reports/payfiles.py: by the partners' payout
    `details`)."""
    named = _named(rows, partners)
    found = {
        **{k: batch[k] for k in BATCH_FIELDS},
        "rows": named,
        "totals": _totals(named),
        "lines": sum(r["lines"] for r in named),
    }
    found["not_paid"] = payfiles.not_paid(found, details or {})
    return found


def empty(up_to: date, minimum: PerCurrencyValue = 0) -> dict[str, Any]:
    """What creating a batch answers when nothing new is payable and no batch has this cut-off."""
    return {
        "payout_id": None,
        "number": None,
        "up_to": up_to.isoformat(),
        "created_at": None,
        "created_by": None,
        "status": "empty",
        "paid_at": None,
        "paid_by": None,
        "payout_minimum": minimum,
        "rows": [],
        "totals": [],
        "lines": 0,
        "not_paid": [],
    }


def batches(
    db: Reader, program_id: str, partners: Mapping[str, Partner], details: Details | None = None
) -> list[dict[str, Any]]:
    """Every batch of the program, newest first, each with its rows and totals."""
    found = netted(db, program_id)
    return [view(b, found.rows[b["payout_id"]], partners, details) for b in reversed(found.batches)]


def batch(
    db: Reader,
    program_id: str,
    payout_id: str,
    partners: Mapping[str, Partner],
    details: Details | None = None,
) -> dict[str, Any] | None:
    found = netted(db, program_id)
    for b in found.batches:
        if b["payout_id"] == payout_id:
            return view(b, found.rows[payout_id], partners, details)
    return None


def latest_with_cutoff(
    db: Reader, program_id: str, up_to: date, partners: Mapping[str, Partner], details: Details | None = None
) -> dict[str, Any] | None:
    """The newest batch made with this cut-off, if any."""
    for b in batches(db, program_id, partners, details):
        if b["up_to"] == up_to.isoformat():
            return b
    return None


# Booked, approved (neither held nor void), in no batch (reconcile/payouts.py `assign`).
_PAYABLE = (
    " FROM rc_commissions WHERE program_id = ? AND payout_id IS NULL AND booked_seq IS NOT NULL"
    " AND status = 'approved' AND amount <> 0 AND available_at <= ? AND dated_at < ?"
)


def payable_lines(db: Reader, program_id: str, at: datetime, up_to: date) -> int:
    """How many lines a batch made at `at` with cut-off `up_to` would take (reconcile/payouts.py
    decides the same from the log)."""
    if not db.table_exists("rc_commissions"):
        return 0
    row = db.one(f"SELECT COUNT(*){_PAYABLE}", [program_id, at, cutoff(up_to)])
    return int(row[0]) if row else 0


def due(
    db: Reader,
    program_id: str,
    at: datetime,
    partners: Mapping[str, Partner],
    minimum: Callable[[str], int] = lambda currency: 0,
) -> list[dict[str, Any]]:
    """What a batch made at `at` (no cut-off) would pay, per partner and currency: the approved
    lines no batch took yet, netted with what earlier batches carried, under the program's
    payout minimum now (`minimum`: its amount for a currency, ProgramSettings.payout_minimum_for)."""
    found = netted(db, program_id)
    rows: list[dict[str, Any]] = []
    if db.table_exists("rc_commissions"):
        rows = db.dicts(
            "SELECT partner_code, currency, SUM(amount) AS net, COUNT(*) AS lines"
            " FROM rc_commissions WHERE program_id = ? AND payout_id IS NULL AND status = 'approved'"
            " AND amount <> 0 AND available_at <= ? GROUP BY partner_code, currency",
            [program_id, at],
        )
    keys = {(str(r["partner_code"]), str(r["currency"] or NO_CURRENCY)): r for r in rows}
    out = []
    for key in sorted(set(keys) | {k for k, v in found.carried.items() if v}):
        row = keys.get(key)
        net = int(row["net"]) if row else 0
        carried_in = found.carried.get(key, 0)
        amount, forward = settle(net + carried_in, minimum(key[1]))
        out.append(_row(key, amount, int(row["lines"]) if row else 0, net, carried_in, forward))
    return _named(out, partners)


def people(db: Reader, account_ids: Sequence[str | None]) -> dict[str, str]:
    """The email of each account that made or paid a batch (`created_by`, `paid_by` hold account
    ids), so pages name people rather than `acc_...` ids; an id not found maps to nothing."""
    wanted = sorted({a for a in account_ids if a})
    if not wanted or not db.table_exists("accounts"):
        return {}
    found = db.rows(
        f"SELECT account_id, email FROM accounts WHERE account_id IN ({', '.join('?' * len(wanted))})", wanted
    )
    return {str(account_id): str(email) for account_id, email in found}


# -- files ------------------------------------------------------------------------------------
# The files' columns: the JSON row's fields in its order (money in minor units, and the contract's
# `amount_decimal`), then the other money's whole-unit twins (the CSV format of reports/csvcells.py).
FILE_MONEY = ("net", "carried_in", "carried_forward")
FILE_COLUMNS = (*ROW_FIELDS, *csvcells.decimal_columns(FILE_MONEY))


def _file_rows(payout: dict[str, Any]) -> list[dict[str, Any]]:
    """The batch's rows as the files write them: the JSON's fields as they are (money in minor
    units, `amount_decimal` a string of whole units), then each other money field's `_decimal`
    twin as a Decimal in whole units of the row's currency."""
    out = []
    for row in payout["rows"]:
        currency = row["currency"]
        decimals = {f"{name}_decimal": units(row[name], currency) for name in FILE_MONEY}
        out.append({**{k: row[k] for k in ROW_FIELDS}, **decimals})
    return out


def to_csv(payout: dict[str, Any]) -> bytes:
    """One row per partner and currency, in the one CSV format (reports/csvcells.py)."""
    return csvcells.document(
        FILE_COLUMNS,
        (["" if row[c] is None else str(row[c]) for c in FILE_COLUMNS] for row in _file_rows(payout)),
    )


def to_xlsx(payout: dict[str, Any]) -> bytes:
    """One sheet: the batch's record above its rows (frozen header, filters); whole-unit money
    cells carry a number format naming their row's currency."""
    buffer = io.BytesIO()
    options = {"in_memory": True, "strings_to_formulas": False, "strings_to_urls": False}
    book = xlsxwriter.Workbook(buffer, options)
    created = payout["created_at"]
    if isinstance(created, datetime):
        book.set_properties({"created": created.replace(tzinfo=None)})
    bold = book.add_format({"bold": True})
    header = book.add_format({"bold": True, "bg_color": "#F0F2F5", "bottom": 1})
    formats: dict[str, Any] = {}
    ws = book.add_worksheet("Payout")
    ws.write_string(0, 0, f"Payout {payout['payout_id']}", bold)
    ws.write_string(1, 0, f"up to {payout['up_to']}, status {payout['status']}")
    top = 3
    for col, name in enumerate(FILE_COLUMNS):
        ws.write_string(top, col, name, header)
    rows = _file_rows(payout)
    for i, row in enumerate(rows, start=top + 1):
        currency = row["currency"]
        if currency not in formats:
            formats[currency] = book.add_format({"num_format": excel_format(currency)})
        for col, name in enumerate(FILE_COLUMNS):
            value = row[name]
            if value is None:
                continue
            if name.endswith("_decimal"):
                ws.write_number(i, col, float(value), formats[currency])
            elif isinstance(value, int):
                ws.write_number(i, col, value)
            else:
                ws.write_string(i, col, str(value))
    ws.freeze_panes(top + 1, 0)
    ws.autofilter(top, 0, top + max(len(rows), 1), len(FILE_COLUMNS) - 1)
    ws.set_column(0, len(FILE_COLUMNS) - 1, 16)
    book.close()
    return buffer.getvalue()
