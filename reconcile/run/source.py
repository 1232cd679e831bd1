"""Reading the database for the reconciler: raw rows (only the columns it reads) and the
control plane (program settings, partners)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import duckdb
import polars as pl

from ingest.domain.records import ProgramSettings
from reconcile import bookings, manual, payouts, periods, promos, terms, unroutable
from reconcile.schema import (
    PARTNER_SCHEMA,
    PROGRAM_SCHEMA,
    READ_COLUMNS,
    prepare_raw,
    setting_text,
)

# Engineer actions read with their `body` (metadata fixes carry typed columns instead).
ENGINEER_KINDS = (
    "backfill",
    "period_close",
    periods.MARK,
    *payouts.KINDS,
    terms.KIND,
    bookings.ACTION,
    promos.KIND,
)
# Bookings and manual entries are read with their body too, but only reach the sales (or the
# entry) they name by transaction id: linked rows of the log like records and refunds, not
# program-wide actions.
LEDGER_KINDS = (bookings.BOOKING, periods.SNAPSHOT, manual.KIND)

# Each group of rows is read with its own columns (schema.READ_COLUMNS), filtered by
# `{where}`. Engineer actions are the only rows whose `body` is read: they are read apart, so
# the scan of the other rows never touches the (large) body column.
_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "stripe": ("kind = 'stripe' AND ({where})", READ_COLUMNS["stripe"]),
    "click": ("kind = 'click' AND ({where})", READ_COLUMNS["click"]),
    "other": (
        f"kind NOT IN ('stripe', 'click', {', '.join(repr(k) for k in (*ENGINEER_KINDS, *LEDGER_KINDS))})"
        " AND ({where})",
        tuple(c for c in READ_COLUMNS["other"] if c != "body"),
    ),
    # Found through `seq`, every filter inside the subquery: a scan that filters engineer rows
    # itself decompresses every body (1M events: 3 s, 1.4 GiB); one whose seqs come from a
    # subquery skips the row groups that hold none of them.
    "ledger": (
        f"seq IN (SELECT seq FROM raw_events WHERE kind IN ({', '.join(repr(k) for k in LEDGER_KINDS)})"
        " AND ({where}))",
        READ_COLUMNS["other"],
    ),
    "engineer": (
        f"seq IN (SELECT seq FROM raw_events WHERE kind IN {ENGINEER_KINDS!r} AND ({{where}}))",
        READ_COLUMNS["other"],
    ),
}


def _select(columns: Sequence[str]) -> str:
    return ", ".join(columns)


@contextlib.contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, frame: pl.DataFrame) -> Iterator[None]:
    """`frame` readable by SQL on `con` as `name` inside the block (a few keys to semi-join)."""
    con.register(name, frame.to_arrow())
    try:
        yield
    finally:
        con.unregister(name)


def read_rows(
    con: duckdb.DuckDBPyConnection,
    where: str = "",
    params: Sequence[object] = (),
    groups: Sequence[str] = tuple(_GROUPS),
) -> pl.DataFrame:
    """The rows of `raw_events` of the given groups (all by default) matching `where` (SQL over
    raw_events, `?` bound to `params`), each with only the columns the reconciler reads for its
    kind (schema.READ_COLUMNS); the other columns are null."""
    parts: list[pl.DataFrame] = [
        con.sql(
            f"SELECT {_select(_GROUPS[group][1])} FROM raw_events"
            f" WHERE {_GROUPS[group][0].format(where=where or 'TRUE')}",
            params=list(params) or None,
        ).pl()
        for group in groups
    ]
    return pl.concat(parts, how="diagonal_relaxed")


# The groups of rows `read_linked` reads in one scan (every one but the engineer actions and
# the ledger rows, whose `body` is read apart), by kind: those not named here are "other".
_LINKED = ("stripe", "other", "click")
# The groups of `read_linked`'s rows, in its order, with the columns each keeps (the others
# are null); and the columns of its result, in its order.
LINKED_GROUPS: dict[str, tuple[str, ...]] = {g: _GROUPS[g][1] for g in ("stripe", "other", "ledger", "click")}
LINKED_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(c for cols in LINKED_GROUPS.values() for c in cols))


def read_linked(
    con: duckdb.DuckDBPyConnection, where: str = "", params: Sequence[object] = ()
) -> pl.DataFrame:
    """Exactly `read_rows(con, where, params, groups=("stripe", "other", "ledger", "click"))`
    (same rows, columns, order), with one scan of the log for the stripe, other and click rows
    instead of three: the columns of the three groups are read together and each row keeps
    only those of its own group (the others null, as `read_rows` leaves them).

    For the few rows of a closure spread over the whole log (an incremental run), each scan
    decompresses nearly every vector of the columns it reads whatever the filter, so the scans
    are the cost: 3M events, 5,567 rows of a closure: 0.41 s against 0.72 s."""
    columns = list(dict.fromkeys(c for group in _LINKED for c in _GROUPS[group][1]))
    excluded = ", ".join(repr(k) for k in (*ENGINEER_KINDS, *LEDGER_KINDS))
    rows: pl.DataFrame = con.sql(
        f"SELECT {_select(columns)} FROM raw_events WHERE kind NOT IN ({excluded}) AND ({where or 'TRUE'})",
        params=list(params) or None,
    ).pl()
    group = (
        pl.when(pl.col("kind") == "stripe")
        .then(pl.lit("stripe"))
        .when(pl.col("kind") == "click")
        .then(pl.lit("click"))
        .otherwise(pl.lit("other"))
    )
    rows = rows.with_columns(_group=group)
    parts = {name: rows.filter(pl.col("_group") == name).select(_GROUPS[name][1]) for name in _LINKED}
    ledger = read_rows(con, where, params, groups=("ledger",))
    return pl.concat([parts["stripe"], parts["other"], ledger, parts["click"]], how="diagonal_relaxed")


def raw_chunk(
    con: duckdb.DuckDBPyConnection,
    programs: Sequence[str] | None = None,
    before_seq: int | None = None,
    after_seq: int | None = None,
    where: str = "TRUE",
) -> pl.DataFrame:
    """The rows of `raw_events` (of the given programs, None = all; with seq before `before_seq`
    and after `after_seq`, None = any; matching the SQL condition `where`), as `read_rows`
    gives them."""
    conditions, params = [where], list[object]()
    if programs is not None:
        # A filter on the column itself, which DuckDB evaluates inside the scan; `IN (SELECT
        # unnest(?))` is a semi join over every row of the group (10 % more read time).
        conditions.append("list_contains(?::VARCHAR[], program_id)")
        params.append(list(programs))
    if before_seq is not None:
        conditions.append("seq < ?")
        params.append(before_seq)
    if after_seq:
        conditions.append("seq > ?")
        params.append(after_seq)
    return read_rows(con, " AND ".join(conditions), params)


def _programs(rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    records = []
    for program_id, settings in rows:
        # settings saved before today's bounds are clamped into them, never fail a run
        values = ProgramSettings.from_stored(settings or "{}", program_id).model_dump()
        values["commission_flat"] = setting_text(values["commission_flat"])
        records.append(
            {"program_id": program_id, **{k: values.get(k) for k in PROGRAM_SCHEMA if k != "program_id"}}
        )
    return pl.DataFrame(records, schema=PROGRAM_SCHEMA, strict=False)


def control_plane(con: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Program settings and partners, as the reconciler takes them."""
    programs = _programs(con.execute("SELECT program_id, settings FROM programs").fetchall())
    partners: pl.DataFrame = con.sql("SELECT program_id, code, email FROM partners").pl()
    return programs, partners.select(pl.col(name).cast(dtype) for name, dtype in PARTNER_SCHEMA.items())


