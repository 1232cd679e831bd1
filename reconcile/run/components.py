"""The component store: each row's closure component, kept up to date run by run, so that an
incremental run finds what its new rows touch without reading the link columns of the log.

reconcile/run/closure.py defines components: rows linked, directly or not, through a shared
value (by its 64-bit hash). The store holds them in three tables of the engine's database (the
embedded file, or a PostgreSQL replica's working copy):

- `rc_link_values(value, comp)`: every link value hash of the rows covered, and its component;
- `rc_link_rows(seq, comp)`: every routed row but the engineer actions (clicks included: a
  click's only value is its click id, so it sits in that value's component), and its component;
- `rc_link_state(format, upto_seq)`: the rows covered are those with seq <= upto_seq; `FORMAT`
  names the hash functions and link columns (a DuckDB or Polars upgrade may change a hash).

A component's id is the smallest seq of its rows. `catch_up` reads the rows after `upto_seq`
(every run does, full or incremental, so the store follows the log), hashes their values, looks
up the components those values already belong to, and joins the new rows to them (`union`):
components a new row links are merged into the one of the smallest id, the others' rows and
values renamed. Nothing is written to the store then: the returned `Update` is applied in the run's final
transaction (`Update.apply`), so the store moves with the run that computed it, and a run that
fails leaves it as it was. The raw log is append-only, so the store of a prefix of the log never
needs more than additions and merges; a store that does not fit the log (another format, ahead
of the log, missing) is rebuilt from seq 0 by the same code, batch by batch into tables of the
run's own (`Staged`), which the final transaction renames into place: a rebuild holds one
batch and the merges in memory, not the store.

An incremental run then reads the rows of the components its new rows touched (`Update.closure`):
the rows of the old components they joined plus the new rows, by seq.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from ingest.pause import pause
from reconcile.run import closure
from reconcile.run.source import ENGINEER_KINDS, registered

FORMAT = hashlib.sha256(f"1|{duckdb.__version__}|{pl.__version__}|{closure.LINKS}".encode()).hexdigest()[:16]

DDL = (
    "CREATE TABLE IF NOT EXISTS rc_link_values (value UBIGINT NOT NULL, comp BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS rc_link_rows (seq BIGINT NOT NULL, comp BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS rc_link_state (format VARCHAR NOT NULL, upto_seq BIGINT NOT NULL)",
)
TABLES = ("rc_link_values", "rc_link_rows", "rc_link_state")
# A rebuild's tables, each `<table>__<run id>` (`Staged`): the batches as joined, then the store.
STAGED = ("rc_link_build_values", "rc_link_build_rows", "rc_link_values", "rc_link_rows")

# The rows the store covers: routed, and not engineer actions (which every component reads).
COVERED = f"program_id IS NOT NULL AND kind NOT IN ({', '.join(repr(k) for k in ENGINEER_KINDS)})"

# Parts of a closure (a program in a full run, reconcile/run/job.py; the rows an incremental run
# recomputes, reconcile/run/incremental.py) are assigned by a hash of their component's id: any
# function of the component gives the same results; this one spreads consecutive ids.
_PART_SEED = 0x7A11


def part(parts: int) -> pl.Expr:
    """The part (0 to `parts` - 1) of a row by its component (column `comp`)."""
    return (pl.col("comp").hash(_PART_SEED) % parts).cast(pl.Int64)


PAIRS_SCHEMA = {"seq": pl.Int64, "value": pl.UInt64}
COMPS_SCHEMA = {"value": pl.UInt64, "comp": pl.Int64}
# A rebuild reads the log this many seqs at a time (`_rebuild`).
BUILD_SEQS = 1_000_000


def link_hashes(reader: duckdb.DuckDBPyConnection, where: str, params: list[object]) -> pl.DataFrame:
    """`seq` and one UInt64 hash per link value (null where none) of the covered rows matching
    `where`. Ids are hashed by DuckDB (no strings cross into Polars); emails are normalised and
    hashed by Polars, as the reconciler normalises them."""
    ids = ", ".join(f"CASE WHEN {c} IS NOT NULL THEN hash({c}) END AS {c}" for c in closure.LINKS)
    rows: pl.DataFrame = reader.sql(
        f"SELECT seq, {ids}, email FROM raw_events WHERE {COVERED} AND ({where})", params=params or None
    ).pl()
    return rows.with_columns(closure.email_hash(pl.col("email")).alias("email"))


def pairs(hashes: pl.DataFrame) -> pl.DataFrame:
    """(seq, value) for every non-null link value hash of the rows of `hashes` (`link_hashes`)."""
    columns = [c for c in hashes.columns if c != "seq"]
    if not columns or not hashes.height:
        return pl.DataFrame(schema=PAIRS_SCHEMA)
    return (
        hashes.unpivot(index="seq", on=columns, value_name="value")
        .select(pl.col("seq").cast(pl.Int64), pl.col("value").cast(pl.UInt64))
        .drop_nulls("value")
    )


@dataclass(frozen=True)
class Union:
    """What joining new rows to the store changes (`union`)."""

    rows: pl.DataFrame  # (seq, comp) of the new rows
    values: pl.DataFrame  # (value, comp) of the values the store did not hold
    renamed: pl.DataFrame  # (old, new): components merged into another (`old` > `new`)
    touched: pl.Series  # the store's components (ids before the merge) the new rows joined


def _roots(size: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Connected components of the graph of `size` nodes and the edges `left[i]`-`right[i]`: for
    each node, the smallest node of its component. Hook and compress (each round hooks every
    edge's greater root under the smaller, then jumps pointers to the roots), a few rounds
    whatever the graph's diameter; no node's parent is ever above it."""
    parent = np.arange(size, dtype=np.int64)
    while True:
        a, b = parent[left], parent[right]
        differ = a != b
        if not differ.any():
            return parent
        a, b = a[differ], b[differ]
        np.minimum.at(parent, np.maximum(a, b), np.minimum(a, b))
        while True:
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped


