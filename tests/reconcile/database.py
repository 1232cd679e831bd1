"""Real DuckDB files for the reconcile tests: the ingest schema and control plane, raw rows
appended as ingest writes them, the materialised tables read back; shared by test_job,
test_incremental, test_mirror and test_backfill_properties (no test module imports another)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from ingest.storage import migrations
from reconcile import pipeline
from reconcile.pipeline import Result
from reconcile.run import job, mirror, rowstore
from reconcile.schema import UNROUTABLE_SCHEMA
from tests.reconcile import builders as b
from tests.reconcile.builders import at
from tests.reconcile.streams import Stream

ORDERS = {
    "sales": pipeline.SALES_ORDER,
    "commissions": pipeline.COMMISSIONS_ORDER,
    "refunds": pipeline.REFUNDS_ORDER,
    "double_counts": pipeline.DOUBLES_ORDER,
    "evidence": pipeline.EVIDENCE_ORDER,
    "unroutable": pipeline.UNROUTABLE_ORDER,
    "payouts": pipeline.PAYOUTS_ORDER,
}

NOW = at(days=100)


def program_database(path: Path, settings: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """A DuckDB file with the raw log and control plane: program `prog_a` (with `settings`) and
    its partner `p1` (pat@partner.test)."""
    connection = duckdb.connect(str(path))
    migrations.apply(connection)
    connection.execute(
        "INSERT INTO programs VALUES (?, 'ws_1', 'Program A', ?, ?, ?)",
        ["prog_a", json.dumps(settings), b.T0, b.T0],
    )
    connection.execute(
        "INSERT INTO partners VALUES ('prog_a', 'p1', 'ptr_1', 'Pat', 'pat@partner.test', ?)", [b.T0]
    )
    return connection


def stream_database(con: duckdb.DuckDBPyConnection, stream: Stream) -> None:
    """The raw log and control plane in `con`, with the programs and partners of `stream`."""
    migrations.apply(con)
    for program in stream.programs.to_dicts():
        settings = {k: v for k, v in program.items() if k != "program_id"}
        # per-currency settings travel in the frame as JSON text (reconcile/terms.py)
        settings["commission_flat"] = json.loads(settings["commission_flat"])
        settings_json = json.dumps(settings)
        con.execute(
            "INSERT INTO programs VALUES (?, 'ws', 'n', ?, ?, ?)",
            [program["program_id"], settings_json, b.T0, b.T0],
        )
    for i, partner in enumerate(stream.partners.to_dicts()):
        con.execute(
            "INSERT INTO partners VALUES (?, ?, ?, 'n', ?, ?)",
            [partner["program_id"], partner["code"], f"ptr_{i}", partner["email"], b.T0],
        )


@contextmanager
def stream_file(stream: Stream, segment_rows: int = 3) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh DuckDB file in a folder of its own (its mirror folder beside it) holding the
    control plane of `stream`; the mirror cuts segments of `segment_rows` rows from 2 pending
    rows on, so that a small log makes several, and the row store serves every closure (for a
    hypothesis example, where function-scoped fixtures would be shared between examples)."""
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        patch.setattr(mirror, "MIN_ROWS", 2)
        patch.setattr(mirror, "SEGMENT_ROWS", segment_rows)
        patch.setattr(rowstore, "SHARE", 1)  # closures of a few rows are most of a small log
        connection = duckdb.connect(str(Path(folder) / "tally.duckdb"))
        try:
            stream_database(connection, stream)
            yield connection
        finally:
            connection.close()


def mirrored_rows(con: duckdb.DuckDBPyConnection) -> int:
    """How many raw rows the mirror's registered segments hold."""
    names = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "rc_mirror" not in names:
        return 0
    ((rows,),) = con.execute("SELECT coalesce(sum(rows), 0) FROM rc_mirror").fetchall()
    return int(rows)


def append(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]], first_seq: int = 1) -> None:
    frame = b.frame(rows).with_columns(pl.col("seq") + (first_seq - 1))
    con.register("incoming", frame.to_arrow())
    con.execute("INSERT INTO raw_events SELECT * FROM incoming")
    con.unregister("incoming")


SALE = [
    b.click("clk_1", "p1"),
    b.lead("lead_1", "ck_1", click_id="clk_1"),
    b.track_sale("sale_1", "tx_1", 10_000, customer_key="ck_1", occurred_at=at(2)),
    b.track_sale("sale_2", "tx_1", 10_000, customer_key="ck_1", outcome="duplicate"),
]


def table(con: duckdb.DuckDBPyConnection, name: str) -> pl.DataFrame:
    frame: pl.DataFrame = con.sql(f"SELECT * FROM {name}").pl()
    return frame


def materialised(con: duckdb.DuckDBPyConnection, name: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    frame: pl.DataFrame = con.sql(f"SELECT {', '.join(schema)} FROM {name}").pl()
    return frame.select(
        pl.col(c).dt.convert_time_zone("UTC") if dtype == pl.Datetime("us", "UTC") else pl.col(c).cast(dtype)
        for c, dtype in schema.items()
    )


def assert_materialised(con: duckdb.DuckDBPyConnection, expected: Result) -> None:
    """The rc_* tables (and the rc_explain view) hold exactly `expected` (sorted)."""
    for table, (attribute, schema) in {
        **job.TABLES,
        "rc_unroutable": ("unroutable", UNROUTABLE_SCHEMA),
    }.items():
        got = materialised(con, table, schema).sort(ORDERS[attribute], nulls_last=True)
        assert_frame_equal(got, getattr(expected, attribute), check_exact=True)
    steps = con.sql("SELECT * FROM rc_explain").pl().sort("program_id", "sale_id", "step")
    assert_frame_equal(steps, expected.explain, check_dtypes=False)
