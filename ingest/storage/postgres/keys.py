"""What ingest decides from, on PostgreSQL: the `key_*` tables (ingest/storage/schema.py
POSTGRES_LOG_DDL).

The effects of ingest/domain/keys.py (the rule the embedded key index applies too), written as
statements on the writer's transaction: each accepted raw row is applied as it is appended, so
the operations after it in the same group commit see it, and a replica that wants a key another
replica's open transaction just wrote waits for that transaction and then sees its outcome (the
database's unique keys and row locks decide, not a read before the write).

Lookups run on any connection: the writer's (inside its transaction, seeing its own writes) or
a pooled one (seeing what was committed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ingest.domain import keys as rule
from ingest.domain.records import Binding, SaleLedger

Cursor = psycopg.Cursor[Any]
# Runs a write whose result nobody reads (the writer queues them: ingest/storage/postgres/store.py).
Write = Callable[[bytes, Any], None]

_ONE_LEDGER = (
    "SELECT l.amount, l.currency, l.refunded FROM key_sales s JOIN key_ledgers l ON l.id = s.ledger"
    " WHERE s.program_id = %s AND s.key = %s"
)
_LEDGER = (
    "SELECT l.amount, l.currency, l.refunded FROM key_sales s JOIN key_ledgers l ON l.id = s.ledger"
    " WHERE s.program_id = %s AND s.key = ANY(%s) ORDER BY array_position(%s, s.key) LIMIT 1"
)


def sale(cur: Cursor, program_id: str, keys: Sequence[str], lock: bool = False) -> SaleLedger | None:
    """The ledger of the sale known by any of `keys` (the first key found wins). With `lock`,
    its row stays locked until the transaction ends, so a refund decided on it cannot race
    another replica's refund of the same sale."""
    wanted = [k for k in keys if k]
    if not wanted:
        return None
    lock_clause = " FOR UPDATE OF l" if lock else ""
    if len(wanted) == 1:  # the usual case, by equality (a plan on the key whatever the value)
        sql = _ONE_LEDGER + lock_clause
        row = cur.execute(sql.encode(), (program_id, wanted[0])).fetchone()
    else:
        row = cur.execute((_LEDGER + lock_clause).encode(), (program_id, wanted, wanted)).fetchone()
    return SaleLedger(row[0], row[1], int(row[2])) if row else None


def click_partner(cur: Cursor, program_id: str, click_id: str) -> str | None:
    row = cur.execute(
        b"SELECT partner_code FROM key_clicks WHERE program_id = %s AND click_id = %s", (program_id, click_id)
    ).fetchone()
    return str(row[0]) if row else None


def binding(cur: Cursor, program_id: str, customer: str) -> Binding | None:
    row = cur.execute(
        b"SELECT lead_event_id, click_id, partner_code FROM key_bindings"
        b" WHERE program_id = %s AND customer = %s",
        (program_id, customer),
    ).fetchone()
    return Binding(row[0], row[1], row[2]) if row else None


def provisional_click(cur: Cursor, program_id: str, customer: str) -> tuple[bool, str | None]:
    row = cur.execute(
        b"SELECT click_id FROM key_provisional WHERE program_id = %s AND customer = %s",
        (program_id, customer),
    ).fetchone()
    return (True, row[0]) if row else (False, None)


def refund_seen(cur: Cursor, program_id: str, refund_id: str) -> bool:
    sql = b"SELECT 1 FROM key_refunds WHERE program_id = %s AND refund_id = %s"
    return cur.execute(sql, (program_id, refund_id)).fetchone() is not None


def event_seen(cur: Cursor, event_id: str) -> bool:
    return cur.execute(b"SELECT 1 FROM key_events WHERE event_id = %s", (event_id,)).fetchone() is not None


def claim(cur: Cursor, program_id: str, keys: Sequence[str]) -> list[str]:
    """Claim idempotency keys; returns those this write claimed, in order. A key another
    replica's open transaction holds makes this wait for it, then come back claimed or not."""
    if not keys:
        return []
    rows = cur.execute(
        b"INSERT INTO key_claims (program_id, key) SELECT %s, k FROM unnest(%s::varchar[]) AS k"
        b" ON CONFLICT DO NOTHING RETURNING key",
        (program_id, list(keys)),
    ).fetchall()
    won = {str(r[0]) for r in rows}
    return [k for k in keys if k in won]


