"""What ingest decides from, as rules: the ids a row is known by, the claims it makes, and what an
accepted raw row changes in the key tables (`effects`). Pure: no I/O.

A claim is (program, key): the key is an id tagged with its kind (`sale_claims`, `refund_claim`,
`promo_claims`), so that no id of one kind can take another kind's claim (a sale whose transaction
id is `refund:r77` claims `sale:refund:r77`, not refund `r77`'s `refund:r77`), and each program
claims on its own. A self-hosted sale's transaction id and a processor sale's invoice, payment
and charge ids are one kind on purpose: a self-hosted sale with any of those ids is the same sale.
Processor event ids are claimed untagged under `EVENT_KEY_SPACE`, which holds nothing else.
Claims made before kinds were tagged (sale ids untagged) were tagged by schema migration 10
(ingest/storage/migrations.py), and the embedded key index was rebuilt from the log (format 4).

Both backends keep the same key tables (clicks, customer bindings, provisional leads, sale
ledgers and the ids that point at them, seen refunds and processor events, claims): the embedded
one in its key index (ingest/storage/duckdb/keys.py, SQLite), PostgreSQL in its `key_*` tables
(ingest/storage/postgres/keys.py). Each applies the `Effect`s of every row it appends, in order,
as each effect's docstring says; neither decides which effects a row has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ingest.domain.events import LINK_EVENTS, REFUND_EVENTS, SALE_EVENTS

PROCESSOR_ID_FIELDS = ("invoice_id", "payment_intent_id", "checkout_session_id", "charge_id")
EVENT_KEY_SPACE = "*"  # program id under which processor event ids are claimed


def link_keys(row: Mapping[str, object]) -> tuple[str, str] | None:
    """(invoice id, payment intent or charge id) an `invoice_payment.paid` links, else None."""
    if row.get("event_type") not in LINK_EVENTS:
        return None
    invoice = row.get("invoice_id")
    payment = row.get("payment_intent_id") or row.get("charge_id")
    if isinstance(invoice, str) and isinstance(payment, str) and invoice and payment:
        return invoice, payment
    return None


def processor_sale_keys(fields: Mapping[str, object]) -> list[str]:
    """The ids a live processor sale is known by: none for other events, test events or zero
    amounts. A self-hosted sale with any of these transaction ids is the same sale."""
    amount = fields.get("amount")
    if fields.get("test_mode") or fields.get("event_type") not in SALE_EVENTS:
        return []
    if not isinstance(amount, int) or amount <= 0:
        return []
    return list(dict.fromkeys(v for name in PROCESSOR_ID_FIELDS if isinstance(v := fields.get(name), str)))


SALE_CLAIM = "sale:"  # the tag of a sale's claims (schema migration 10 tags the untagged ones)


def sale_claims(ids: Iterable[str]) -> list[str]:
    """The idempotency keys a sale claims in its program: one per id it is known by (a
    self-hosted sale's transaction id, a processor sale's `processor_sale_keys`: one kind)."""
    return [SALE_CLAIM + i for i in ids]


def sale_claim(transaction_id: str) -> str:
    """The idempotency key a track sale claims in its program."""
    return SALE_CLAIM + transaction_id


def tagged_claim(program_id: str, key: str, kind: object) -> str:
    """A claim made before kinds were tagged, as it is now, by the `kind` of the raw row that
    made it: a sale's or processor sale's in a program is `sale:<id>`; the others were tagged
    already (refunds, promo codes) or are processor event ids (under `EVENT_KEY_SPACE`). Schema
    migration 10 applies the same rule to the database's claims, in SQL."""
    if program_id != EVENT_KEY_SPACE and kind in ("sale", "stripe"):
        return SALE_CLAIM + key
    return key


def refund_claim(refund_id: str) -> str:
    """The idempotency key a track refund claims in its program."""
    return f"refund:{refund_id}"


def promo_code_key(code: str) -> str:
    """A promotion code as customers type it, compared without case and surrounding blanks
    (the reconciler matches codes the same way, reconcile/promos.py)."""
    return code.strip().upper()


def promo_claims(code: str | None, promotion_code_id: str | None) -> list[str]:
    """The idempotency keys a promo-code assignment claims in its program: its code and its
    processor id, each assigned to one partner at most (CONTRACT 14)."""
    keys = [f"promo_code:{promo_code_key(code)}"] if code else []
    return keys + ([f"promotion_code:{promotion_code_id}"] if promotion_code_id else [])


def claims_of(row: Mapping[str, object]) -> list[tuple[str, str]]:
    """The (program, key) claims ingest made when it accepted `row` (ingest/tracking.py,
    ingest/deliveries.py): what a rebuilt index must hold for a claim alone to refuse a
    duplicate."""
    outcome, kind, program = row.get("outcome"), row.get("kind"), row.get("program_id")
    if kind == "stripe" and outcome in ("accepted", "unroutable"):
        event_id = row.get("event_id")
        claims = [(EVENT_KEY_SPACE, event_id)] if isinstance(event_id, str) else []
        if outcome == "accepted" and isinstance(program, str):
            claims += [(program, key) for key in sale_claims(processor_sale_keys(row))]
        return claims
    if outcome != "accepted" or not isinstance(program, str):
        return []
    if kind == "sale" and not row.get("test_mode") and isinstance(txn := row.get("transaction_id"), str):
        return [(program, sale_claim(txn))]
    if kind == "refund" and isinstance(refund := row.get("refund_id"), str):
        return [(program, refund_claim(refund))]
    if kind == "promo_code":
        code, promotion = _text(row.get("promo_code")), _text(row.get("object_id"))
        return [(program, key) for key in promo_claims(code, promotion)]
    return []