def _first(column: str) -> pl.Expr:
    """True on the first row of each run of equal values of a sorted column."""
    return (pl.col(column) != pl.col(column).shift()).fill_null(True)


def _numbered(column: str) -> pl.Expr:
    """0, 1, ...: the rank of each row's value among the distinct values of a sorted column."""
    return _first(column).cast(pl.Int64).cum_sum() - 1


def union(new: pl.DataFrame, seqs: pl.Series, known: pl.DataFrame) -> Union:
    """Join new rows to the store. `new`: (seq, value) pairs of the new rows (`pairs`); `seqs`:
    every new row's seq (a row without values is a component of its own); `known`: (value,
    comp) of the store for the values of `new` that it holds. Seqs of new rows are above every
    seq the store covers, so a component's id (its smallest seq) only ever goes down.

    Connected components (`_roots`) of the graph whose nodes are the store's components that
    the new values belong to and the new rows (both by id, ascending: a component's smallest
    node is then its smallest id), then the values; a new row is linked to its values, a store
    component to its known values."""
    comps = known.get_column("comp").unique()
    # Nodes numbered by sorting: ids (a row's seq or a component's id) ascending, then values;
    # every new row is a node, with or without values.
    edges = (
        pl.concat(
            [
                new.select("seq", "value"),
                known.select(pl.col("comp").alias("seq"), "value"),
                seqs.cast(pl.Int64).to_frame("seq").with_columns(value=pl.lit(None, pl.UInt64)),
            ],
            how="vertical_relaxed",
        )
        .sort("seq")
        .with_columns(node=_numbered("seq"))
    )
    ids = edges.filter(_first("seq")).get_column("seq").to_numpy()
    edges = edges.drop_nulls("value").sort("value").with_columns(vnode=_numbered("value") + len(ids))
    values = edges.filter(_first("value")).get_column("value").to_numpy()
    roots = _roots(
        ids.size + values.size, edges.get_column("node").to_numpy(), edges.get_column("vnode").to_numpy()
    )
    comp_of = ids[roots]  # every root is an id node: each value has a row or component
    labels = pl.DataFrame({"seq": ids, "comp": comp_of[: ids.size]})
    by_value = pl.DataFrame({"value": values, "comp": comp_of[ids.size :]}, schema=COMPS_SCHEMA)
    old = labels.filter(pl.col("seq").is_in(comps.implode()))
    return Union(
        rows=labels.filter(~pl.col("seq").is_in(comps.implode())),
        values=by_value.filter(~pl.col("value").is_in(known.get_column("value").implode())),
        renamed=old.filter(pl.col("comp") != pl.col("seq")).select(old="seq", new="comp"),
        touched=comps,
    )


