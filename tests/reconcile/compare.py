"""Run the real reconciler and the reference on the same log and compare every table."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from polars.testing import assert_frame_equal

from reconcile import pipeline
from reconcile.pipeline import Result, reconcile
from reconcile.schema import (
    COMMISSIONS_SCHEMA,
    DOUBLE_COUNTS_SCHEMA,
    EXPLAIN_SCHEMA,
    PAYOUTS_SCHEMA,
    REFUNDS_SCHEMA,
    SALES_SCHEMA,
    UNROUTABLE_SCHEMA,
)
from tests.reconcile.reference import reconcile_reference

TABLES: dict[str, tuple[dict[str, pl.DataType], tuple[str, ...]]] = {
    "sales": (SALES_SCHEMA, pipeline.SALES_ORDER),
    "commissions": (COMMISSIONS_SCHEMA, pipeline.COMMISSIONS_ORDER),
    "refunds": (REFUNDS_SCHEMA, pipeline.REFUNDS_ORDER),
    "double_counts": (DOUBLE_COUNTS_SCHEMA, pipeline.DOUBLES_ORDER),
    "explain": (EXPLAIN_SCHEMA, pipeline.EXPLAIN_ORDER),
    "unroutable": (UNROUTABLE_SCHEMA, pipeline.UNROUTABLE_ORDER),
    "payouts": (PAYOUTS_SCHEMA, pipeline.PAYOUTS_ORDER),
}


def reference_frames(
    raw: pl.DataFrame, programs: pl.DataFrame, partners: pl.DataFrame, now: datetime
) -> dict[str, pl.DataFrame]:
    result = reconcile_reference(raw.to_dicts(), programs.to_dicts(), partners.to_dicts(), now)
    frames = {}
    for name, (schema, order) in TABLES.items():
        rows = [{column: row.get(column) for column in schema} for row in result[name]]
        frames[name] = pl.DataFrame(rows, schema=schema).sort(order, nulls_last=True)
    return frames


def assert_results_equal(left: Result, right: Result) -> None:
    left, right = left.sorted(), right.sorted()
    for name in TABLES:
        assert_frame_equal(getattr(left, name), getattr(right, name), check_exact=True)


def checked(raw: pl.DataFrame, programs: pl.DataFrame, partners: pl.DataFrame, now: datetime) -> Result:
    """The real result (sorted), after asserting that the reference computes exactly the same."""
    real = reconcile(raw, programs, partners, now).sorted()
    expected = reference_frames(raw, programs, partners, now)
    for name in TABLES:
        assert_frame_equal(getattr(real, name), expected[name], check_exact=True)
    return real