# -- what a row changes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SeeEvent:
    """The processor event id is known (kept once)."""

    event_id: str


@dataclass(frozen=True)
class PutClick:
    """The click names its partner (a click id seen again takes the newer partner)."""

    program_id: str
    click_id: str
    partner_code: str


@dataclass(frozen=True)
class Bind:
    """A settled lead: the customer's first settled lead binds it, to the partner its click names
    (None without a click or an unknown one); later ones do not rebind. Its provisional lead, if
    any, is gone either way."""

    program_id: str
    customer: str
    lead_event_id: str
    click_id: str | None


@dataclass(frozen=True)
class Provisional:
    """A lead not settled yet: kept (the first one's click) unless the customer is bound."""

    program_id: str
    customer: str
    click_id: str | None


@dataclass(frozen=True)
class SeeRefund:
    """The track refund id is known in its program (kept once)."""

    program_id: str
    refund_id: str


@dataclass(frozen=True)
class AddRefunded:
    """A track refund: the ledger of the sale known by `key`, if any, has `amount` more refunded."""

    program_id: str
    key: str
    amount: int


@dataclass(frozen=True)
class Sale:
    """Every id of a sale points at one ledger: the one the first of `keys` that has one points
    at, else a new one of `amount`, `currency` and nothing refunded; an id that points at a ledger
    keeps it. A ledger of no amount yet (a refund or a link seen before its sale) takes `amount`,
    and `currency` when it has none."""

    program_id: str
    keys: tuple[str, ...]
    amount: int | None
    currency: str | None


@dataclass(frozen=True)
class ProcessorRefund:
    """A processor refund (cumulative): the ledger of the first of `keys` that has one keeps the
    larger refunded amount; when none has, its sale is not known yet and a ledger of no amount,
    in `currency`, with `amount` refunded, waits under every one of `keys`."""

    program_id: str
    keys: tuple[str, ...]
    amount: int
    currency: str | None


@dataclass(frozen=True)
class Link:
    """An invoice and the payment that paid it become one sale's ids. When each already has its
    own ledger (the payment's refund arrived before the link), the invoice's takes the amount and
    currency it lacks from the payment's, keeps the larger refunded amount, and the payment points
    at it; otherwise they are a `Sale` of both ids and no amount."""

    program_id: str
    invoice: str
    payment: str


Effect = SeeEvent | PutClick | Bind | Provisional | SeeRefund | AddRefunded | Sale | ProcessorRefund | Link


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _ids(values: Iterable[object]) -> tuple[str, ...]:
    """The non-empty string ids among `values`, each once, in order."""
    return tuple(dict.fromkeys(v for v in values if isinstance(v, str) and v))


def _sale(program_id: str, row: Mapping[str, object], ids: Iterable[object]) -> list[Effect]:
    keys = _ids(ids)
    if not keys:
        return []
    amount = row.get("amount")
    return [Sale(program_id, keys, amount if isinstance(amount, int) else None, _text(row.get("currency")))]


def effects(row: Mapping[str, object]) -> list[Effect]:
    """What appending `row` (a raw-log row as stored) changes in the key tables, in order: the one
    rule both backends apply, for live ingest and for catching up with the log alike."""
    if row.get("outcome") in ("duplicate", "unusable"):
        return []
    kind, program_id = row["kind"], row.get("program_id")
    out: list[Effect] = []
    if kind == "stripe" and isinstance(event_id := row.get("event_id"), str):
        out.append(SeeEvent(event_id))
    if not isinstance(program_id, str):
        return out
    if kind == "click":
        out.append(PutClick(program_id, str(row["click_id"]), str(row["partner_code"])))
    elif kind == "lead":
        customer, click = str(row["customer_key"]), _text(row.get("click_id"))
        if row.get("lead_status") == "settled":
            out.append(Bind(program_id, customer, str(row["event_id"]), click))
        else:
            out.append(Provisional(program_id, customer, click))
    elif kind == "sale" and not row.get("test_mode"):
        out += _sale(program_id, row, [row.get("transaction_id")])
    elif kind == "refund":
        out.append(SeeRefund(program_id, str(row["refund_id"])))
        if isinstance(amount := row.get("amount"), int):
            out.append(AddRefunded(program_id, str(row.get("transaction_id")), amount))
    elif kind == "stripe" and not row.get("test_mode"):
        out += _processor(program_id, row)
    return out


def _processor(program_id: str, row: Mapping[str, object]) -> list[Effect]:
    if keys := processor_sale_keys(row):
        return _sale(program_id, row, list(keys))
    if row.get("event_type") in REFUND_EVENTS and isinstance(amount := row.get("amount"), int):
        ids = _ids([row.get(name) for name in (*PROCESSOR_ID_FIELDS, "transaction_id")])
        return [ProcessorRefund(program_id, ids, amount, _text(row.get("currency")))] if ids else []
    if (link := link_keys(row)) is not None:
        return [Link(program_id, *link)]
    return []
