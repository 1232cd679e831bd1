"""Incremental runs: patch the rc_* tables with what the rows added since the last run change.

A run builds on the previous one (`prepare` returns a `Patch`; otherwise the job runs in full)
when all of these hold:

- the previous run recorded the same fingerprint: ENGINE_VERSION (bump it whenever a rule or an
  rc_* schema changes), the Polars version (an upgrade may change results), program settings
  and partners;
- its high water seq is not above the log's, and every rc_* table exists;
- no engineer action (metadata fix, backfill, period close, payout batch or its payment, a
  change of a program's terms) arrived since: a backfill re-scopes a date range of a whole
  program, a close freezes a month of every sale of one, a payout batch takes lines of every
  customer of one.

Months closed before the previous run need no full run: a closed month's lines are composed per
commission line key from the ledgers of the log's prefixes before each close
(reconcile/periods.py), and the ledger of a prefix, like the ledger of the whole log, is the
union of its components' ledgers. Reconciling the closure with every engineer action (closes
and their `close_booked` markers included) therefore gives its components' frozen lines and
adjustments exactly as a full run does; a booked close's lines (`close_booking` rows, one per
sale, linked by transaction id) join their sale's component like its records.

The patch: the rows added since the previous run (`seq` above its high water mark) join the
component store (reconcile/run/components.py: each covered row's component, by the 64-bit
hashes of its link values, reconcile/run/closure.py); the rows of the components they joined
(found in the store by component id, then read by seq, clicks included) and the programs'
engineer actions are reconciled (reconcile/pipeline.py) as one small log (in parts by component,
each with every engineer action, when they outnumber a full run's step: `_in_parts`); the previous rows of
those components are deleted and the new ones inserted; commission statuses of all other rows
are brought up to `now` (only the pending ones when `now` is not before the previous run's:
approval only comes with time); unroutable events are re-read when new ones (or copies a
backfill picked up) arrived. One transaction, with the run's record and the store's changes.

The cost is the new rows' link hashes, a lookup of their values in the store and of the
touched components' rows (scans of two integer columns of the store, not of the log's link
columns), the read of those rows by seq and of the engineer actions, plus work in proportion to
the customers the new rows touch, where a full run reconciles and rewrites everything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

import duckdb
import polars as pl

from reconcile import terms, unroutable
from reconcile.pipeline import Result, reconcile
from reconcile.run import closure, components
from reconcile.run.rowstore import RowStore
from reconcile.run.source import ENGINEER_KINDS, read_linked, read_rows, registered, unroutable_rows
from reconcile.schema import ENGINE, prepare_programs, prepare_raw

ENGINE_VERSION = "11"
NEW_ENGINEER_KINDS = ("metadata_fix", *ENGINEER_KINDS)
STAGED = (
    "rc_sales",
    "rc_commissions",
    "rc_refunds",
    "rc_double_counts",
    "rc_evidence",
    "rc_payouts",
    "rc_unroutable",
)
# Result attribute -> the column its materialised rows are keyed by (closure.stale_keys). Payout
# batches are engineer actions, after which a run is always full: incremental runs leave them.
KEYS = {
    "sales": "sale_id",
    "evidence": "sale_id",
    "commissions": "sale_id",
    "refunds": "event_id",
    "double_counts": "duplicate_id",
}

Tables = Mapping[str, tuple[str, Any]]


def fingerprint(programs: pl.DataFrame, partners: pl.DataFrame) -> str:
    """What a run's results depend on besides the log: engine, settings, partners."""
    digest = hashlib.sha256(f"{ENGINE_VERSION}|{pl.__version__}".encode())
    for frame, order in ((programs, ["program_id"]), (partners, ["program_id", "code"])):
        digest.update(frame.sort(order, nulls_last=True).write_csv().encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Patch:
    """What an incremental run writes (`apply`, inside the run's transaction)."""

    high_water: int
    events_read: int
    stale: pl.DataFrame
    result: Result | None
    unroutable: pl.DataFrame | None
    holding: pl.DataFrame
    now: datetime
    tables: Tables
    # `now` is not before the previous run's: only pending statuses can move (closure.refresh_sql)
    forward: bool = False

    def apply(self, con: duckdb.DuckDBPyConnection) -> tuple[int, int, int, int]:
        """Delete the stale rows, insert the recomputed ones, refresh statuses; the counts
        (events read, high water, sales, commission lines) the run records."""
        registered: list[str] = []

        def register(name: str, frame: pl.DataFrame) -> str:
            con.register(name, frame.to_arrow())
            registered.append(name)
            return name

        try:
            if self.result is not None:
                stale = register("_rc_stale", self.stale)
                for table, (attribute, _) in self.tables.items():
                    if attribute not in KEYS:
                        continue
                    con.execute(f"DELETE FROM {table} WHERE {KEYS[attribute]} IN (SELECT value FROM {stale})")
                    rows = register(f"_rc_new_{attribute}", getattr(self.result, attribute))
                    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {rows}")
            if self.unroutable is not None:
                lost = register("_rc_new_unroutable", self.unroutable)
                con.execute(f"CREATE OR REPLACE TABLE rc_unroutable AS SELECT * FROM {lost}")
            register("_rc_holding", self.holding)
            for statement in closure.refresh_sql(forward=self.forward):
                con.execute(statement, [self.now, self.now])
            ((sales, lines),) = con.execute(
                "SELECT (SELECT count(*) FROM rc_sales), (SELECT count(*) FROM rc_commissions)"
            ).fetchall()
        finally:
            for name in registered:
                con.unregister(name)
        return self.events_read, self.high_water, int(sales), int(lines)


def _previous(reader: duckdb.DuckDBPyConnection, fingerprint: str, now: datetime) -> tuple[int, bool] | None:
    """The high water seq of the last run, when it can be built on, and whether `now` is not
    before that run's `now` (its `started_at`: statuses were brought up to it)."""
    names = {
        str(row[0])
        for row in reader.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()
    }
    if not {*STAGED, "rc_runs"} <= names:
        return None
    columns = {
        str(row[0])
        for row in reader.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'main' AND table_name = 'rc_runs'"
        ).fetchall()
    }
    if "fingerprint" not in columns:
        return None
    rows = reader.execute(
        "SELECT high_water_seq, fingerprint, coalesce(started_at <= ?, false) FROM rc_runs"
        " ORDER BY rowid DESC LIMIT 1",
        [now],
    ).fetchall()  # fetched to the end: the next read on `reader` may be a relation's
    if not rows or rows[0][1] != fingerprint:
        return None
    return int(rows[0][0]), bool(rows[0][2])