def _state(reader: duckdb.DuckDBPyConnection) -> int | None:
    """The seq up to which the store covers the log, when it exists in this format."""
    ((count,),) = reader.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main'"
        f" AND table_name IN {TABLES!r}"
    ).fetchall()
    if count != len(TABLES):
        return None
    rows = reader.execute("SELECT format, upto_seq FROM rc_link_state").fetchall()
    if len(rows) != 1 or rows[0][0] != FORMAT:
        return None
    return int(rows[0][1])


@dataclass
class Staged:
    """Where a rebuild writes the store as it builds it: tables named `<table>__<name>`
    (`STAGED`), created and committed through `writer`, a connection of their own (the run's
    reads hold a snapshot that would not see them); the run's final transaction renames the
    store's two into place (`Update.apply`), and a run that fails leaves them to be dropped
    (reconcile/run/job.py `_drop_staging`, by name)."""

    writer: duckdb.DuckDBPyConnection
    name: str = field(default_factory=lambda: f"rcr_{uuid.uuid4().hex}")

    def table(self, base: str) -> str:
        return f"{base}__{self.name}"

    def drop(self) -> None:
        for base in STAGED:
            self.writer.execute(f'DROP TABLE IF EXISTS "{self.table(base)}"')


@dataclass(frozen=True)
class Update:
    """The store brought from `after` up to `upto`, to be applied in the run's final
    transaction; or, when `staged` is set, the store rebuilt up to `upto` into those tables."""

    after: int | None
    upto: int
    union: Union
    staged: Staged | None = None

    def closure(self, reader: duckdb.DuckDBPyConnection) -> pl.Series:
        """The seqs of the rows of every component the new rows are in (read before `apply`:
        the store's rows of the components they joined, plus the new rows)."""
        if self.staged is not None:
            every: pl.DataFrame = self.staged.writer.sql(
                f'SELECT seq FROM "{self.staged.table("rc_link_rows")}"'
            ).pl()
            return every.get_column("seq").cast(pl.Int64)
        fresh = self.union.rows.get_column("seq")
        touched = self.union.touched
        if self.after is None or not touched.len():
            return fresh
        with registered(reader, "_rc_touched", touched.to_frame("comp")):
            old: pl.DataFrame = reader.sql(
                "SELECT seq FROM rc_link_rows WHERE comp IN (SELECT comp FROM _rc_touched)"
            ).pl()
        return pl.concat([old.get_column("seq").cast(pl.Int64), fresh]).unique()

    def comps(self, reader: duckdb.DuckDBPyConnection, seqs: pl.Series) -> pl.DataFrame:
        """(seq, comp): the component of each of `seqs` that the store covers once this update
        is applied (read before `apply`: the store's rows, renamed by the merges, and the new
        rows; or the rebuilt store's rows); seqs it does not cover (engineer actions) are left
        out."""
        wanted = seqs.cast(pl.Int64).unique().to_frame("seq")
        if self.staged is not None:
            return _by_seq(self.staged.writer, self.staged.table("rc_link_rows"), wanted)
        fresh = self.union.rows.join(wanted, on="seq", how="semi")
        if self.after is None:
            return fresh
        stored = _by_seq(reader, "rc_link_rows", wanted)
        renamed = self.union.renamed
        if renamed.height:
            stored = stored.with_columns(
                pl.col("comp").replace(renamed.get_column("old"), renamed.get_column("new"))
            )
        return pl.concat([stored, fresh])

    def apply(self, con: duckdb.DuckDBPyConnection) -> None:
        """Inside the run's final transaction: write the new rows, values and merges, or put
        the rebuilt store in place."""
        for ddl in DDL:
            con.execute(ddl)
        if self.staged is not None:
            for table in ("rc_link_values", "rc_link_rows"):
                con.execute(f"DROP TABLE {table}")
                con.execute(f'ALTER TABLE "{self.staged.table(table)}" RENAME TO {table}')
        elif self.after is None:
            for table in TABLES:
                con.execute(f"DELETE FROM {table}")
        registered = []
        try:
            if self.union.renamed.height:
                con.register("_rc_renamed", self.union.renamed.to_arrow())
                registered.append("_rc_renamed")
                for table in ("rc_link_values", "rc_link_rows"):
                    con.execute(
                        f"UPDATE {table} SET comp = r.new FROM _rc_renamed r WHERE {table}.comp = r.old"
                    )
            for table, frame in (("rc_link_values", self.union.values), ("rc_link_rows", self.union.rows)):
                if frame.height:
                    con.register(f"_rc_new_{table}", frame.to_arrow())
                    registered.append(f"_rc_new_{table}")
                    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rc_new_{table}")
        finally:
            for name in registered:
                con.unregister(name)
        con.execute("DELETE FROM rc_link_state")
        con.execute("INSERT INTO rc_link_state VALUES (?, ?)", [FORMAT, self.upto])


