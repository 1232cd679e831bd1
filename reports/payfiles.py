"""Payout batches as the files PayPal Payouts and Wise batch payments import (CONTRACT 14, 15),
what each service can pay, and (for batches made before snapshots) who a batch cannot pay.

Each file has one row per partner (and currency) that the batch pays and whose payout details,
as the batch recorded them (reports/payouts.py `snapshot`), name that service. What a service
pays: PayPal the currencies of PayPal's list (`PAYPAL_CURRENCIES`), HUF, JPY and TWD in whole
units only; Wise the currencies its "Send by email" template can send to (`WISE_CURRENCIES`),
with each currency's usual decimals. A batch never lists a row a service cannot pay: such a
partner is under `not_paid` with `currency_not_supported`, and an amount the service cannot send
to the minor unit is rounded down, the rest owed (`sendable`). A file asked for in a currency
its service does not pay is refused (`CurrencyNotPaid`).

PayPal Payouts (Payouts Web, "Send payouts from Payouts Web" / "Use Web UI" in PayPal's developer
documentation): a CSV of up to 5,000 rows, no header row, one currency per file, each row:
recipient identifier (the PayPal account's email), payment amount (a decimal number with a dot),
currency (ISO 4217), customer id (optional, at most 30 characters: the partner's code when it
fits), note to recipient (optional, at most 400 characters), recipient wallet (`PAYPAL`).

Wise batch payments, the "Send by email" template (Wise Help Centre, "What's a batch payment
template?" and "How do I fill in my batch template?"): a CSV with the header row
`name,recipientEmail,paymentReference,receiverType,amountCurrency,amount,sourceCurrency,targetCurrency`;
`receiverType` PERSON; `amountCurrency` always `target` (the partner gets exactly the amount, in
the currency of their lines): nothing is ever converted, and a partner whose payout currency is
another one gets no row (`currency_not_supported`, CONTRACT 15); amounts are plain decimal numbers.

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

# PayPal Payouts' currencies (PayPal's "Currency codes" reference) and those it takes in whole
# units only ("This currency does not support decimals").
PAYPAL_CURRENCIES = frozenset(
    [
        "aud",
        "brl",
        "cad",
        "czk",
        "dkk",
        "eur",
        "hkd",
        "huf",
        "ils",
        "jpy",
        "myr",
        "mxn",
        "nok",
        "nzd",
        "php",
        "pln",
        "gbp",
        "sgd",
        "sek",
        "chf",
        "twd",
        "thb",
        "usd",
    ]
)
PAYPAL_WHOLE_UNITS = frozenset({"huf", "jpy", "twd"})
# The currencies Wise's "Send by email" batch template sends to (Wise Help Centre: not to LKR,
# BDT, COP, CNY, UAH, BWP, GHS or USD by Swift; not from BRL or INR).
WISE_CURRENCIES = frozenset(
    [
        "aed",
        "aud",
        "bgn",
        "cad",
        "chf",
        "czk",
        "dkk",
        "eur",
        "gbp",
        "hkd",
        "huf",
        "idr",
        "ils",
        "inr",
        "jpy",
        "krw",
        "mxn",
        "myr",
        "nok",
        "nzd",
        "php",
        "pln",
        "ron",
        "sek",
        "sgd",
        "thb",
        "try",
        "usd",
        "zar",
    ]
)

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


class CurrencyNotPaid(ValueError):
    """Raised by `paypal_csv` and `wise_csv` asked for a currency their service cannot pay."""

    def __init__(self, service: str, currency: str) -> None:
        super().__init__(f"{_NAMES[service]} cannot pay in {currency.upper()}")
        self.service = service
        self.currency = currency


_NAMES = {"paypal": "PayPal", "wise": "Wise"}


def pays(service: str, currency: str) -> bool:
    """Whether `service` (`paypal` or `wise`) pays in `currency`."""
    return currency.lower() in (PAYPAL_CURRENCIES if service == "paypal" else WISE_CURRENCIES)


def places(service: str, currency: str) -> int:
    """The decimals `service` takes for `currency`: PayPal none for HUF, JPY and TWD; otherwise
    the currency's own (reports/money.py)."""
    if service == "paypal" and currency.lower() in PAYPAL_WHOLE_UNITS:
        return 0
    return exponent(currency)


def sendable(service: str, currency: str, amount: int) -> int:
    """`amount` (minor units) rounded down to what `service` can send in `currency`."""
    step = 10 ** (exponent(currency) - min(places(service, currency), exponent(currency)))
    return amount - amount % step if amount > 0 else amount


def _decimal(amount: int, currency: str, service: str) -> str:
    return f"{units(amount, currency):.{places(service, currency)}f}"


def not_paid(payout: Mapping[str, Any], details: Mapping[str, PayoutDetails]) -> list[dict[str, Any]]:
    """For a batch made before snapshots: the rows no file pays, each with why: `below_minimum`
    (a positive balance under the batch's payout minimum, carried to the next batch),
    `negative_balance` (owed back, netted by the next batch), `nothing_due`, or
    `no_payout_details` (the batch pays the partner, but they set no method: pay them by hand,
    or ask them to fill in the portal's form). `balance`: what the batch carries for them, or
    what it pays for want of details."""
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


def paid_by(payout: Mapping[str, Any], service: Service) -> list[dict[str, Any]]:
    """The batch's rows a `service` file pays: amount > 0, the payee's method (as the batch
    recorded it) `service`."""
    return [row for row in payout["rows"] if row["amount"] > 0 and row.get("payout_method") == service]


def _csv(header: Sequence[str] | None, rows: Sequence[Sequence[Any]]) -> bytes:
    out = io.StringIO()
    cells = csvcells.writer(out)
    if header is not None:
        cells.writerow(header)
    for row in rows:
        cells.writerow(row)
    return out.getvalue().encode("utf-8")


def paypal_csv(
    payout: Mapping[str, Any], program_name: str, currency: str | None = None
) -> tuple[bytes, str | None]:
    """The PayPal Payouts file of the batch (in `currency`, needed when its PayPal rows have
    several), and the currency it pays in (None when it pays no one)."""
    if currency is not None and not pays("paypal", currency):
        raise CurrencyNotPaid("paypal", currency)
    rows = paid_by(payout, "paypal")
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
            row["payout_email"],
            _decimal(row["amount"], row["currency"], "paypal"),
            row["currency"].upper(),
            row["partner_code"] if len(row["partner_code"]) <= CUSTOMER_ID_MAX else "",
            note,
            "PAYPAL",
        )
        for row in mine
    ]
    return _csv(None, lines), currency


def wise_csv(payout: Mapping[str, Any], currency: str | None = None) -> bytes:
    """The Wise batch payments file ("Send by email" template) of the batch: every Wise row, or
    those in `currency`. Each partner is paid in the lines' currency (a batch lists a payee
    whose details name another under `not_paid`)."""
    if currency is not None and not pays("wise", currency):
        raise CurrencyNotPaid("wise", currency)
    reference = f"Payout {payout['number']}"[:REFERENCE_MAX]
    lines = []
    for row in paid_by(payout, "wise"):
        if currency is not None and row["currency"] != currency:
            continue
        lines.append(
            (
                row["payout_name"],
                row["payout_email"],
                reference,
                "PERSON",
                "target",
                _decimal(row["amount"], row["currency"], "wise"),
                row["currency"].upper(),
                (row.get("payout_currency") or row["currency"]).upper(),
            )
        )
    return _csv(WISE_HEADER, lines)