def prepare(
    reader: duckdb.DuckDBPyConnection,
    control: tuple[pl.DataFrame, pl.DataFrame],
    fingerprint: str,
    now: datetime,
    report: Any,
    tables: Tables,
    store: components.Update,
    row_store: RowStore | None = None,
    limit: int | None = None,
) -> Patch | None:
    """The patch an incremental run would write, or None when a full run is needed. `store`:
    the component store brought up to the log's high water (`components.catch_up`); a store
    rebuilt from the whole log (no previous one to build on) means a full run. `row_store`: the row
    store brought up to the same seq (reconcile/run/rowstore.py), where the closure's rows are
    read (None: from the log). The rows to recompute are reconciled at most about `limit` at a
    time (`_in_parts`)."""
    found = _previous(reader, fingerprint, now)
    if found is None:
        return None
    previous, forward = found
    # Every row after the previous run must have joined the store in this run (each run moves
    # both in one transaction; a store rebuilt or ahead of the run, e.g. results written by a
    # tool, is not built on).
    if store.after is None or store.after > previous:
        return None
    high = store.upto
    if high < previous:
        return None
    new = read_rows(reader, "seq > ?", [previous])
    if new.get_column("kind").is_in(NEW_ENGINEER_KINDS).any():
        return None
    programs = control[0]
    report("reconcile", 0, 1)
    routed = new.filter(pl.col("program_id").is_not_null())
    result, stale, read = None, pl.DataFrame(schema={"value": pl.String}), new.height
    engineer = read_rows(reader, "program_id IS NOT NULL", groups=("engineer",))
    if routed.height:
        rows = _closure(reader, store, row_store)
        read += rows.height + engineer.height
        stale = closure.stale_keys(rows.filter(pl.col("kind") != "click"))
        result = _in_parts(reader, store, rows, engineer, control, now, limit)
    strays = new.filter(pl.col("program_id").is_null() | unroutable.picked_up())
    lost = unroutable_rows(reader, programs) if strays.height else None
    # Statuses of the rows left alone move with each sale's holding days, by its terms.
    settings = prepare_programs(programs).collect(engine=ENGINE)
    holding = terms.holding(terms.history(prepare_raw(engineer), settings))
    report("write", 1, 1)
    return Patch(high, read, stale, result, lost, holding, now, tables, forward)


