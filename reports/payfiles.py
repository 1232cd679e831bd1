"""Payout batches as the files PayPal Payouts and Wise batch payments import (CONTRACT 14), and
who a batch cannot pay, and why.

Each file has one row per partner (and currency) that the batch pays (`amount` > 0) and whose
payout details (`Portal.payout_details`) name that service; everyone else the batch lists is
left out of the files and named by `not_paid`: below the program's payout minimum, owing a
negative balance, or without payout details.

PayPal Payouts (Payouts Web, "Send payouts from Payouts Web" / "Use Web UI" in PayPal's developer
documentation): a CSV of up to 5,000 rows, no header row, one currency per file, each row:
recipient identifier (the PayPal account's email), payment amount (a decimal number with a dot),
currency (ISO 4217), customer id (optional, at most 30 characters: the partner's code when it
fits), note to recipient (optional, at most 400 characters), recipient wallet (`PAYPAL`).

Wise batch payments, the "Send by email" template (Wise Help Centre, "What's a batch payment
template?" and "How do I fill in my batch template?"): a CSV with the header row
`name,recipientEmail,paymentReference,receiverType,amountCurrency,amount,sourceCurrency,targetCurrency`;
`receiverType` PERSON; `amountCurrency` `target` (the partner gets exactly the amount) when the
partner is paid in the batch's currency, else `source` (the amount leaves in the batch's currency
and Wise converts it into the partner's); amounts are plain decimal numbers.

Neither file has a byte order mark (the services read the first cell as an email or a column
name); every cell goes through reports/csvcells.py's formula guard, and payees' names never start
with a formula character anyway (ingest/domain/inputs.py).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ingest.domain.records import PayoutDetails
from reports import csvcells
from reports.money import exponent, units

Service = Literal["paypal", "wise"]
SERVICES: tuple[Service, ...] = ("paypal", "wise")
WISE_HEADER = (
    "name",
    "recipientEmail",
    "paymentReference",
    "receiverType",
    "amountCurrency",
    "amount",
    "sourceCurrency",
    "targetCurrency",
)
PAYPAL_COLUMNS = ("recipient", "amount", "currency", "customer_id", "note", "wallet")
PAYPAL_MAX_ROWS = 5_000
CUSTOMER_ID_MAX = 30
NOTE_MAX = 400
REFERENCE_MAX = 18  # the shortest limit Wise sets on a payment reference among the currencies it pays
Reason = Literal["below_minimum", "negative_balance", "no_payout_details", "nothing_due"]


class CurrencyNeeded(ValueError):
    """Raised by `paypal_csv` when the batch pays PayPal partners in several currencies and none
    was chosen (PayPal takes one currency per file): `currencies` lists them."""

    def __init__(self, currencies: Sequence[str]) -> None:
        super().__init__(f"PayPal takes one currency per file; this batch pays in {', '.join(currencies)}")
        self.currencies = list(currencies)


class TooManyRows(ValueError):
    """Raised by `paypal_csv` when one currency's PayPal rows are more than a PayPal file takes."""

    def __init__(self, rows: int) -> None:
        super().__init__(
            f"PayPal takes at most {PAYPAL_MAX_ROWS} payouts per file; this one would have {rows}"
        )


def _decimal(amount: int, currency: str) -> str:
    return f"{units(amount, currency):.{exponent(currency)}f}"


def not_paid(payout: Mapping[str, Any], details: Mapping[str, PayoutDetails]) -> list[dict[str, Any]]:
    """The batch's rows no file pays, each with why: `below_minimum` (a positive balance under the
    batch's payout minimum, carried to the next batch), `negative_balance` (owed back, netted by
    the next batch), `nothing_due`, or `no_payout_details` (the batch pays the partner, but they
    set no method: pay them by hand, or ask them to fill in the portal's form). `balance`: what
    the batch carries for them, or what it pays for want of details."""
    out = []
    for row in payout["rows"]:
        reason: Reason | None = None
        balance = row["carried_forward"]
        if row["amount"] > 0:
            if row["partner_code"] not in details:
                reason, balance = "no_payout_details", row["amount"]
        elif row["carried_forward"] > 0:
            reason = "below_minimum"
        elif row["carried_forward"] < 0:
            reason = "negative_balance"
        else:
            reason = "nothing_due"
        if reason is not None:
            out.append(
                {
                    "partner_code": row["partner_code"],
                    "partner_name": row.get("partner_name"),
                    "currency": row["currency"],
                    "balance": balance,
                    "reason": reason,
                }
            )
    return out


def paid_by(
    payout: Mapping[str, Any], details: Mapping[str, PayoutDetails], service: Service
) -> list[dict[str, Any]]:
    """The batch's rows a `service` file pays: amount > 0, the partner's method `service`."""
    return [
        row
        for row in payout["rows"]
        if row["amount"] > 0 and (d := details.get(row["partner_code"])) is not None and d.method == service
    ]


def _csv(header: Sequence[str] | None, rows: Sequence[Sequence[Any]]) -> bytes:
    out = io.StringIO()
    cells = csvcells.writer(out)
    if header is not None:
        cells.writerow(header)
    for row in rows:
        cells.writerow(row)
    return out.getvalue().encode("utf-8")


def paypal_csv(
    payout: Mapping[str, Any],
    details: Mapping[str, PayoutDetails],
    program_name: str,
    currency: str | None = None,
) -> tuple[bytes, str | None]:
    """The PayPal Payouts file of the batch (in `currency`, needed when its PayPal rows have
    several), and the currency it pays in (None when it pays no one)."""
    rows = paid_by(payout, details, "paypal")
    currencies = sorted({row["currency"] for row in rows})
    if currency is None:
        if len(currencies) > 1:
            raise CurrencyNeeded(currencies)
        currency = currencies[0] if currencies else None
    mine = [row for row in rows if row["currency"] == currency]
    if len(mine) > PAYPAL_MAX_ROWS:
        raise TooManyRows(len(mine))
    note = f"{program_name}: commissions, payout {payout['number']}"[:NOTE_MAX]
    lines = [
        (
            details[row["partner_code"]].email,
            _decimal(row["amount"], row["currency"]),
            row["currency"].upper(),
            row["partner_code"] if len(row["partner_code"]) <= CUSTOMER_ID_MAX else "",
            note,
            "PAYPAL",
        )
        for row in mine
    ]
    return _csv(None, lines), currency


def wise_csv(payout: Mapping[str, Any], details: Mapping[str, PayoutDetails]) -> bytes:
    """The Wise batch payments file ("Send by email" template) of the batch."""
    reference = f"Payout {payout['number']}"[:REFERENCE_MAX]
    lines = []
    for row in paid_by(payout, details, "wise"):
        d = details[row["partner_code"]]
        same = d.currency == row["currency"]
        lines.append(
            (
                d.name,
                d.email,
                reference,
                "PERSON",
                "target" if same else "source",
                _decimal(row["amount"], row["currency"]),
                row["currency"].upper(),
                d.currency.upper(),
            )
        )
    return _csv(WISE_HEADER, lines)