def claim_sale(cur: Cursor, program_id: str, key: str, click_id: str | None, customer: str) -> str | None:
    """`claim` of one sale's key and, in the same statement, the partner of its click or else of
    its customer's binding ('' for none); None when the id was taken."""
    row = cur.execute(
        b"WITH c AS (INSERT INTO key_claims (program_id, key) VALUES (%(p)s, %(k)s)"
        b"   ON CONFLICT DO NOTHING RETURNING key)"
        b" SELECT EXISTS (SELECT 1 FROM c), coalesce("
        b"   (SELECT partner_code FROM key_clicks"
        b"    WHERE program_id = %(p)s AND click_id = %(click)s::varchar),"
        b"   (SELECT partner_code FROM key_bindings WHERE program_id = %(p)s AND customer = %(customer)s))",
        {"p": program_id, "k": key, "click": click_id, "customer": customer},
    ).fetchone()
    if row is None or not row[0]:
        return None
    return str(row[1] or "")


def apply(write: Write, effect: rule.Effect) -> None:
    """One effect of a raw row being appended (`effects`), as ingest/domain/keys.py says it
    changes the tables, as statements sent through `write`."""
    match effect:
        case rule.SeeEvent(event_id):
            write(b"INSERT INTO key_events VALUES (%s) ON CONFLICT DO NOTHING", (event_id,))
        case rule.PutClick(program_id, click_id, partner_code):
            write(
                b"INSERT INTO key_clicks VALUES (%s, %s, %s) ON CONFLICT (program_id, click_id)"
                b" DO UPDATE SET partner_code = EXCLUDED.partner_code",
                (program_id, click_id, partner_code),
            )
        case rule.Bind(program_id, customer, lead_event_id, click):
            write(
                b"INSERT INTO key_bindings SELECT %s, %s, %s, %s::varchar,"
                b" (SELECT partner_code FROM key_clicks WHERE program_id = %s AND click_id = %s::varchar)"
                b" ON CONFLICT DO NOTHING",
                (program_id, customer, lead_event_id, click, program_id, click),
            )
            write(
                b"DELETE FROM key_provisional WHERE program_id = %s AND customer = %s", (program_id, customer)
            )
        case rule.Provisional(program_id, customer, click):
            write(
                b"INSERT INTO key_provisional SELECT %s, %s, %s::varchar WHERE NOT EXISTS"
                b" (SELECT 1 FROM key_bindings WHERE program_id = %s AND customer = %s)"
                b" ON CONFLICT DO NOTHING",
                (program_id, customer, click, program_id, customer),
            )
        case rule.SeeRefund(program_id, refund_id):
            write(b"INSERT INTO key_refunds VALUES (%s, %s) ON CONFLICT DO NOTHING", (program_id, refund_id))
        case rule.AddRefunded(program_id, key, amount):
            write(
                b"UPDATE key_ledgers SET refunded = refunded + %s WHERE id ="
                b" (SELECT ledger FROM key_sales WHERE program_id = %s AND key = %s)",
                (amount, program_id, key),
            )
        case rule.Sale(program_id, keys, amount, currency):
            _sale(write, program_id, keys, amount, currency)
        case rule.ProcessorRefund(program_id, keys, amount, currency):
            write(
                b"WITH found AS (SELECT ledger FROM key_sales WHERE program_id = %(p)s AND key = ANY(%(k)s)"
                b"   ORDER BY array_position(%(k)s, key) LIMIT 1),"
                b" raised AS (UPDATE key_ledgers SET refunded = greatest(refunded, %(a)s)"
                b"   WHERE id = (SELECT ledger FROM found)),"
                b" made AS (INSERT INTO key_ledgers (amount, currency, refunded)"
                b"   SELECT NULL::bigint, %(c)s::varchar, %(a)s WHERE NOT EXISTS (SELECT 1 FROM found)"
                b"   RETURNING id)"
                b" INSERT INTO key_sales (program_id, key, ledger)"
                b" SELECT %(p)s, k, made.id FROM unnest(%(k)s::varchar[]) AS k CROSS JOIN made"
                b" ON CONFLICT DO NOTHING",
                {"p": program_id, "k": list(keys), "a": amount, "c": currency},
            )
        case rule.Link(program_id, invoice, payment):
            _link(write, program_id, invoice, payment)