def _in_parts(
    reader: duckdb.DuckDBPyConnection,
    store: components.Update,
    rows: pl.DataFrame,
    engineer: pl.DataFrame,
    control: tuple[pl.DataFrame, pl.DataFrame],
    now: datetime,
    limit: int | None,
) -> Result:
    """The result of reconciling `rows` (whole components) with the engineer actions: when
    there are more than `limit` rows, in `ceil(rows / limit)` parts by component, each with every
    engineer action, and the parts' results put together, as a full run does with a program
    larger than a step (reconcile/run/job.py): every rule is per program and per component, and
    the payout batches' listing comes from the engineer actions alone, so it is kept from part 0.
    A burst of new rows (1 % of a 30M-event log) then no longer takes the run's peak memory with
    it (5.1 GiB at once)."""
    programs, partners = control
    parts = 1 if limit is None else -(-rows.height // limit)
    if parts > 1:
        comps = store.comps(reader, rows.get_column("seq"))
        if comps.height != rows.height:  # a row the store does not cover: reconciled whole
            parts = 1
    if parts <= 1:
        return reconcile(
            pl.concat([rows, engineer], how="diagonal_relaxed"), programs, partners, now, batch_lines=False
        )
    # Each row's part, in the rows' order (no copy of the rows but each part's).
    assigned = (
        rows.select("seq")
        .join(comps.select("seq", part=components.part(parts)), on="seq", how="left", maintain_order="left")
        .get_column("part")
    )
    del comps
    results = []
    for part in range(parts):
        some = rows.filter(assigned == part)
        if part and some.is_empty():
            continue
        result = reconcile(
            pl.concat([some, engineer], how="diagonal_relaxed"), programs, partners, now, batch_lines=False
        )
        results.append(replace(result, payouts=result.payouts.clear()) if part else result)
    return Result(*(pl.concat([getattr(r, f.name) for r in results]) for f in fields(Result)))


def _closure(
    reader: duckdb.DuckDBPyConnection, store: components.Update, rows: RowStore | None = None
) -> pl.DataFrame:
    """The rows (as `read_rows` gives them, clicks included) of every component the rows the
    store took in are in: found in the component store (reconcile/run/components.py), read by
    seq from the row store (reconcile/run/rowstore.py), or, when there is none, it lacks a row
    or the closure is too large a share of the log for it (`RowStore.suits`), from the log: a
    semi-join on seq against the registered closure, in one scan for the three groups of linked
    rows (`read_linked`), whose cost grows with the log."""
    seqs = store.closure(reader)
    found = None if rows is None or not rows.suits(seqs.len()) else rows.read(reader, seqs)
    if found is not None:
        return found
    with registered(reader, "_rc_closure", seqs.to_frame("seq")):
        return read_linked(reader, "program_id IS NOT NULL AND seq IN (SELECT seq FROM _rc_closure)")
