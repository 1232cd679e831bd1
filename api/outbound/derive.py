"""Events from the reconciler's published tables (CONTRACT section 13), after every run.

The reconciler's tables are a pure function of the raw log (its bookings included), so what
they say about a sale, a commission line or a payout batch is a fact of the log. The deriver
compares them with what it saw last (`webhook_marks`, ingest/webhooks_out/marks.py: per sale its
partner and refunded amount, per line its status, per batch its status, for the programs that
have an endpoint) and each difference is an event:

| change | event |
|---|---|
| a sale appears | `sale.created` (and `sale.refunded` when it is refunded already) |
| its partner changes | `sale.attributed` (`previous_partner_code`) |
| its refunded amount grows | `sale.refunded` |
| a `commission` line appears | `commission.created` |
| an `adjustment` or `clawback` line appears | `commission.adjusted` |
| a line becomes `approved` | `commission.approved` |
| a line becomes `void`, or a pending line goes (its sale changed partner first) | `commission.voided` |
| a payout batch appears / is paid | `payout.created` / `payout.paid` |

An event's data has the fields of the API's read of the same object (a sale as
`GET .../sales` gives it, a line as `GET .../commissions`, a batch as `GET .../payouts/{id}`).

Exactly once in the outbox, whatever runs it: it runs under the reconcile run lock (one replica
at a time), compares and records the marks and puts the events in the outbox in one
transaction (a crash before the commit leaves the marks as they were, so the next run finds the
same changes), and an event's id is derived from the change it reports
(ingest/webhooks_out/events.py), so an event made twice is kept once. A program's marks are
taken when its first endpoint is made (marks.py `baseline`): an endpoint gets the changes that
happen after it is made, as Stripe's and Svix's do; a program whose endpoints are all disabled
only has its marks brought up to date.

`api_key.rotation_required` comes from the key's rotation flag (`rotations`), checked after
every run and by the delivery worker every few seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ingest.domain.clock import utcnow
from ingest.storage.contract import Store
from ingest.storage.sql import Executor
from ingest.webhooks_out import events as ev
from ingest.webhooks_out import marks, outbox
from reports import payouts, reads

log = logging.getLogger("tally.webhooks")


_PAID_SALE = (
    "CASE WHEN t.commission_status IN ('pending', 'approved') AND EXISTS (SELECT 1 FROM rc_commissions c"
    " WHERE c.program_id = t.program_id AND c.sale_id = t.sale_id AND c.kind = 'commission'"
    " AND c.status = 'paid') THEN 'paid' ELSE t.commission_status END"
)
# The data an event carries, by kind: (name, SQL expression over the table as `t`). A sale's are
# the fields of `GET .../sales` (reports/reads.py `SALE_FIELDS`, `commission_status` paid as there).
SALE_DATA = tuple((f, _PAID_SALE if f == "commission_status" else f"t.{f}") for f in reads.SALE_FIELDS)
# The fields of `GET .../commissions` (reports/reads.py `commissions`), in its order.
LINE_DATA = (
    ("transaction_id", "t.transaction_id"),
    ("sale_id", "t.sale_id"),
    ("partner_code", "t.partner_code"),
    ("amount", "t.amount"),
    ("gross", "t.amount + t.reversed"),
    ("reversed", "t.reversed"),
    ("platform_fee", "t.platform_fee"),
    ("currency", "t.currency"),
    ("status", "t.status"),
    ("period", "t.period"),
    ("sale_period", "t.sale_period"),
    ("kind", "t.kind"),
    ("adjusts", "t.adjusts"),
    ("cause", "t.cause"),
    ("payout_id", "t.payout_id"),
    ("self_referral", "t.self_referral"),
    ("available_at", "t.available_at"),
    ("dated_at", "t.dated_at"),
    ("booked", "t.booked_seq IS NOT NULL"),
    ("status_reason", "t.status_reason"),
    ("status_by", "t.status_by"),
    ("_booked_seq", "t.booked_seq"),  # the log row that booked the line's current state
)
# A batch's event carries the batch as `GET .../payouts/{payout_id}` gives it (`_payout_events`).
PAYOUT_DATA = (
    ("payout_id", "t.payout_id"),
    ("status", "t.status"),
    ("created_at", "t.created_at"),
    ("paid_at", "t.paid_at"),
)
DATA = {marks.SALES.name: SALE_DATA, marks.LINES.name: LINE_DATA, marks.PAYOUTS.name: PAYOUT_DATA}
SEP = marks.SEP

# Events of one pass go out in this order of their objects' times, then of type.
_RANK = {t: n for n, t in enumerate(ev.EVENT_TYPES)}


def _in(count: int) -> str:
    return ", ".join("?" * count)


@dataclass(frozen=True)
class Change:
    """One object whose marks differ from what its table says now."""

    program_id: str
    key: str
    fresh: bool
    old_state: str | None
    old_amount: int | None
    version: int  # after this change
    data: dict[str, Any]

    @property
    def state_changed(self) -> bool:
        return not self.fresh and self.old_state != self.data_state

    @property
    def data_state(self) -> Any:
        return self.data.get("_state")


def changes(db: Executor, kind: marks.Kind, program_ids: Sequence[str]) -> list[Change]:
    """The objects of `program_ids` that are new or changed since their marks, with their data."""
    if not program_ids:
        return []
    fields = DATA[kind.name]
    names = [name for name, _ in fields]
    sql = (
        f"SELECT t.program_id, {kind.key}, m.object_key IS NULL, m.state, m.amount, m.version,"
        f" {kind.state}, {kind.amount}, {', '.join(expr for _, expr in fields)}"
        + marks.join(kind)
        + f" WHERE t.program_id IN ({_in(len(program_ids))}) AND"
        + marks.changed(kind)
    )
    found = []
    for row in db.rows(sql, list(program_ids)):
        program_id, key, fresh, old_state, old_amount, old_version, state = row[:7]
        data = dict(zip(names, row[8:], strict=True))
        data["_state"] = state
        version = 0 if fresh else int(old_version) + (1 if old_state != state else 0)
        found.append(Change(str(program_id), str(key), bool(fresh), old_state, old_amount, version, data))
    return found


def vanished(
    db: Executor, kind: marks.Kind, program_ids: Sequence[str]
) -> list[tuple[str, str, str | None, int]]:
    """(program, key, last state, version) of the marked objects of `program_ids` no longer in
    the table."""
    if not program_ids:
        return []
    rows = db.rows(
        "SELECT m.program_id, m.object_key, m.state, m.version FROM webhook_marks m"
        f" WHERE m.kind = '{kind.name}' AND m.program_id IN ({_in(len(program_ids))}) AND NOT EXISTS"
        f" (SELECT 1 FROM {kind.table} t WHERE t.program_id = m.program_id AND {kind.key} = m.object_key)",
        list(program_ids),
    )
    return [(str(r[0]), str(r[1]), r[2], int(r[3])) for r in rows]


@dataclass
class Pending:
    """Events of one pass, before they are put in order."""

    items: list[tuple[tuple[Any, ...], str, str, str, dict[str, Any]]]

    def add(
        self, when: Any, event_type: str, program_id: str, key: str, version: object, data: dict[str, Any]
    ) -> None:
        event_id = ev.event_id(event_type, program_id, key, version)
        self.items.append(
            ((when is None, when, _RANK[event_type], event_id), event_type, program_id, event_id, data)
        )


def _clean(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if not k.startswith("_")}


def _sale_events(found: list[Change], out: Pending) -> None:
    for c in found:
        data = _clean(c.data)
        when = data.get("occurred_at")
        refunded = int(data.get("refunded") or 0)
        if c.fresh:
            out.add(when, ev.SALE_CREATED, c.program_id, c.key, "", data)
        elif c.state_changed:
            out.add(
                when,
                ev.SALE_ATTRIBUTED,
                c.program_id,
                c.key,
                c.version,
                {**data, "previous_partner_code": c.old_state},
            )
        if refunded > int(c.old_amount or 0):
            out.add(when, ev.SALE_REFUNDED, c.program_id, c.key, refunded, data)


def _line_events(
    found: list[Change], gone: list[tuple[str, str, str | None, int]], db: Executor, out: Pending
) -> None:
    for c in found:
        data = _clean(c.data)
        when = data.get("dated_at")
        if c.fresh:
            created = ev.COMMISSION_CREATED if data["kind"] == "commission" else ev.COMMISSION_ADJUSTED
            out.add(when, created, c.program_id, c.key, "", data)
        if c.fresh or c.state_changed:
            # approving and voiding a line are bookings, rows of the log: the booking names the change
            booked = c.data.get("_booked_seq")
            version = f"booked {booked}" if booked is not None else c.version
            if data["status"] == "approved":
                out.add(when, ev.COMMISSION_APPROVED, c.program_id, c.key, version, data)
            elif data["status"] == "void":
                out.add(when, ev.COMMISSION_VOIDED, c.program_id, c.key, version, data)
    gone = [g for g in gone if g[2] != "void"]
    if not gone:
        return
    sales = {(g[0], g[1].split(SEP)[0]) for g in gone}
    transactions: dict[tuple[str, str], str] = {}
    for program_id in {p for p, _ in sales}:
        ids = sorted(s for p, s in sales if p == program_id)
        for sale_id, txn in db.rows(
            "SELECT sale_id, transaction_id FROM rc_sales WHERE program_id = ?"
            f" AND sale_id IN ({_in(len(ids))})",
            [program_id, *ids],
        ):
            transactions[(program_id, str(sale_id))] = str(txn)
    for program_id, key, _, version in gone:
        parts = key.split(SEP)
        sale_id, partner, kind, period = parts[0], parts[1], parts[2], parts[-1]
        cause = SEP.join(parts[3:-1]) or None
        data = {
            "transaction_id": transactions.get((program_id, sale_id)),
            "sale_id": sale_id,
            "partner_code": partner,
            "amount": 0,
            "status": "void",
            "period": period or None,
            "kind": kind,
            "cause": cause,
            "status_reason": "the sale's attribution changed before this line was booked",
        }
        out.add(None, ev.COMMISSION_VOIDED, program_id, key, version + 1, data)


class Deriver:
    """Puts the events of the latest reconcile run in the outbox (see the module docstring)."""

    def __init__(
        self, store: Store, clock: Callable[[], datetime] = utcnow, on_new: Callable[[], object] | None = None
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_new = on_new  # deliveries were made: wake the worker

    def after_run(self) -> None:
        """The reconcile job's hook (api/jobs.py `after_run`): never fails the run; a pass that
        fails leaves the marks as they were, so the next run makes the same events."""
        try:
            self.derive()
        except Exception:
            log.exception("webhook events could not be derived from this run (the next run tries again)")
        try:
            self.rotations()
        except Exception:
            log.exception("api_key.rotation_required events could not be derived")

    def derive(self) -> int:
        """One pass over the published tables; the deliveries it made."""
        now = self._clock()
        with self._store.outbox() as db:
            takers = outbox.enabled_endpoints(db)
            with outbox.transaction(db):
                present = marks.tables(db)
                kept = marks.watched(db)
                subscribed = sorted(set(takers) & set(kept))
                out = Pending([])
                if marks.SALES.table in present:
                    _sale_events(changes(db, marks.SALES, subscribed), out)
                if marks.LINES.table in present:
                    found = changes(db, marks.LINES, subscribed)
                    gone = vanished(db, marks.LINES, subscribed)
                    _line_events(found, gone, db, out)
                if marks.PAYOUTS.table in present:
                    self._payout_events(changes(db, marks.PAYOUTS, subscribed), out)
                for kind in marks.KINDS:
                    if kind.table in present:
                        marks.remark(db, kind, kept)
                made = outbox.emit(db, self._ordered(out, now), takers, now)
        if made and self._on_new is not None:
            self._on_new()
        return made

    def _payout_events(self, found: list[Change], out: Pending) -> None:
        if not found:
            return
        views: dict[tuple[str, str], dict[str, Any]] = {}
        with self._store.reader() as reader:
            for program_id in {c.program_id for c in found}:
                partners = {p.code: p for p in self._store.partners(program_id)}
                for batch in payouts.batches(reader, program_id, partners):
                    views[(program_id, str(batch["payout_id"]))] = batch
        for c in found:
            data = views.get((c.program_id, c.key)) or _clean(c.data)
            if c.fresh:
                out.add(c.data.get("created_at"), ev.PAYOUT_CREATED, c.program_id, c.key, "", data)
            if (c.fresh or c.state_changed) and c.data.get("status") == "paid":
                out.add(c.data.get("paid_at"), ev.PAYOUT_PAID, c.program_id, c.key, "", data)

    @staticmethod
    def _ordered(out: Pending, now: datetime) -> list[outbox.Event]:
        made = []
        for _, event_type, program_id, event_id, data in sorted(out.items, key=lambda item: item[0]):
            body = ev.body(event_id, event_type, now, program_id, data)
            made.append(outbox.Event(event_id, event_type, program_id, now, body))
        return made

    def rotations(self) -> int:
        """`api_key.rotation_required` for every program whose key is flagged and whose endpoints
        take it (one event per flag: its id is the flag's time and deadline)."""
        now = self._clock()
        with self._store.outbox() as db:
            takers = outbox.enabled_endpoints(db)
        found: list[outbox.Event] = []
        for program_id, endpoints in sorted(takers.items()):
            if not any(ev.KEY_ROTATION_REQUIRED in e["events"] for e in endpoints):
                continue
            cred = self._store.program_credential(program_id)
            if cred is None or cred.rotation_deadline is None or cred.flagged_at is None:
                continue
            version = f"{cred.flagged_at.isoformat()}/{cred.rotation_deadline.isoformat()}"
            event_id = ev.event_id(ev.KEY_ROTATION_REQUIRED, program_id, cred.masked, version)
            data = {
                "program_id": program_id,
                "api_token_masked": cred.masked,
                "flagged_at": cred.flagged_at,
                "deadline": cred.rotation_deadline,
            }
            body = ev.body(event_id, ev.KEY_ROTATION_REQUIRED, now, program_id, data)
            found.append(outbox.Event(event_id, ev.KEY_ROTATION_REQUIRED, program_id, now, body))
        if not found:
            return 0
        with self._store.outbox() as db, outbox.transaction(db):
            made = outbox.emit(db, found, takers, now)
        if made and self._on_new is not None:
            self._on_new()
        return made
