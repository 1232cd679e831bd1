"""The raw log's mirror at its production sizes (reconcile/mirror.py `MIN_ROWS`, `SEGMENT_ROWS`),
which every other test shrinks to a few rows so that small logs make segments: a generated log
just past `MIN_ROWS` is mirrored as one segment, the full run that wrote it gives exactly the
tables of a run without a mirror (an in-memory copy of the same log), and the next full run
reads the log from that segment."""

from __future__ import annotations

from pathlib import Path

import duckdb
from polars.testing import assert_frame_equal

from bench import rawgen
from ingest.storage import migrations
from reconcile.run import job, mirror
from reconcile.schema import UNROUTABLE_SCHEMA
from tests.reconcile.database import ORDERS, materialised

PRODUCTION = (250_000, 1_000_000)  # (MIN_ROWS, SEGMENT_ROWS) as shipped
TABLES = {**job.TABLES, "rc_unroutable": ("unroutable", UNROUTABLE_SCHEMA)}


def _in_memory_copy(path: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory database (which has no mirror) holding the log and control plane of `path`."""
    con = duckdb.connect()
    migrations.apply(con)
    con.execute(f"ATTACH '{path}' AS source (READ_ONLY)")
    for table in ("programs", "partners", "raw_events"):
        con.execute(f"INSERT INTO {table} SELECT * FROM source.{table}")
    con.execute("DETACH source")
    return con


def _assert_same_tables(got: duckdb.DuckDBPyConnection, expected: duckdb.DuckDBPyConnection) -> None:
    for name, (attribute, schema) in TABLES.items():
        order = ORDERS[attribute]
        assert_frame_equal(
            materialised(got, name, schema).sort(order, nulls_last=True),
            materialised(expected, name, schema).sort(order, nulls_last=True),
            check_exact=True,
        )


def test_a_log_past_min_rows_is_one_segment_that_full_runs_read(tmp_path: Path) -> None:
    assert (mirror.MIN_ROWS, mirror.SEGMENT_ROWS) == PRODUCTION  # nothing has shrunk them here
    rows = mirror.MIN_ROWS + 1_000
    path = tmp_path / "tally.duckdb"
    rawgen.write_db(path, rawgen.generate(rows))
    with _in_memory_copy(path) as plain, duckdb.connect(str(path)) as con:
        assert job.run(plain, rawgen.NOW, full=True).events_read == rows
        assert job.run(con, rawgen.NOW, full=True).events_read == rows
        registered = con.execute("SELECT segment, after_seq, upto_seq, rows FROM rc_mirror").fetchall()
        assert [tuple(r[1:]) for r in registered] == [(0, rows, rows)]
        root = mirror.directory(con)
        assert root is not None and sorted(p.name for p in root.iterdir()) == [registered[0][0]]
        _assert_same_tables(con, plain)
        # The next full run reads the segment, not the table: a change behind the mirror's back
        # (which the append-only log never makes) is not seen.
        con.execute("UPDATE raw_events SET amount = amount + 1 WHERE amount IS NOT NULL")
        job.run(con, rawgen.NOW, full=True)
        _assert_same_tables(con, plain)
