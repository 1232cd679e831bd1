"""What the deriver last saw of each sale, commission line and payout batch (`webhook_marks`),
so that each change of the reconciler's published tables is an event once (api/outbound/derive.py).

Marks are kept for the programs that have a webhook endpoint, and only for them: a program's
marks are taken from the published tables when its first endpoint is made, in the same
transaction (`baseline`; a sentinel row says the program is watched), and dropped with its last
endpoint (`forget`). So an endpoint gets the changes after it was made, a program without one
costs the deriver nothing, and a program's history is never sent when an endpoint appears.

The tables and columns named here are the reconciler's output (reconcile/schema.py): what a
sale, a line and a batch are keyed by, and what of them is compared (`state`, `amount`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ingest.storage.sql import Executor

WATCHED = "program"  # the sentinel row's kind: this program's marks are kept
SEP = "|"


@dataclass(frozen=True)
class Kind:
    """One kind of object whose changes are events: its table (as `t`), its key, and what is
    compared: `state` (a sale's partner, a line's or a batch's status) and `amount` (a sale's
    refunded amount)."""

    name: str
    table: str
    key: str
    state: str
    amount: str


SALES = Kind("sale", "rc_sales", "t.sale_id", "t.partner_code", "t.refunded")
LINES = Kind(
    "line",
    "rc_commissions",
    f"t.sale_id || '{SEP}' || coalesce(t.partner_code, '') || '{SEP}' || t.kind || '{SEP}'"
    f" || coalesce(t.cause, '') || '{SEP}' || coalesce(t.period, '')",
    "t.status",
    "CAST(NULL AS BIGINT)",
)
PAYOUTS = Kind("payout", "rc_payouts", "t.payout_id", "t.status", "CAST(NULL AS BIGINT)")
KINDS = (SALES, LINES, PAYOUTS)


def _in(count: int) -> str:
    return ", ".join("?" * count)


def join(kind: Kind) -> str:
    """The table with each row's mark, if any (`m`)."""
    return (
        f" FROM {kind.table} t LEFT JOIN webhook_marks m ON m.program_id = t.program_id"
        f" AND m.kind = '{kind.name}' AND m.object_key = {kind.key}"
    )


def changed(kind: Kind) -> str:
    """A row whose mark is missing or differs."""
    return (
        f" (m.object_key IS NULL OR m.state IS DISTINCT FROM {kind.state}"
        f" OR m.amount IS DISTINCT FROM {kind.amount})"
    )


def tables(db: Executor) -> set[str]:
    """Which of the reconciler's tables exist (none before its first run)."""
    rows = db.rows(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        f" AND table_name IN ({_in(len(KINDS))})",
        [k.table for k in KINDS],
    )
    return {str(r[0]) for r in rows}


def watched(db: Executor) -> list[str]:
    """The programs whose marks are kept (those with an endpoint)."""
    rows = db.rows(f"SELECT program_id FROM webhook_marks WHERE kind = '{WATCHED}' ORDER BY program_id")
    return [str(r[0]) for r in rows]


def remark(db: Executor, kind: Kind, program_ids: Sequence[str]) -> None:
    """Bring the marks of `kind` of these programs level with the table, set based (a version
    counts each change of `state`); drop the marks of objects no longer there."""
    if not program_ids:
        return
    inside = f"t.program_id IN ({_in(len(program_ids))})"
    db.execute(
        "INSERT INTO webhook_marks (program_id, kind, object_key, state, amount, version)"
        f" SELECT t.program_id, '{kind.name}', {kind.key}, {kind.state}, {kind.amount},"
        " coalesce(m.version, 0) + CASE WHEN m.object_key IS NOT NULL"
        f" AND m.state IS DISTINCT FROM {kind.state} THEN 1 ELSE 0 END"
        + join(kind)
        + f" WHERE {inside} AND"
        + changed(kind)
        + " ON CONFLICT (program_id, kind, object_key)"
        " DO UPDATE SET state = excluded.state, amount = excluded.amount, version = excluded.version",
        list(program_ids),
    )
    db.execute(
        f"DELETE FROM webhook_marks WHERE kind = '{kind.name}' AND program_id IN ({_in(len(program_ids))})"
        f" AND NOT EXISTS (SELECT 1 FROM {kind.table} t"
        f" WHERE t.program_id = webhook_marks.program_id AND {kind.key} = webhook_marks.object_key)",
        list(program_ids),
    )


def baseline(db: Executor, program_id: str) -> None:
    """Start keeping a program's marks, from the tables as they are (inside the caller's
    transaction: the one that makes its first endpoint); nothing when they are kept already."""
    if db.rows(f"SELECT 1 FROM webhook_marks WHERE program_id = ? AND kind = '{WATCHED}'", [program_id]):
        return
    present = tables(db)
    for kind in KINDS:
        if kind.table in present:
            remark(db, kind, [program_id])
    db.execute(
        f"INSERT INTO webhook_marks VALUES (?, '{WATCHED}', '', NULL, NULL, 0) ON CONFLICT DO NOTHING",
        [program_id],
    )


def forget(db: Executor, program_id: str) -> None:
    """Stop keeping a program's marks (its last endpoint went)."""
    db.execute("DELETE FROM webhook_marks WHERE program_id = ?", [program_id])
