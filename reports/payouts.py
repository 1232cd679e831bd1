"""Payout batches as finance reads them: snapshots of what each batch pays, and to whom.

A batch is made under the reconciler's run lock, on tables reconciled up to then
(api/finance.py): `snapshot` sums, per partner and currency, the approved lines no live batch
holds (booked, neither held nor void, dated up to the cut-off), and decides who it pays:

- a balance below the minimum (`max(minimum, 1)`, the program's `payout_minimum` for that
  currency) is not paid: `below_minimum` (a balance exactly at the minimum is paid);
- a partner with no payout details: `no_payout_details`;
- details in another currency than the lines', or a currency their service cannot pay
  (reports/payfiles.py): `currency_not_supported` (never a silent conversion);
- everyone else gets a row: the amount the service can send (whole units where it takes no
  decimals: the rest, `rounding`, stays owed, reconcile/payouts.py), with the payee's details as
  they are now (`payout_method`, `payout_email`, `payout_name`, `payout_currency`) and the
  partner's name and email.

The snapshot is written into the batch's log row, so every output of the batch (JSON, CSV, xlsx,
the PayPal and Wise files) is rendered from it: the same bytes whatever changes later (details,
terms, lines). Partners not paid keep their lines approved and unpaid for a later batch; they are
listed under `not_paid`. A batch is `open`, then `paid` or `cancelled`; a paid batch's row may
fail (`outcome` `failed`, with why): its lines are owed again; nothing else of the batch changes.

Batches made before snapshots existed are read as they always were: netted per partner and
currency in order, a balance under the minimum carried to the next one (`carried_in`,
`carried_forward`), payees' details as they are now. Every query is plain SQL with `?`
parameters over the materialised tables (any backend's `Reader`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import xlsxwriter

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
    "cancelled_at",
    "cancelled_by",
    "cancel_reason",
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
# What a snapshot row records of the payee (reports/payfiles.py renders the files from them).
PAYEE_FIELDS = ("payout_method", "payout_email", "payout_name", "payout_currency")
FORMATS = ("json", "csv", "xlsx", *payfiles.SERVICES)
Details = Mapping[str, PayoutDetails]
Minimum = int | Mapping[str, int]
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
CSV = "text/csv; charset=utf-8"


def cutoff(up_to: date) -> datetime:
    """The first instant after the `up_to` day (UTC): lines dated before it are up to then."""
    if up_to == date.max:  # no day after it: every time tally holds is before its end
        return datetime.max.replace(tzinfo=UTC)
    return datetime(up_to.year, up_to.month, up_to.day, tzinfo=UTC) + timedelta(days=1)


def minimum_for(minimum: Minimum, currency: str) -> int:
    """The payout minimum of `currency`: one number for every currency, or the amount an object
    names for it (0 for a currency it does not name)."""
    if isinstance(minimum, Mapping):
        return int(minimum.get(currency, 0))
    return int(minimum)


# -- making a batch -----------------------------------------------------------------------------
# Booked, approved (neither held nor void), held by no live batch: what reconcile/payouts.py lets
# a batch made now hold, less the cut-off.
_FREE = (
    " FROM rc_commissions WHERE program_id = ? AND payout_id IS NULL AND booked_seq IS NOT NULL"
    " AND status = 'approved' AND amount <> 0"
)


def _free(db: Reader, program_id: str, up_to: date | None) -> list[dict[str, Any]]:
    """Per partner and currency, the free lines' sum (`net`) and count, dated up to `up_to`."""
    if not db.table_exists("rc_commissions"):
        return []
    dated, params = (
        ("", [program_id]) if up_to is None else (" AND dated_at < ?", [program_id, cutoff(up_to)])
    )
    return db.dicts(
        f"SELECT partner_code, currency, SUM(amount) AS net, COUNT(*) AS lines{_FREE}{dated}"
        " GROUP BY partner_code, currency ORDER BY partner_code, currency",
        params,
    )


def payable_lines(db: Reader, program_id: str, at: datetime, up_to: date) -> int:
    """How many free lines are dated up to `up_to` (`at` is kept for the callers' sake: a booked
    line is approved already)."""
    return sum(int(row["lines"]) for row in _free(db, program_id, up_to))


