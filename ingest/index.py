"""In-memory indexes of the control plane and of what ingest must check on the hot path.

Valid because one process owns the embedded database and every write goes through its single
writer: the writer updates the index in the same step as the database, and rolls the index back
when a transaction fails (`Undo`). Rebuilt from the database (raw log included) at start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from ingest.records import Binding, Credential, Partner, Program, Role, SaleLedger

Undo = list[Callable[[], None]]
K = TypeVar("K")
V = TypeVar("V")


def _set_item(mapping: dict[K, V], key: K, value: V, undo: Undo) -> None:
    if key in mapping:
        old = mapping[key]
        undo.append(lambda: mapping.__setitem__(key, old))
    else:
        undo.append(lambda: _discard(mapping, key))
    mapping[key] = value


def _discard(mapping: dict[K, V], key: K) -> None:
    mapping.pop(key, None)


@dataclass
class Index:
    credentials: dict[str, Credential] = field(default_factory=dict)
    programs: dict[str, Program] = field(default_factory=dict)
    partners: dict[tuple[str, str], Partner] = field(default_factory=dict)
    roles: dict[tuple[str, str], Role] = field(default_factory=dict)
    clicks: dict[tuple[str, str], str] = field(default_factory=dict)
    bindings: dict[tuple[str, str], Binding] = field(default_factory=dict)
    provisional: dict[tuple[str, str], str | None] = field(default_factory=dict)
    sales: dict[tuple[str, str], SaleLedger] = field(default_factory=dict)
    refunds: set[tuple[str, str]] = field(default_factory=set)
    checklist: dict[tuple[str, str], datetime] = field(default_factory=dict)
    events: set[str] = field(default_factory=set)
    keys: set[tuple[str, str]] = field(default_factory=set)

    # -- writes (each records how to undo itself) ------------------------------------------
    def put_credential(self, cred: Credential, undo: Undo) -> None:
        if cred.revoked_at is not None:
            if cred.token_hash in self.credentials:
                old = self.credentials.pop(cred.token_hash)
                undo.append(lambda: self.credentials.__setitem__(old.token_hash, old))
            return
        _set_item(self.credentials, cred.token_hash, cred, undo)

    def put_program(self, program: Program, undo: Undo) -> None:
        _set_item(self.programs, program.program_id, program, undo)

    def put_partner(self, partner: Partner, undo: Undo) -> None:
        _set_item(self.partners, (partner.program_id, partner.code), partner, undo)

    def put_role(self, workspace_id: str, account_id: str, role: Role, undo: Undo) -> None:
        _set_item(self.roles, (workspace_id, account_id), role, undo)

    def put_click(self, program_id: str, click_id: str, partner_code: str, undo: Undo) -> None:
        _set_item(self.clicks, (program_id, click_id), partner_code, undo)

    def put_binding(self, program_id: str, customer: str, binding: Binding, undo: Undo) -> None:
        _set_item(self.bindings, (program_id, customer), binding, undo)

    def put_provisional(self, program_id: str, customer: str, click_id: str | None, undo: Undo) -> None:
        _set_item(self.provisional, (program_id, customer), click_id, undo)

    def put_sale(self, program_id: str, keys: list[str], ledger: SaleLedger, undo: Undo) -> None:
        for key in keys:
            if (program_id, key) not in self.sales:
                _set_item(self.sales, (program_id, key), ledger, undo)

    def put_refund(
        self, program_id: str, refund_id: str, ledger: SaleLedger | None, amount: int, undo: Undo
    ) -> None:
        entry = (program_id, refund_id)
        self.refunds.add(entry)
        undo.append(lambda: self.refunds.discard(entry))
        if ledger is not None:
            before = ledger.refunded
            ledger.refunded += amount
            ledger.refund_ids.add(refund_id)

            def restore() -> None:
                ledger.refunded = before
                ledger.refund_ids.discard(refund_id)

            undo.append(restore)

    def set_refunded_at_least(self, ledger: SaleLedger, cumulative: int, undo: Undo) -> None:
        before = ledger.refunded
        if cumulative > before:
            ledger.refunded = cumulative
            undo.append(lambda: setattr(ledger, "refunded", before))

    def put_checklist(self, program_id: str, step: str, at: datetime, undo: Undo) -> bool:
        if (program_id, step) in self.checklist:
            return False
        _set_item(self.checklist, (program_id, step), at, undo)
        return True

    def claim(self, program_id: str, key: str, undo: Undo) -> bool:
        entry = (program_id, key)
        if entry in self.keys:
            return False
        self.keys.add(entry)
        undo.append(lambda: self.keys.discard(entry))
        return True

    def sale_for(self, program_id: str, keys: list[str]) -> SaleLedger | None:
        for key in keys:
            ledger = self.sales.get((program_id, key))
            if ledger is not None:
                return ledger
        return None

    # -- the raw log, replayed: one code path for live ingest and for rebuilding at start ----
    def observe(self, row: dict[str, object], undo: Undo) -> None:
        """Update the hot-path indexes for one accepted raw-log row."""
        if row.get("outcome") in ("duplicate", "unusable"):
            return
        kind = row["kind"]
        program_id = row.get("program_id")
        if kind == "stripe":
            event_id = row.get("event_id")
            if isinstance(event_id, str) and event_id not in self.events:
                self.events.add(event_id)
                undo.append(lambda: self.events.discard(event_id))
        if not isinstance(program_id, str):
            return
        if kind == "click":
            self.put_click(program_id, str(row["click_id"]), str(row["partner_code"]), undo)
        elif kind == "lead":
            self._observe_lead(program_id, row, undo)
        elif kind == "sale" and not row.get("test_mode"):
            self._observe_sale(program_id, row, [row.get("transaction_id")], undo)
        elif kind == "refund":
            ledger = self.sale_for(program_id, [str(row.get("transaction_id"))])
            amount = row.get("amount")
            self.put_refund(
                program_id,
                str(row["refund_id"]),
                ledger,
                amount if isinstance(amount, int) else 0,
                undo,
            )
        elif kind == "stripe" and not row.get("test_mode"):
            self._observe_processor(program_id, row, undo)

    def _observe_lead(self, program_id: str, row: dict[str, object], undo: Undo) -> None:
        customer = str(row["customer_key"])
        click_id = row.get("click_id")
        click = click_id if isinstance(click_id, str) else None
        key = (program_id, customer)
        if row.get("lead_status") == "settled":
            if key not in self.bindings:
                partner = self.clicks.get((program_id, click)) if click else None
                self.put_binding(program_id, customer, Binding(str(row["event_id"]), click, partner), undo)
            if key in self.provisional:
                old = self.provisional.pop(key)
                undo.append(lambda: self.provisional.__setitem__(key, old))
        elif key not in self.bindings and key not in self.provisional:
            self.put_provisional(program_id, customer, click, undo)

    def _observe_sale(self, program_id: str, row: dict[str, object], ids: list[object], undo: Undo) -> None:
        keys = [k for k in ids if isinstance(k, str) and k]
        if not keys:
            return
        amount = row.get("amount")
        currency = row.get("currency")
        ledger = self.sale_for(program_id, keys) or SaleLedger(
            amount if isinstance(amount, int) else None,
            currency if isinstance(currency, str) else None,
        )
        self.put_sale(program_id, keys, ledger, undo)

    def _observe_processor(self, program_id: str, row: dict[str, object], undo: Undo) -> None:
        keys = processor_sale_keys(row)
        if keys:
            self._observe_sale(program_id, row, list(keys), undo)
        elif row.get("event_type") == "charge.refunded" and isinstance(amount := row.get("amount"), int):
            ids = [row.get(name) for name in (*PROCESSOR_ID_FIELDS, "transaction_id")]
            ledger = self.sale_for(program_id, [k for k in ids if isinstance(k, str)])
            if ledger is not None:
                self.set_refunded_at_least(ledger, amount, undo)


PROCESSOR_SALE_TYPES = frozenset(
    {
        "checkout.session.completed",
        "checkout.session.async_payment_succeeded",
        "invoice.payment_succeeded",
        "invoice.paid",
    }
)

PROCESSOR_ID_FIELDS = ("invoice_id", "payment_intent_id", "checkout_session_id", "charge_id")


def processor_sale_keys(fields: Mapping[str, object]) -> list[str]:
    """The ids a live processor sale is known by: none for other events, test events or zero
    amounts. A self-hosted sale with any of these transaction ids is the same sale."""
    amount = fields.get("amount")
    if fields.get("test_mode") or fields.get("event_type") not in PROCESSOR_SALE_TYPES:
        return []
    if not isinstance(amount, int) or amount <= 0:
        return []
    return list(dict.fromkeys(v for name in PROCESSOR_ID_FIELDS if isinstance(v := fields.get(name), str)))
