"""Connect webhook deliveries (CONTRACT section 5): verify, parse, route, then append.

The signature is checked before anything else; a delivery that fails it is never stored, but
leaves a tracking-log line when its unverified `account`/metadata routes to a program, so a brand
debugging its setup sees the refusals: a bounded note (`ingest/refusals.py`: which check failed,
the body's size and sha256, never its text), and only while the sender's address is within its
refusal rate (the `refused` hook; over it, a 429 and nothing written). A verified delivery is appended
verbatim, whatever it holds: a repeated event id as `duplicate`, an event matching no program as
`unroutable` (program NULL), anything else as `accepted`. The duplicate check runs inside the
writer operation, so two concurrent deliveries of one event cannot both be accepted.

A delivery with an amount or a time out of bounds (`ingest/domain/bounds.py`) is `unusable`: stored
verbatim with those typed fields NULL (routed to its program when it has one, with a
tracking-log line), claiming no idempotency key, so each retry of it is stored as unusable again;
it is answered 422 `validation_error` naming the payload paths, with `"stored": true`. The
reconciler reads only accepted rows, so an unusable one never becomes a sale.

A live processor sale claims the ids it is known by (invoice, payment intent, checkout session,
charge) for its program, so a later self-hosted `track/sale` with one of them is a 409. An id a
self-hosted sale already claimed is left as it is: the processor's event is never refused, and
the reconciler reports the double count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ingest.domain.bounds import UNSTORABLE, unstorable
from ingest.domain.errors import InvalidJson, InvalidSignature, TallyError, ValidationFailed
from ingest.domain.events import KNOWN_EVENTS
from ingest.domain.keys import EVENT_KEY_SPACE, PROCESSOR_ID_FIELDS, processor_sale_keys, sale_claims
from ingest.domain.records import Program
from ingest.refusals import note
from ingest.storage.contract import Needs, Store, Tx
from ingest.stripe import Problems, extract, parse_event, read, verify_signature
from ingest.writer import Writer

ENDPOINT = "webhooks/stripe"
CHECKLIST_STEP = "processor_event_received"


@dataclass(frozen=True)
class Delivery:
    """One POST to the webhook: the raw body and what the request said about it."""

    body: bytes
    signature: str | None  # the Stripe-Signature header
    headers: str  # JSON object of the headers kept with the raw row
    received_at: datetime
    request_id: str | None
    content_type: str | None = None  # for a refusal's note: its media type, if well formed
    header_names: tuple[str, ...] = ()  # for a refusal's note: the known ones it names


@dataclass(frozen=True)
class Verifier:
    """The signing secrets (any may match, so they can be rolled) and the timestamp tolerance."""

    secrets: Sequence[str]
    tolerance_seconds: int


def route(store: Store, fields: Mapping[str, Any]) -> Program | None:
    """The program a delivery belongs to, or None when it is unroutable.

    The Connect `account` selects the programs connected to it; when several share it, the
    metadata `program_id` must name one of them. Without an account, the metadata `program_id`
    alone routes, if that program exists.
    """
    account = fields.get("stripe_account")
    meta_program = fields.get("meta_program_id")
    if isinstance(account, str):
        candidates = store.programs_for_stripe_account(account)
        if len(candidates) == 1:
            return candidates[0]
        return next((p for p in candidates if p.program_id == meta_program), None)
    if isinstance(meta_program, str):
        return store.program(meta_program)
    return None


async def receive(
    store: Store,
    writer: Writer,
    verifier: Verifier,
    delivery: Delivery,
    refused: Callable[[TallyError], None] | None = None,
) -> dict[str, Any]:
    """Verify, parse and append one delivery; return the response `data`.

    Raises `InvalidSignature` (nothing stored but a bounded log line), `InvalidJson` (signed,
    but not a JSON object) or, once it is stored as unusable, `ValidationFailed` (a value out of
    bounds). `refused` is called before a refusal is looked at further: it may raise instead
    (`RateLimited`, the sender's refusals over their rate), and then nothing is written.
    """
    try:
        verify_signature(
            delivery.body,
            delivery.signature,
            verifier.secrets,
            verifier.tolerance_seconds,
            delivery.received_at,
        )
    except InvalidSignature as exc:
        if refused is not None:
            refused(exc)
        await _log_refusal(store, writer, delivery, exc)
        raise
    try:
        text = delivery.body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJson("webhook body is not UTF-8 text") from None
    event = parse_event(delivery.body)
    if unstorable(event):  # a NUL (`\u0000`) anywhere: no backend can store it (issue 48)
        raise ValidationFailed(
            f"webhook body {UNSTORABLE}", fields=[{"field": "body", "message": UNSTORABLE}]
        )
    fields, problems = read(event)
    program = route(store, fields)
    event_id = fields["event_id"]
    if problems:
        await _store_unusable(writer, delivery, text, fields, program, problems)
        paths = ", ".join(p["field"] for p in problems)
        error = ValidationFailed(
            f"event {event_id or '(no id)'} was stored but is unusable: {paths} out of bounds",
            fields=list(problems),
            stored=True,
        )
        error.logged = True
        raise error

    def op(tx: Tx) -> bool:
        program_id = program.program_id if program else None
        row = {
            **fields,
            "received_at": delivery.received_at,
            "source": "stripe",
            "kind": "stripe",
            "program_id": program_id,
            "outcome": "accepted" if program else "unroutable",
            "body": text,
            "headers": delivery.headers,
        }
        # The event id's claim decides whether this is a retry: the write's own result (another
        # replica taking the same id at the same moment included), not a read before it.
        mark = tx.mark()
        seq = tx.append(row)
        duplicate = isinstance(event_id, str) and not tx.claim_keys(EVENT_KEY_SPACE, [event_id], seq)
        if duplicate:
            if not tx.release(mark):
                raise RuntimeError("a refused claim's writes could not be dropped")
            seq = tx.append({**row, "outcome": "duplicate"})
        if program_id is None:
            return duplicate
        if not duplicate:
            sale_keys = processor_sale_keys(fields)
            tx.claim_keys(program_id, sale_claims(sale_keys), seq)
            tx.check(program_id, CHECKLIST_STEP, delivery.received_at)
            if sale_keys:  # a live processor sale completes the checklist's sale step as well
                tx.check(program_id, "sale_received", delivery.received_at)
        label = "duplicate" if duplicate else "test_mode" if fields["test_mode"] else "accepted"
        tx.log(
            program_id,
            delivery.received_at,
            ENDPOINT,
            200,
            label,
            _detail(fields, duplicate),
            delivery.request_id,
            seq,
        )
        return duplicate

    duplicate = await writer.run(op, needs=_needs(fields, program))
    if duplicate:
        return {"received": True, "duplicate": True}
    if program is None:
        return {"received": True, "routed": False}
    return {
        "received": True,
        "event_id": event_id,
        "program_id": program.program_id,
        "duplicate": False,
        "test_mode": fields["test_mode"],
    }


def _needs(fields: Mapping[str, Any], program: Program | None) -> Needs:
    """What a delivery's operation claims and looks up: its event id, and the ids of the sale
    it is (or refunds) in its program."""
    event_id = fields.get("event_id")
    if not isinstance(event_id, str):
        return Needs()
    claims = [(EVENT_KEY_SPACE, event_id)]
    sales: list[tuple[str, str]] = []
    if program is not None:
        pid = program.program_id
        claims += [(pid, key) for key in sale_claims(processor_sale_keys(fields))]
        ids = (fields.get(name) for name in (*PROCESSOR_ID_FIELDS, "transaction_id"))
        sales = [(pid, key) for key in ids if isinstance(key, str)]
    return Needs(claims=tuple(claims), sales=tuple(sales), events=(event_id,))


async def _store_unusable(
    writer: Writer,
    delivery: Delivery,
    text: str,
    fields: Mapping[str, Any],
    program: Program | None,
    problems: Problems,
) -> None:
    """Append a delivery holding values out of bounds as `unusable`: no key claimed, no step."""
    program_id = program.program_id if program else None
    paths = ", ".join(p["field"] for p in problems)

    def op(tx: Tx) -> None:
        row = {
            **fields,
            "received_at": delivery.received_at,
            "source": "stripe",
            "kind": "stripe",
            "program_id": program_id,
            "outcome": "unusable",
            "body": text,
            "headers": delivery.headers,
        }
        seq = tx.append(row)
        if program_id is not None:
            detail = f"{fields['event_type'] or 'event'} {fields['event_id'] or '(no id)'} unusable: "
            detail += f"{paths} out of bounds"
            at, request_id = delivery.received_at, delivery.request_id
            tx.log(program_id, at, ENDPOINT, 422, "unusable", detail, request_id, seq)

    await writer.run(op)


def _detail(fields: Mapping[str, Any], duplicate: bool) -> str:
    parts = [str(fields["event_type"] or "event"), str(fields["event_id"] or "(no id)")]
    if isinstance(fields.get("amount"), int) and fields.get("currency"):
        parts.append(f"{fields['amount']} {fields['currency']}")
    if fields["test_mode"]:
        parts.append("(test mode)")
    if duplicate:
        parts.append("(event id already received)")
    return " ".join(parts)


async def _log_refusal(store: Store, writer: Writer, delivery: Delivery, error: TallyError) -> None:
    """A refused delivery whose unverified payload names a program leaves a log line: a bounded
    note of the refusal, nothing the sender wrote (the event type only when it is one we read)."""
    try:
        fields = extract(parse_event(delivery.body))
    except InvalidJson:
        return
    program = route(store, fields)
    if program is None:
        return
    pid = program.program_id
    event_type = fields["event_type"]
    check = f"{error.code}: {error.check}" if error.check else error.code
    detail = note(
        check,
        delivery.body,
        delivery.content_type,
        delivery.header_names,
        event=event_type if event_type in KNOWN_EVENTS else None,
    )

    def op(tx: Tx) -> None:
        at, request_id = delivery.received_at, delivery.request_id
        tx.log(pid, at, ENDPOINT, error.status, error.code, detail, request_id, None)

    await writer.run(op)
