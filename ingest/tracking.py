"""Track calls (click, lead, sale, refund): validate against the control plane, then append to
the raw log through the writer. Each function returns the response `data` and any warnings."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from ingest.domain.errors import (
    DuplicateRefund,
    DuplicateTransaction,
    PartnerNotFound,
    ProgramMismatch,
    ProgramNotFound,
    RefundExceedsSale,
    TallyError,
    ValidationFailed,
)
from ingest.domain.inputs import ClickIn, LeadIn, RefundIn, SaleIn, when
from ingest.domain.keys import refund_claim, sale_claim
from ingest.domain.records import Program
from ingest.domain.tokens import new_id
from ingest.storage.contract import KeyRead, Needs, Store, Tx
from ingest.writer import Writer


class Call(NamedTuple):
    """What every track call carries besides its parsed body."""

    endpoint: str
    received_at: datetime
    body: str
    headers: str
    request_id: str | None


@dataclass
class Outcome:
    data: dict[str, Any]
    warnings: list[dict[str, Any]] = field(default_factory=list)


def _row(call: Call, program_id: str, kind: str, **typed: Any) -> dict[str, Any]:
    return {
        "received_at": call.received_at,
        "source": "track",
        "kind": kind,
        "program_id": program_id,
        "outcome": typed.pop("outcome", "accepted"),
        "event_type": f"track.{kind}",
        "body": call.body,
        "headers": call.headers,
        **typed,
    }


def _log(
    tx: Tx, call: Call, program_id: str, status: int, outcome: str, detail: str, seq: int | None
) -> None:
    tx.log(program_id, call.received_at, call.endpoint, status, outcome, detail, call.request_id, seq)


async def log_refusal(writer: Writer, call: Call, program_id: str, error: TallyError, detail: str) -> None:
    """A refused track call for a known program still leaves a tracking-log line: `detail` is
    the refusal's bounded note (`ingest/refusals.py`), never the body."""

    def op(tx: Tx) -> None:
        _log(tx, call, program_id, error.status, error.code, detail, None)

    await writer.run(op)


def _lost(tx: Tx, mark: object) -> None:
    """Drop what an operation wrote since `mark` because its claim was refused: the key is
    another write's (the operation then records the attempt as a duplicate)."""
    if not tx.release(mark):
        raise RuntimeError("a refused claim's writes could not be dropped")