def _by_seq(reader: duckdb.DuckDBPyConnection, table: str, wanted: pl.DataFrame) -> pl.DataFrame:
    """(seq, comp) of the rows of the store table `table` whose seq is in `wanted`."""
    with registered(reader, "_rc_wanted", wanted):
        stored: pl.DataFrame = reader.sql(
            f'SELECT seq, comp FROM "{table}" WHERE seq IN (SELECT seq FROM _rc_wanted)'
        ).pl()
    return stored.cast({"seq": pl.Int64, "comp": pl.Int64})


def high_water(reader: duckdb.DuckDBPyConnection) -> int:
    """The log's last seq (0: empty) in `reader`'s snapshot."""
    ((high,),) = reader.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchall()
    return int(high)


def covered(reader: duckdb.DuckDBPyConnection) -> int | None:
    """The seq up to which the store covers the log in `reader`'s snapshot; None when it must
    be rebuilt (missing, of another format, or ahead of the log: a database restored from an
    older copy)."""
    after = _state(reader)
    return None if after is None or after > high_water(reader) else after


def _batch(reader: duckdb.DuckDBPyConnection, after: int, upto: int) -> tuple[pl.DataFrame, pl.Series]:
    """The (seq, value) pairs and the seqs of the covered rows with `after < seq <= upto`."""
    hashes = link_hashes(reader, "seq > ? AND seq <= ?", [after, upto])
    return pairs(hashes), hashes.get_column("seq")