# A track sale's ledger (one id): `write(ONE_SALE, (program, id, amount, currency))`. The writer
# sends consecutive ones as one `SALES` statement (ingest/storage/postgres/tx.py), in their place among
# the other writes: an id that has a ledger keeps it (taking the sale's amount when it had none:
# a processor refund of it came first), a new one gets one.
ONE_SALE = b"-- one track sale's ledger"
SALES = (
    b"WITH w AS (SELECT DISTINCT ON (p, k) p, k, a, c"
    b"   FROM unnest(%s::varchar[], %s::varchar[], %s::bigint[], %s::varchar[]) AS w(p, k, a, c)),"
    b" filled AS (UPDATE key_ledgers l SET amount = f.a, currency = coalesce(l.currency, f.c)"
    b"   FROM (SELECT x.ledger, w.a, w.c FROM w CROSS JOIN LATERAL (SELECT ledger FROM key_sales s"
    b"     WHERE s.program_id = w.p AND s.key = w.k LIMIT 1) x) f"
    b"   WHERE l.id = f.ledger AND l.amount IS NULL AND f.a IS NOT NULL),"
    b" fresh AS (SELECT w.p, w.k, w.a, w.c, nextval(pg_get_serial_sequence('key_ledgers', 'id')) AS id"
    b"   FROM w LEFT JOIN LATERAL (SELECT 1 AS found FROM key_sales s"
    b"     WHERE s.program_id = w.p AND s.key = w.k LIMIT 1) x ON true WHERE x.found IS NULL),"
    b" made AS (INSERT INTO key_ledgers (id, amount, currency, refunded) SELECT id, a, c, 0 FROM fresh)"
    b" INSERT INTO key_sales (program_id, key, ledger) SELECT p, k, id FROM fresh ON CONFLICT DO NOTHING"
)


def sales(one_sales: Sequence[tuple[str, str, int | None, str | None]]) -> tuple[bytes, Any]:
    """The statement for consecutive `ONE_SALE` writes."""
    return SALES, tuple(list(column) for column in zip(*one_sales, strict=True))


def _sale(
    write: Write, program_id: str, keys: Sequence[str], amount: int | None, currency: str | None
) -> None:
    if len(keys) == 1:  # a track sale: the writer sends consecutive ones as one statement
        write(ONE_SALE, (program_id, keys[0], amount, currency))
        return
    params = {"p": program_id, "k": list(keys), "a": amount, "c": currency}
    if amount is not None:
        write(
            b"UPDATE key_ledgers SET amount = %(a)s, currency = coalesce(currency, %(c)s::varchar)"
            b" WHERE amount IS NULL AND id = (SELECT ledger FROM key_sales"
            b"   WHERE program_id = %(p)s AND key = ANY(%(k)s) ORDER BY array_position(%(k)s, key) LIMIT 1)",
            params,
        )
    write(
        b"WITH found AS (SELECT ledger FROM key_sales WHERE program_id = %(p)s AND key = ANY(%(k)s)"
        b"   ORDER BY array_position(%(k)s, key) LIMIT 1),"
        b" made AS (INSERT INTO key_ledgers (amount, currency, refunded)"
        b"   SELECT %(a)s::bigint, %(c)s::varchar, 0 WHERE NOT EXISTS (SELECT 1 FROM found) RETURNING id)"
        b" INSERT INTO key_sales (program_id, key, ledger)"
        b" SELECT %(p)s, k, coalesce((SELECT ledger FROM found), (SELECT id FROM made))"
        b" FROM unnest(%(k)s::varchar[]) AS k ON CONFLICT DO NOTHING",
        params,
    )


def _link(write: Write, program_id: str, invoice: str, payment: str) -> None:
    """`Link`: when each id has a ledger of its own, the invoice's takes the payment's and the
    payment points at it; then both ids are a sale of no amount (nothing more where they are
    one ledger already)."""
    params = {"p": program_id, "i": invoice, "k": payment}
    write(
        b"UPDATE key_ledgers l SET amount = coalesce(l.amount, g.amount),"
        b" currency = coalesce(l.currency, g.currency), refunded = greatest(l.refunded, g.refunded)"
        b" FROM key_sales si, key_sales sp, key_ledgers g"
        b" WHERE si.program_id = %(p)s AND si.key = %(i)s AND sp.program_id = %(p)s AND sp.key = %(k)s"
        b" AND l.id = si.ledger AND g.id = sp.ledger AND si.ledger <> sp.ledger",
        params,
    )
    write(
        b"UPDATE key_sales SET ledger = i.ledger FROM key_sales i"
        b" WHERE i.program_id = %(p)s AND i.key = %(i)s"
        b" AND key_sales.program_id = %(p)s AND key_sales.key = %(k)s AND key_sales.ledger <> i.ledger",
        params,
    )
    _sale(write, program_id, (invoice, payment), None, None)