def _warning(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


# -- click -------------------------------------------------------------------------------------
async def record_click(store: Store, writer: Writer, call: Call, inp: ClickIn) -> Outcome:
    program = store.program(inp.program_id)
    if program is None:
        raise ProgramNotFound(f"program {inp.program_id} does not exist")
    if store.partner(program.program_id, inp.partner_code) is None:
        raise PartnerNotFound(f"partner {inp.partner_code} is not in program {program.program_id}")
    click_id = new_id("clk")

    def op(tx: Tx) -> None:
        seq = tx.append(
            _row(
                call,
                program.program_id,
                "click",
                event_id=click_id,
                click_id=click_id,
                partner_code=inp.partner_code,
                occurred_at=call.received_at,
            )
        )
        _log(
            tx,
            call,
            program.program_id,
            201,
            "accepted",
            f"click {click_id} for {inp.partner_code}",
            seq,
        )
        tx.check(program.program_id, "click_received", call.received_at)

    await writer.run(op)
    return Outcome({"click_id": click_id, "program_id": program.program_id, "partner_code": inp.partner_code})


# -- lead --------------------------------------------------------------------------------------
async def record_lead(
    store: Store,
    writer: Writer,
    call: Call,
    inp: LeadIn,
    keyed_program: Program | None,
    key: KeyRead | None = None,
) -> Outcome:
    """`keyed_program` is the key's program for a server-mode lead (`key` the key as read), None
    for browser mode."""
    if keyed_program is not None:
        if inp.program_id is not None and inp.program_id != keyed_program.program_id:
            raise ProgramMismatch(
                f"body program_id {inp.program_id} is not the key's program {keyed_program.program_id}"
            )
        program = keyed_program
    else:
        if inp.program_id is None:
            raise ValidationFailed(
                "program_id is required for a browser-mode lead",
                fields=[{"field": "program_id", "message": "required without a program key"}],
            )
        found = store.program(inp.program_id)
        if found is None:
            raise ProgramNotFound(f"program {inp.program_id} does not exist")
        program = found
    pid = program.program_id
    provisional = keyed_program is None and program.settings.requires_server_side_leads
    status = "provisional" if provisional else "settled"
    lead_id = new_id("lead")
    customer = inp.customer_external_id

    def op(tx: Tx) -> None:
        click_id = inp.click_id
        if click_id is None and not provisional:
            # Settling a provisional browser lead keeps the click it carried.
            _, click_id = tx.provisional_click(pid, customer)
        seq = tx.append(
            _row(
                call,
                pid,
                "lead",
                event_id=lead_id,
                customer_key=customer,
                email=inp.email,
                click_id=click_id,
                lead_status=status,
                occurred_at=call.received_at,
            )
        )
        mode = "server" if keyed_program is not None else "browser"
        _log(tx, call, pid, 200, "accepted", f"{mode} lead {lead_id} ({status}) for {customer}", seq)
        tx.check(pid, "lead_received", call.received_at)

    clicks = ((pid, inp.click_id),) if inp.click_id is not None else ()
    who = ((pid, customer),)
    await writer.run(op, needs=Needs(clicks=clicks, bindings=who, provisional=who, key=key))
    return Outcome(
        {
            "lead_id": lead_id,
            "customer_external_id": customer,
            "status": status,
            "provisional": provisional,
        }
    )


# -- sale --------------------------------------------------------------------------------------
def _require_real_sale(inp: SaleIn) -> tuple[str, str, int]:
    problems: list[dict[str, str]] = []
    if inp.transaction_id is None:
        problems.append({"field": "transaction_id", "message": "required for a real sale"})
    if inp.customer_external_id is None:
        problems.append({"field": "customer_external_id", "message": "required for a real sale"})
    if inp.amount is None:  # its bounds (1..10^12) are the model's, `ingest.domain.bounds.Amount`
        problems.append({"field": "amount", "message": "required for a real sale"})
    if problems:
        raise ValidationFailed("the sale is not valid", fields=problems)
    assert inp.transaction_id and inp.customer_external_id and inp.amount
    return inp.transaction_id, inp.customer_external_id, inp.amount


async def record_sale(
    store: Store, writer: Writer, call: Call, inp: SaleIn, program: Program, key: KeyRead | None = None
) -> Outcome:
    pid = program.program_id
    sale_id = new_id("sale")
    if inp.test_mode:
        return await _record_test_sale(writer, call, inp, pid, sale_id, key)
    txn, customer, amount = _require_real_sale(inp)
    occurred = when(inp.occurred_at, call.received_at)
    typed = {
        "event_id": sale_id,
        "transaction_id": txn,
        "customer_key": customer,
        "amount": amount,
        "currency": inp.currency,
        "is_recurring": inp.is_recurring,
        "sale_type": inp.sale_type,
        "subscription_id": inp.subscription_id,
        "email": inp.email,
        "click_id": inp.click_id,
        "occurred_at": occurred,
        "promo_code": inp.promo_code,
    }

    def op(tx: Tx) -> str | None:
        # The transaction id's claim decides: a sale recorded before under this id (by a track
        # call, or by the processor under any of its ids) or at this very moment by another
        # replica holds it already.
        mark = tx.mark()
        seq = tx.append(_row(call, pid, "sale", **typed))
        partner = tx.claim_sale(pid, sale_claim(txn), seq, inp.click_id, customer)
        if partner is not None:
            _log(tx, call, pid, 200, "accepted", f"sale {txn} {amount} {inp.currency}", seq)
            tx.check(pid, "sale_received", call.received_at)
            return partner
        _lost(tx, mark)
        seq = tx.append(_row(call, pid, "sale", outcome="duplicate", **typed))
        _log(tx, call, pid, 409, "duplicate_transaction", f"transaction {txn} already recorded", seq)
        return None

    clicks = ((pid, inp.click_id),) if inp.click_id is not None else ()
    needs = Needs(
        claims=((pid, sale_claim(txn)),),
        sales=((pid, txn),),
        clicks=clicks,
        bindings=((pid, customer),),
        key=key,
    )
    partner = await writer.run(op, needs=needs)
    if partner is None:
        dup = DuplicateTransaction(f"transaction {txn} is already recorded for program {pid}")
        dup.logged = True
        raise dup
    data: dict[str, Any] = {
        "sale_id": sale_id,
        "transaction_id": txn,
        "test_mode": False,
        "attributed": bool(partner),
        "partner_code": partner or None,
        "customer_external_id": customer,
        "amount": amount,
        "currency": inp.currency,
    }
    warnings = []
    if not partner:
        promo = (
            f"; the reconciler gives it to the partner promo code {inp.promo_code} is assigned to, if any"
            if inp.promo_code is not None
            else ""
        )
        warnings.append(
            _warning(
                "customer_not_attributed",
                f"customer {customer} has no settled lead or click in program {pid} yet; "
                f"the sale is recorded and will be attributed if data arrives{promo}",
            )
        )
    return Outcome(data, warnings)


async def _record_test_sale(
    writer: Writer, call: Call, inp: SaleIn, pid: str, sale_id: str, key: KeyRead | None
) -> Outcome:
    def op(tx: Tx) -> None:
        seq = tx.append(
            _row(
                call,
                pid,
                "sale",
                event_id=sale_id,
                test_mode=True,
                transaction_id=inp.transaction_id,
                customer_key=inp.customer_external_id,
                amount=inp.amount,
                currency=inp.currency,
                occurred_at=when(inp.occurred_at, call.received_at),
            )
        )
        _log(tx, call, pid, 200, "test_mode", f"test sale {sale_id}", seq)
        tx.check(pid, "test_sale_received", call.received_at)

    await writer.run(op, needs=Needs(key=key) if key is not None else None)
    return Outcome({"sale_id": sale_id, "transaction_id": inp.transaction_id, "test_mode": True})


# -- refund ------------------------------------------------------------------------------------
async def record_refund(
    store: Store, writer: Writer, call: Call, inp: RefundIn, program: Program, key: KeyRead | None = None
) -> Outcome:
    pid = program.program_id
    typed = {
        "event_id": new_id("rfd"),
        "transaction_id": inp.transaction_id,
        "refund_id": inp.refund_id,
        "amount": inp.amount,
        "occurred_at": when(inp.occurred_at, call.received_at),
    }

    def op(tx: Tx) -> tuple[str, bool]:
        # The sale's ledger first: on a shared database that read holds it until the commit, so
        # the checks below see every refund of it that committed before.
        ledger = tx.sale(pid, [inp.transaction_id])
        if not tx.refund_seen(pid, inp.refund_id):
            if ledger is not None and ledger.amount is not None:
                left = ledger.amount - ledger.refunded
                if inp.amount > left:
                    raise RefundExceedsSale(
                        f"refund {inp.refund_id} of {inp.amount} exceeds the {left} left to refund "
                        f"on sale {inp.transaction_id}",
                        remaining=left,
                    )
            mark = tx.mark()
            currency = ledger.currency if ledger else None
            seq = tx.append(_row(call, pid, "refund", currency=currency, **typed))
            if tx.claim_keys(pid, [refund_claim(inp.refund_id)], seq):
                _log(tx, call, pid, 200, "accepted", f"refund {inp.refund_id} of {inp.transaction_id}", seq)
                return "accepted", ledger is not None and ledger.amount is not None
            _lost(tx, mark)  # another process recorded this refund first
        seq = tx.append(_row(call, pid, "refund", outcome="duplicate", **typed))
        _log(tx, call, pid, 409, "duplicate_refund", f"refund {inp.refund_id} already recorded", seq)
        return "duplicate", False

    needs = Needs(
        claims=((pid, refund_claim(inp.refund_id)),),
        sales=((pid, inp.transaction_id),),
        refunds=((pid, inp.refund_id),),
        key=key,
    )
    outcome, known = await writer.run(op, needs=needs)
    if outcome == "duplicate":
        dup_refund = DuplicateRefund(f"refund {inp.refund_id} is already recorded for program {pid}")
        dup_refund.logged = True
        raise dup_refund
    warnings = []
    if not known:
        warnings.append(
            _warning("sale_not_found", f"sale {inp.transaction_id} is not known yet; the refund is kept")
        )
    data = {
        "refund_id": inp.refund_id,
        "transaction_id": inp.transaction_id,
        "amount": inp.amount,
        "sale_found": known,
    }
    return Outcome(data, warnings)