def _rebuild(reader: duckdb.DuckDBPyConnection, upto: int, staged: Staged) -> Update:
    """The store of every covered row up to `upto`, built `BUILD_SEQS` seqs at a time into
    `staged`'s tables, so that a rebuild holds one batch's link hashes and the merges in memory,
    not the store (the whole 10M-event log's hashes at once took the first run's peak from 4.8
    to 8.2 GiB; the store held in memory, 16 bytes a row and a value, added about 0.6 GiB at 10M
    and grew with the log).

    Each batch's values are looked up in the values written so far, whose components are those
    they had when written: `renamed` maps every component merged away since to the one it is
    now part of (kept resolved: a merge renames the entries that pointed at the merged
    component too), so a batch joins the current components. The rows and values are written
    with the components they had then, and renamed once at the end, as the store's tables are
    made from the batches'."""
    rows, values = staged.table("rc_link_build_rows"), staged.table("rc_link_build_values")
    writer = staged.writer
    staged.drop()
    writer.execute(f'CREATE TABLE "{rows}" (seq BIGINT NOT NULL, comp BIGINT NOT NULL)')
    writer.execute(f'CREATE TABLE "{values}" (value UBIGINT NOT NULL, comp BIGINT NOT NULL)')
    renamed = pl.DataFrame(schema={"old": pl.Int64, "new": pl.Int64})
    for start in range(0, max(upto, 0), BUILD_SEQS):
        new, seqs = _batch(reader, start, min(start + BUILD_SEQS, upto))
        known = pl.DataFrame(schema=COMPS_SCHEMA)
        if start and new.height:
            with registered(writer, "_rc_values", new.select("value").unique()):
                found: pl.DataFrame = writer.sql(
                    f'SELECT value, comp FROM "{values}" WHERE value IN (SELECT value FROM _rc_values)'
                ).pl()
            known = found.cast(COMPS_SCHEMA).with_columns(_renaming(renamed, "comp"))  # type: ignore[arg-type]
        joined = union(new, seqs, known)
        del new, seqs, known
        if joined.renamed.height:
            renamed = pl.concat([renamed.with_columns(_renaming(joined.renamed, "new")), joined.renamed])
        for table, frame in ((rows, joined.rows), (values, joined.values)):
            if frame.height:
                with registered(writer, "_rc_batch", frame):
                    writer.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM _rc_batch')
        pause("components.batch")  # the crash tests: a batch in the rebuild's tables
    with registered(writer, "_rc_renamed", renamed):
        for table, built, key in (("rc_link_rows", rows, "seq"), ("rc_link_values", values, "value")):
            if not renamed.height:  # nothing merged across batches (a log of one batch)
                writer.execute(f'ALTER TABLE "{built}" RENAME TO "{staged.table(table)}"')
                continue
            writer.execute(
                f'CREATE TABLE "{staged.table(table)}" AS SELECT b.{key}, coalesce(r.new, b.comp) AS comp'
                f' FROM "{built}" b LEFT JOIN _rc_renamed r ON b.comp = r.old'
            )
            writer.execute(f'DROP TABLE "{built}"')
    empty = pl.DataFrame(schema={"seq": pl.Int64, "comp": pl.Int64})
    nothing = Union(
        empty, pl.DataFrame(schema=COMPS_SCHEMA), renamed.clear(), pl.Series("comp", [], pl.Int64)
    )
    return Update(None, upto, nothing, staged)


def _renaming(renamed: pl.DataFrame, column: str) -> pl.Expr:
    """`column` with every component `renamed` maps (old -> new) replaced."""
    if not renamed.height:
        return pl.col(column)
    return pl.col(column).replace(renamed.get_column("old"), renamed.get_column("new"))


def catch_up(reader: duckdb.DuckDBPyConnection, upto: int, staged: Staged | None = None) -> Update:
    """The store brought up to seq `upto` (through `reader`'s snapshot): the rows after the
    seq it covers joined to it, or, when it must be rebuilt (`covered`), every row, into
    `staged` (default: tables named after a fresh run id, written through a cursor of
    `reader`'s database)."""
    after = covered(reader)
    if after is None or after > upto:
        return _rebuild(reader, upto, staged or Staged(reader.cursor()))
    new, seqs = _batch(reader, after, upto)
    if not new.height:
        known = pl.DataFrame(schema=COMPS_SCHEMA)
    else:
        with registered(reader, "_rc_values", new.select("value").unique()):
            found: pl.DataFrame = reader.sql(
                "SELECT value, comp FROM rc_link_values WHERE value IN (SELECT value FROM _rc_values)"
            ).pl()
        known = found.cast(COMPS_SCHEMA)  # type: ignore[arg-type]
    return Update(after, upto, union(new, seqs, known))