def snapshot(
    db: Reader,
    program_id: str,
    up_to: date | None,
    minimum: Minimum,
    partners: Mapping[str, Partner],
    details: Details,
    program_name: str | None = None,
) -> dict[str, Any]:
    """What a batch made now with cut-off `up_to` (None: every date) pays: `rows` and
    `not_paid` (the module docstring's rules), the minimum it applied and the program's name
    (the PayPal file's note names it)."""
    rows: list[dict[str, Any]] = []
    not_paid: list[dict[str, Any]] = []
    for free in _free(db, program_id, up_to):
        code, currency = str(free["partner_code"]), str(free["currency"] or NO_CURRENCY)
        net, count = int(free["net"]), int(free["lines"])
        partner = partners.get(code)
        name = partner.name if partner else None
        payee = details.get(code)
        sendable = payfiles.sendable(payee.method, currency, net) if payee is not None else net
        reason: str | None = None
        if net < max(minimum_for(minimum, currency), 1) or sendable < 1:
            reason = "below_minimum"
        elif payee is None:
            reason = "no_payout_details"
        elif payee.currency != currency or not payfiles.pays(payee.method, currency):
            reason = "currency_not_supported"
        if reason is not None:
            not_paid.append(
                {
                    "partner_code": code,
                    "partner_name": name,
                    "currency": currency,
                    "balance": net,
                    "lines": count,
                    "reason": reason,
                }
            )
            continue
        assert payee is not None
        rows.append(
            {
                "partner_code": code,
                "partner_name": name,
                "partner_email": partner.email if partner else None,
                "currency": currency,
                "amount": sendable,
                "net": net,
                "rounding": net - sendable,
                "lines": count,
                "payout_method": payee.method,
                "payout_email": payee.email,
                "payout_name": payee.name,
                "payout_currency": payee.currency,
            }
        )
    return {
        "payout_minimum": dict(minimum) if isinstance(minimum, Mapping) else minimum,
        "program_name": program_name,
        "rows": rows,
        "not_paid": not_paid,
    }


# -- reading batches ------------------------------------------------------------------------------
def _batches(db: Reader, program_id: str) -> list[dict[str, Any]]:
    if not db.table_exists("rc_payouts"):
        return []
    # every column: tables of a run before a column existed lack it (null until the next run)
    rows = db.dicts("SELECT * FROM rc_payouts WHERE program_id = ? ORDER BY number", [program_id])
    return [
        {
            **{k: row.get(k) for k in BATCH_FIELDS},
            "payout_minimum": int(row.get("payout_minimum") or 0),
            "snapshot": row.get("snapshot"),
            "failures": row.get("failures"),
            "paid_seq": row.get("paid_seq"),
        }
        for row in rows
    ]


def settle(total: int, minimum: int) -> tuple[int, int]:
    """(amount paid, carried forward) of a partner's balance `total` under `minimum` (the rule of
    batches made before snapshots)."""
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
    """Every batch of a program with its rows: a snapshot's (with the payee's details), or, for
    a batch made before snapshots, netted and carried (ROW_FIELDS without the partner's name and
    email)."""

    batches: list[dict[str, Any]]
    rows: dict[str, list[dict[str, Any]]]
    # what each partner and currency carries after the last batch made before snapshots: owed
    # back (< 0), or not paid yet for being below the minimum (> 0)
    carried: dict[tuple[str, str], int]


def _snapshot_rows(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A snapshot batch's rows as the API shows them, each with its `outcome`."""
    found = json.loads(batch["snapshot"])
    failed = {(f["partner_code"], f["currency"]): f for f in json.loads(batch.get("failures") or "[]")}
    out = []
    for row in found["rows"]:
        currency, amount = row["currency"], int(row["amount"])
        failure = failed.get((row["partner_code"], currency))
        outcome = {"paid": "paid", "cancelled": "cancelled"}.get(str(batch["status"]), "open")
        out.append(
            {
                "partner_code": row["partner_code"],
                "partner_name": row.get("partner_name"),
                "partner_email": row.get("partner_email"),
                "amount": amount,
                "amount_decimal": str(units(amount, currency)),
                "currency": currency,
                "lines": int(row.get("lines") or 0),
                "net": int(row.get("net", amount)),
                "carried_in": 0,
                "carried_forward": int(row.get("rounding") or 0),
                **{k: row.get(k) for k in PAYEE_FIELDS},
                "outcome": "failed" if failure else outcome,
                "failure": None
                if failure is None
                else {k: failure[k] for k in ("reason", "failed_at", "failed_by")},
            }
        )
    return sorted(out, key=lambda r: (r["partner_code"], r["currency"]))


def netted(db: Reader, program_id: str) -> Netted:
    """The batches of a program, in order, with their rows (the module docstring's rules)."""
    with db.consistent():
        batches = _batches(db, program_id)
        nets = _nets(db, program_id)
    by_batch: dict[str, list[dict[str, Any]]] = {}
    for row in nets:
        by_batch.setdefault(str(row["payout_id"]), []).append(row)
    carried: dict[tuple[str, str], int] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for batch in batches:
        if batch["snapshot"] is not None:
            rows[batch["payout_id"]] = _snapshot_rows(batch)
            continue
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


def _named(
    rows: Sequence[dict[str, Any]], partners: Mapping[str, Partner], details: Details, status: str
) -> list[dict[str, Any]]:
    """Rows of a batch made before snapshots, with the partner's name, email and payout details
    as they are now."""
    named = []
    for row in rows:
        partner = partners.get(row["partner_code"])
        payee = details.get(row["partner_code"])
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
                "payout_method": payee.method if payee else None,
                "payout_email": payee.email if payee else None,
                "payout_name": payee.name if payee else None,
                "payout_currency": payee.currency if payee else None,
                "outcome": ({"paid": "paid", "open": "open"}.get(status) if row["amount"] > 0 else None),
                "failure": None,
            }
        )
    return named