# The rows the unroutable list is made of: those routed to no program, and the copies of
# unroutable events a backfill picked up (reconcile/unroutable.py), which leave the list.
STRAY = "(program_id IS NULL OR (kind = 'stripe' AND source = 'backfill'))"


def stray_rows(reader: duckdb.DuckDBPyConnection, after_seq: int = 0) -> pl.DataFrame:
    """The rows routed to no program and the picked-up copies (with seq after `after_seq`), with
    the processor's columns."""
    frame: pl.DataFrame = reader.sql(
        f"SELECT {', '.join(READ_COLUMNS['stripe'])} FROM raw_events WHERE {STRAY} AND seq > ?",
        params=[after_seq],
    ).pl()
    return frame


def unroutable_table(stray: pl.DataFrame, programs: pl.DataFrame) -> pl.DataFrame:
    """The rc_unroutable rows of the `stray` rows (`stray_rows`), as the `programs` are now."""
    return unroutable.listing(prepare_raw(stray), programs)


def unroutable_rows(reader: duckdb.DuckDBPyConnection, programs: pl.DataFrame) -> pl.DataFrame:
    """The rc_unroutable rows: processor events routed to no program (read on their own)."""
    return unroutable_table(stray_rows(reader), programs)


def unpicked(reader: duckdb.DuckDBPyConnection, account: str | None) -> pl.DataFrame:
    """Every column of the unroutable rows that no backfill picked up yet and that name the
    Connect `account` or no account at all (what a backfill of a program with `account` may
    pick up), by seq."""
    frame: pl.DataFrame = reader.sql(
        "SELECT * FROM raw_events WHERE program_id IS NULL AND kind = 'stripe' AND outcome = 'unroutable'"
        " AND event_id IS NOT NULL AND (stripe_account IS NULL OR stripe_account = ?)"
        " AND event_id NOT IN (SELECT event_id FROM raw_events WHERE kind = 'stripe' AND source = 'backfill'"
        " AND program_id IS NOT NULL AND event_id IS NOT NULL) ORDER BY seq",
        params=[account],
    ).pl()
    return frame


def unbooked_closes(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """The programs of the log with a period close that no booking holds yet
    (reconcile/periods.py): engineer rows only, found through `seq` (no body scan)."""
    rows = read_rows(con, "kind IN (?, ?)", ["period_close", periods.MARK], groups=("engineer",))
    return periods.unbooked(prepare_raw(rows))
