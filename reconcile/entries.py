"""What a booked line owes its partner over time: the entries of a partner's statement. Pure.

A partner's balance in a currency is what tally owes them there: the approved money booked for
them less what paid batches sent them (reports/statements.py). Each booked line counts from its
booking (its `booked_seq`, at `booked_at`) with its amount, as long as it is *owed*: held by a
payout batch (its money is in that batch), or free and its sale neither held nor void. Finance's
later acts change that, each at its own log position, and each change is an entry of its own
(kind `adjustment`, dated when logged, naming its cause):

- a hold of the sale (`commission_action` hold) after the booking: minus the line's amount; its
  release: plus it again; a void: minus it (once: a void held line owes nothing already);
- a batch letting the line go (its cancel, or its row's failure: reconcile/payouts.py) while the
  sale is held or void: minus the amount (the line was owed while the batch held it).

A booked line of a closed month heeds no action logged after both its booking and the close
(its `frozen_seq`, reconcile/bookings.py): such an action books a line of its own instead
(`compensations`), which is the statement's entry for it.

So no entry is ever edited: a statement as of any log position is the entries up to it, and the
closing balance equals the approved lines no paid batch holds (what the next batch would pay,
before the minimum). Acts while a batch holds the line change nothing (the API refuses them:
`line_in_batch`, `line_paid`).

`history` (a column of the commission lines) lists a line's entries after its booking as JSON
(`seq`, `at`, `amount`, `reason`, `cause`), oldest first; null for a line with none.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import polars as pl

from reconcile.schema import ENGINE

SALE = ["program_id", "sale_id"]
_RELEASES = ("payout_cancel", "payout_row_failed")
FROZEN = "frozen_seq"  # reconcile/bookings.py: actions from this seq on do not touch the line


def _heeds(seq: pl.Expr) -> pl.Expr:
    """The actions a booked line heeds: after its booking, before it froze (a closed month's
    line: a later action books a line of its own, reconcile/bookings.py `compensations`)."""
    return (seq > pl.col("booked_seq")) & (pl.col("__until").is_null() | (seq < pl.col("__until")))


def _stamp(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def history(lines: pl.DataFrame, acts: pl.DataFrame, log: pl.LazyFrame) -> pl.DataFrame:
    """`lines` (with `custody`, reconcile/payouts.py `assign(..., keep_custody=True)`) with
    `history` instead of `custody`: the entries of each booked line after its booking."""
    row = "__line"
    indexed = lines.with_row_index(row)
    booked = indexed.filter(pl.col("booked_seq").is_not_null() & (pl.col("amount") != 0))
    until = pl.col(FROZEN) if FROZEN in lines.columns else pl.lit(None, pl.Int64)
    booked = booked.with_columns(until.alias("__until"))
    acted = (
        booked.select(row, *SALE, "booked_seq", "__until")
        .join(acts.select(*SALE, "action_seq"), on=SALE)
        .filter(_heeds(pl.col("action_seq")))
        .select(row)
    )
    let_go = booked.filter(
        pl.col("custody")
        .list.eval(pl.element().struct.field("release").is_not_null())
        .list.any()
        .fill_null(False)
    ).select(row)
    wanted = pl.concat([acted, let_go]).unique()
    if wanted.is_empty():
        return lines.drop("custody", FROZEN, strict=False).with_columns(history=pl.lit(None, pl.String))
    mine = booked.join(wanted, on=row, how="semi")
    releases = {
        seq: (at, event_id)
        for seq, at, event_id in log.filter(pl.col("kind").is_in(_RELEASES))
        .select("seq", "received_at", "event_id")
        .collect(engine=ENGINE)
        .iter_rows()
    }
    by_sale: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for act in acts.join(mine.select(SALE).unique(), on=SALE).iter_rows(named=True):
        by_sale.setdefault((act["program_id"], act["sale_id"]), []).append(act)
    texts: list[str | None] = []
    for line in mine.iter_rows(named=True):
        found = _entries(line, by_sale.get((line["program_id"], line["sale_id"]), []), releases)
        texts.append(json.dumps(found, sort_keys=True) if found else None)
    made = mine.select(row).with_columns(history=pl.Series(texts, dtype=pl.String))
    return indexed.join(made, on=row, how="left").sort(row).drop(row, "custody", FROZEN, strict=False)


def _entries(
    line: dict[str, Any], acts: list[dict[str, Any]], releases: dict[int, tuple[datetime, str]]
) -> list[dict[str, Any]]:
    """One line's entries after its booking (the module docstring's rule)."""
    booked, amount = int(line["booked_seq"]), int(line["amount"])
    spans = [(int(c["seq"]), c["release"], c["payout_id"]) for c in line["custody"] or []]
    points: dict[int, list[tuple[str, Any]]] = {}
    until = line["__until"]
    for act in acts:
        if act["action_seq"] > booked and (until is None or act["action_seq"] < until):
            points.setdefault(int(act["action_seq"]), []).append(("act", act))
    for start, release, payout_id in spans:
        points.setdefault(start, [])
        if release is not None:
            points.setdefault(int(release), []).append(("release", payout_id))
    state, owed, out = "owed", amount, []
    for seq in sorted(points):
        reason, cause, at = None, None, None
        for what, item in points[seq]:
            if what == "act":
                action = item["action"]
                if action == "void":
                    state = "void"
                elif state != "void":
                    state = "held" if action == "hold" else "owed"
                word = {"hold": "held", "release": "released", "void": "void"}[action]
                reason = f"{word}: {item['reason']}" if item["reason"] else word
                cause, at = item["action_id"], item["acted_at"]
            else:
                at, cause = releases.get(seq, (None, None))
                reason = f"let go by payout {item} while the sale is {state}"
        in_batch = any(start <= seq and (release is None or seq < release) for start, release, _ in spans)
        now = amount if in_batch or state == "owed" else 0
        if now != owed and at is not None:
            out.append({"seq": seq, "at": _stamp(at), "amount": now - owed, "reason": reason, "cause": cause})
            owed = now
    return out