def _totals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per currency: what the batch pays and how many lines it takes."""
    totals: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.get("outcome") == "failed":
            continue
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
    """A batch as the API shows it: its record, its rows per partner and currency (each with its
    `outcome`), totals (failed rows left out), and who it could not pay and why (`not_paid`)."""
    if batch.get("snapshot") is not None:
        named = list(rows)
        stored = json.loads(batch["snapshot"])
        not_paid = list(stored.get("not_paid") or [])
        minimum = stored.get("payout_minimum", batch["payout_minimum"])
        program_name = stored.get("program_name")
    else:
        named = _named(rows, partners, details or {}, str(batch["status"]))
        not_paid = payfiles.not_paid({"rows": named}, details or {})
        minimum = batch["payout_minimum"]
        program_name = None
    return {
        **{k: batch[k] for k in BATCH_FIELDS},
        "payout_minimum": minimum,
        "program_name": program_name,
        "snapshot": batch.get("snapshot") is not None,
        "rows": named,
        "totals": _totals(named),
        "lines": sum(r["lines"] for r in named),
        "not_paid": not_paid,
    }


def empty(up_to: date, minimum: Minimum = 0, not_paid: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """What creating a batch answers when it would pay no one and no batch has this cut-off:
    who it could not pay, and why."""
    return {
        "payout_id": None,
        "number": None,
        "up_to": up_to.isoformat(),
        "created_at": None,
        "created_by": None,
        "status": "empty",
        "paid_at": None,
        "paid_by": None,
        "payout_minimum": dict(minimum) if isinstance(minimum, Mapping) else minimum,
        "cancelled_at": None,
        "cancelled_by": None,
        "cancel_reason": None,
        "program_name": None,
        "snapshot": True,
        "rows": [],
        "totals": [],
        "lines": 0,
        "not_paid": list(not_paid),
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
    """The newest batch made with this cut-off that is not cancelled, if any."""
    for b in batches(db, program_id, partners, details):
        if b["up_to"] == up_to.isoformat() and b["status"] != "cancelled":
            return b
    return None


def due(
    db: Reader,
    program_id: str,
    at: datetime,
    partners: Mapping[str, Partner],
    minimum: Minimum = 0,
    details: Details | None = None,
) -> list[dict[str, Any]]:
    """What a batch made now with no cut-off would pay, per partner and currency (ROW_FIELDS and
    the payee's details), and, with `reason`, whom it would not pay."""
    made = snapshot(db, program_id, None, minimum, partners, details or {})
    out = [
        {
            **{k: row.get(k) for k in ROW_FIELDS if k in row},
            "amount_decimal": str(units(row["amount"], row["currency"])),
            "carried_in": 0,
            "carried_forward": row["rounding"],
            **{k: row[k] for k in PAYEE_FIELDS},
            "reason": None,
        }
        for row in made["rows"]
    ]
    out += [
        {
            "partner_code": row["partner_code"],
            "partner_name": row["partner_name"],
            "partner_email": (p.email if (p := partners.get(row["partner_code"])) else None),
            "amount": 0,
            "amount_decimal": str(units(0, row["currency"])),
            "currency": row["currency"],
            "lines": row["lines"],
            "net": row["balance"],
            "carried_in": 0,
            "carried_forward": row["balance"],
            **dict.fromkeys(PAYEE_FIELDS),
            "reason": row["reason"],
        }
        for row in made["not_paid"]
    ]
    return sorted(out, key=lambda r: (r["partner_code"], r["currency"]))


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
# `amount_decimal`), the payee's details as the batch recorded them, then the other money's
# whole-unit twins (the CSV format of reports/csvcells.py). Nothing that changes after the batch
# is made (its status, a row's outcome) is in a file: a file is the same bytes forever.
FILE_MONEY = ("net", "carried_in", "carried_forward")
FILE_FIELDS = (*ROW_FIELDS, "payout_method", "payout_email")
FILE_COLUMNS = (*FILE_FIELDS, *csvcells.decimal_columns(FILE_MONEY))


def _file_rows(payout: dict[str, Any]) -> list[dict[str, Any]]:
    """The batch's rows as the files write them: the JSON's fields as they are (money in minor
    units, `amount_decimal` a string of whole units), then each other money field's `_decimal`
    twin as a Decimal in whole units of the row's currency."""
    out = []
    for row in payout["rows"]:
        currency = row["currency"]
        decimals = {f"{name}_decimal": units(row[name], currency) for name in FILE_MONEY}
        out.append({**{k: row.get(k) for k in FILE_FIELDS}, **decimals})
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
    ws.write_string(0, 0, f"Payout {payout['number']} ({payout['payout_id']})", bold)
    ws.write_string(1, 0, f"up to {payout['up_to']}")
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
