"""Closures: the part of the log new raw events can change, for incremental runs. Pure.

Every reconcile rule relates rows of the log through a shared value: a click id, customer key,
normalised email, processor customer id, subscription id, or one of the ids a sale, refund or
double count is known by (transaction, invoice, payment intent, checkout session, charge, object
and event ids). Call two rows *linked* when they share such a value; a *component* is a set of
rows closed under links. The reconciler's result is then the union of its results on each
component (plus the program-wide engineer actions, which every component reads), so after new
rows arrive only the components that hold one of them can change:

- reconcile/run/components.py keeps them: each row's component, maintained run by run as rows
  arrive. Values are compared by a 64-bit hash, so a collision can only merge components, never
  leave a row out, and programs are not told apart (the same value in two programs links them
  too): a component may be a little larger than needed, never smaller. Clicks carry only their
  click id, so a click is in the component of its click id and never joins two components.
- `stale_keys` names the materialised rows those components produced in the previous run: a
  sale's id (and so its evidence and commission lines) is one of the values of its own rows, a
  refund row and a double-count row are keyed by the event id of their own row. Every one of
  those values belongs to the closure, and no row outside it carries one (it would be linked).

The caller (reconcile/run/incremental.py) deletes the stale rows and inserts what `reconcile`
computes on the closure: exactly the tables a full run gives (tests/reconcile/test_incremental.py).
That holds for closed months too: the snapshot of a program's log before a close is, again, the
union of its components' snapshots, and a closed month's lines are composed key by key.

Commission status is the only output that changes with `now` alone (`pending` becomes `approved`
when the holding period ends); `refresh_sql` re-derives it in place for the rows no new row
touched.
"""

from __future__ import annotations

import polars as pl

from ingest.storage.partitions import Scope
from reconcile.schema import PROGRAM_DEFAULTS, RAW_IDS, norm_email

# Columns whose values link rows (ids share one namespace: a self-hosted transaction id may be
# a processor invoice id).
LINKS = RAW_IDS
_SEED = 0x7A11


def email_hash(email: pl.Expr) -> pl.Expr:
    """UInt64 hash of the normalised email (schema.norm_email), null where there is none."""
    value = norm_email(email)
    return pl.when(value.is_not_null()).then(value.hash(_SEED))


def stale_keys(reached: pl.DataFrame) -> pl.DataFrame:
    """`value` (String): every link value of the `reached` rows (the closure, new rows
    included). Materialised rows keyed by one of them came from the closure's components."""
    return (
        pl.concat([reached.select(value=pl.col(name).cast(pl.String)) for name in LINKS])
        .drop_nulls()
        .unique()
    )


def refresh_sql(
    now_param: str = "?", dialect: str = "duckdb", forward: bool = False, scope: Scope | None = None
) -> tuple[str, str]:
    """Two UPDATE statements (each taking `now` twice) that set `pending` / `approved` as of
    `now` on every commission line and sale whose status is one of those two. A line's
    `available_at` is stored; a sale's is occurred_at + the holding days of its program's terms
    in force when it occurred (table `_rc_holding(program_id, since, until, holding_days)`,
    reconcile/terms.py `holding`; else schema.PROGRAM_DEFAULTS), in
    microseconds so that no session time zone takes part. `dialect` duckdb or postgresql (the
    published tables of a shared database, ingest/storage/postgres/sink.py). `forward`: `now` is not
    before the time the statuses were last brought up to, so only pending rows can change
    (approval only ever comes with time): the statements visit those alone. `scope`
    (postgresql): only the rows of that partition's programs (ingest/storage/partitions.py),
    whose terms are the only ones in `_rc_holding`."""

    if dialect == "postgresql":
        return _refresh_postgresql(now_param, forward, scope)
    if scope is not None:
        raise ValueError("the embedded database is reconciled whole")
    lines = _refresh_lines(now_param, forward)
    default = int(str(PROGRAM_DEFAULTS["holding_days"]))
    days = (
        "coalesce((SELECT h.holding_days FROM _rc_holding h"
        f" WHERE h.program_id = rc_sales.program_id AND {_in_force('h', 'rc_sales')}), {default})"
    )
    sale = (
        f"CASE WHEN epoch_us({now_param}) >= epoch_us(occurred_at) + {days} * CAST(86400000000 AS BIGINT)"
        " THEN 'approved' ELSE 'pending' END"
    )
    sales = (
        f"UPDATE rc_sales SET commission_status = {sale}"
        f" WHERE commission_status IN {_changeable(forward)} AND commission_status <> {sale}"
    )
    return lines, sales


def _in_force(terms: str, sale: str) -> str:
    """The condition that the `_rc_holding` version `terms` was in force when `sale` occurred."""
    return (
        f"({terms}.since IS NULL OR {sale}.occurred_at > {terms}.since)"
        f" AND ({terms}.until IS NULL OR {sale}.occurred_at <= {terms}.until)"
    )


def _changeable(forward: bool) -> str:
    return "('pending')" if forward else "('pending', 'approved')"


def _refresh_lines(now: str, forward: bool, where: str = "TRUE") -> str:
    """The UPDATE that brings commission lines' pending/approved status up to `now` (of the
    lines matching `where`)."""
    line = f"CASE WHEN {now} >= available_at THEN 'approved' ELSE 'pending' END"
    # a booked line is approved by its booking, whatever the clock says (reconcile/bookings.py)
    return (
        f"UPDATE rc_commissions SET status = {line}"
        f" WHERE status IN {_changeable(forward)} AND status <> {line} AND booked_seq IS NULL AND {where}"
    )


def _refresh_postgresql(now_param: str, forward: bool, scope: Scope | None) -> tuple[str, str]:
    """`refresh_sql` for PostgreSQL: the holding days joined in once (a correlated lookup per
    row costs seconds there), times compared as instants (its sessions are UTC, and a day is
    86,400 s, as in the embedded database's microsecond arithmetic)."""
    now = f"CAST({now_param} AS TIMESTAMPTZ)"
    lines = _refresh_lines(now, forward, "TRUE" if scope is None else scope.programs_sql())
    mine = "TRUE" if scope is None else scope.programs_sql("s.program_id")
    default = int(str(PROGRAM_DEFAULTS["holding_days"]))
    sale = (
        f"CASE WHEN {now} >= s.occurred_at + coalesce(h.holding_days, {default}) * INTERVAL '1 day'"
        " THEN 'approved' ELSE 'pending' END"
    )
    # The sales whose status moves are found first (a materialised CTE, so the planner cannot
    # fold it back into a join), then updated by their physical address (`ctid`, stable within
    # the statement; only the reconciler writes these tables). Joining every changeable sale
    # back by its id instead took a hash join of the whole table: 3M sales, none moving, 5.0 s
    # against 2.0 s.
    sales = (
        "WITH moved AS MATERIALIZED (SELECT row, status FROM ("
        f"SELECT s.ctid AS row, {sale} AS status, s.commission_status AS was FROM rc_sales s"
        f" LEFT JOIN _rc_holding h ON h.program_id = s.program_id AND {_in_force('h', 's')}"
        f" WHERE s.commission_status IN {_changeable(forward)} AND {mine}) AS n WHERE status <> was)"
        " UPDATE rc_sales AS t SET commission_status = moved.status FROM moved WHERE t.ctid = moved.row"
    )
    return lines, sales
