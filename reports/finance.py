"""The finance report of one program and month: a pure builder over the materialised frames.

What each figure means (all integer minor units, one row per currency, currencies never summed):

- Sales are the program's reconciled sales that *occurred* in the month (rc_sales.period), or,
  for a sale logged after its month was closed, were logged in it (rc_sales.booked_period,
  reconcile/latecomers.py): a closed month's figures never change. Test
  sales are left out of every figure and only counted (`test_sales_count`, `test_sales`).
  `gross_sales` is what customers paid (tax included), `tax` its tax part; each sale is either
  attributed (to a partner) or unattributed (with its one reason).
- Refunds are the refunds that *occurred* in the month (rc_refunds.period), whichever month their
  sale is in: `refunds` is the amount applied to real sales (capped at each sale), `net_sales` is
  `gross_sales - refunds`. Refunds whose sale is unknown are listed apart (`unmatched_refunds`).
- Commissions are the ledger lines of the month (rc_commissions.period): `commission` lines of
  sales of the month, `clawback` lines (refunds of approved or paid commissions, booked in the
  refund's month) and `adjustment` lines (later partner changes and corrections to closed months,
  booked here) and `manual` lines (owners' entries). Held and void lines are in none of the
  totals but their own: `held` and `void` (what they would have earned), and their platform
  fee is held or void with them. `commissions` and `platform_fees` are net of the reversals
  refunds caused (`*_reversed`), so a closed month keeps the values it was closed with.
  `adjustments` and `clawbacks` are the parts of `commissions` those lines carry; the
  `adjustments` and `clawbacks` sections list exactly those lines, one section each
  (`adjustments_count` and `clawbacks_count` rows).
- Payouts: of the month's commissions, `paid` is what paid payout batches took (clawbacks
  apart: money sent), `unpaid` the rest (clawbacks apart: approved or pending, owed), `clawbacks`
  the clawback lines, paid or not; they add up to `commissions`.
- Double counts are the sales seen twice (connect + self-hosted, repeats, duplicates refused at
  ingest) whose record occurred in the month; each was counted once. Their amounts count each
  sale once too (rc_double_counts.distinct_amount: a refused retry is a line, not more money).

`provenance` (set by the loader, reports/load.py) says when the report was built, from which
reconcile run, and whether the month is closed (when, by whom); the html and xlsx show all of
it, the JSON and CSV whether the month is closed (`closed`, `closed_at`, `closed_by`: nothing
in them depends on when they were rendered).

`checks` shows that the detail lines reconcile with the totals (reports/checks.py); `rechecked`
recomputes them from the sections, so a tampered section shows as a failed check.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import polars as pl

from reconcile.schema import period_of
from reports.checks import STATUSES, verify
from reports.money import NO_CURRENCY

if TYPE_CHECKING:
    from reconcile.pipeline import Result

INT = pl.Int64()

SALE_INPUT: dict[str, pl.DataType] = {
    "currency": pl.String(),
    "gross_amount": INT,
    "tax": INT,
    "test_mode": pl.Boolean(),
    "partner_code": pl.String(),
    "unattributed_reason": pl.String(),
}
LINE_INPUT: dict[str, pl.DataType] = {
    "currency": pl.String(),
    "partner_code": pl.String(),
    "kind": pl.String(),
    "status": pl.String(),
    "amount": INT,
    "reversed": INT,
    "platform_fee": INT,
    "platform_fee_reversed": INT,
    "sale_period": pl.String(),
    "transaction_id": pl.String(),
}
REFUND_INPUT: dict[str, pl.DataType] = {
    "currency": pl.String(),
    "amount": INT,
    "applied_amount": INT,
    "outcome": pl.String(),
    "test_mode": pl.Boolean(),
}
DOUBLE_INPUT: dict[str, pl.DataType] = {"currency": pl.String(), "kind": pl.String(), "distinct_amount": INT}

SUMMARY_COLUMNS = (
    "currency",
    "sales_count",
    "gross_sales",
    "tax",
    "refunds_count",
    "refunds",
    "net_sales",
    "attributed_sales_count",
    "attributed_sales",
    "unattributed_sales_count",
    "unattributed_sales",
    "test_sales_count",
    "test_sales",
    "unmatched_refunds_count",
    "unmatched_refunds",
    "commission_lines",
    "commissions",
    "commissions_reversed",
    "platform_fees",
    "platform_fees_reversed",
    "adjustments_count",
    "adjustments",
    "clawbacks_count",
    "clawbacks",
    "paid",
    "unpaid",
    "held",
    "void",
    "double_counts_count",
    "double_counts_amount",
)


@dataclass(frozen=True)
class Provenance:
    """Where a report's figures come from: built at `generated_at` from the tables of reconcile
    run `run_id` (None before the first run); `closed_at` when the month is closed (its figures
    are then the books as of the close, recomputed from the log before it)."""

    generated_at: datetime
    run_id: str | None
    run_finished_at: datetime | None
    closed_at: datetime | None
    closed_by: str | None = None  # who closed it: an account id or `operator`


@dataclass(frozen=True)
class FinanceReport:
    """The finance report's sections, each a small frame with a `currency` column."""

    program_id: str
    period: str
    program_name: str | None
    summary: pl.DataFrame
    by_status: pl.DataFrame
    by_partner: pl.DataFrame
    adjustments: pl.DataFrame
    clawbacks: pl.DataFrame
    unattributed: pl.DataFrame
    double_counts: pl.DataFrame
    checks: pl.DataFrame
    provenance: Provenance | None = None

    @property
    def currencies(self) -> tuple[str, ...]:
        return tuple(self.summary.get_column("currency").to_list())

    @property
    def reconciled(self) -> bool:
        """True when every check passes (and vacuously for a month without activity)."""
        return bool(self.checks.get_column("ok").all())


def _prepare(frame: pl.DataFrame, columns: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Exactly `columns`, typed; money nulls are 0, a missing currency is `xxx`."""
    exprs: list[pl.Expr] = []
    for name, dtype in columns.items():
        col = pl.col(name).cast(dtype)
        if dtype == INT:
            col = col.fill_null(0)
        elif dtype == pl.Boolean():
            col = col.fill_null(False)
        elif name == "currency":
            col = col.str.to_lowercase().fill_null(NO_CURRENCY)
        exprs.append(col.alias(name))
    return frame.lazy().select(exprs)


def _sum_if(column: str, condition: pl.Expr) -> pl.Expr:
    return pl.col(column).filter(condition).sum()


def _count_if(condition: pl.Expr) -> pl.Expr:
    return condition.cast(INT).sum()


def build_finance(
    *,
    program_id: str,
    period: str,
    sales: pl.DataFrame,
    commissions: pl.DataFrame,
    refunds: pl.DataFrame,
    double_counts: pl.DataFrame,
    program_name: str | None = None,
) -> FinanceReport:
    """The report from the month's rows of one program (columns: *_INPUT; extra ones ignored).

    `sales` and `commissions` are the rows of the month, `refunds` the refunds that occurred in
    it with their sale's `test_mode`, `double_counts` those whose record occurred in it.
    """
    sale = _prepare(sales, SALE_INPUT)
    line = _prepare(commissions, LINE_INPUT)
    refund = _prepare(refunds, REFUND_INPUT).filter(~pl.col("test_mode"))
    double = _prepare(double_counts, DOUBLE_INPUT)
    real = sale.filter(~pl.col("test_mode"))
    attributed = pl.col("partner_code").is_not_null()
    adjustment = pl.col("kind") == "adjustment"
    clawback = pl.col("kind") == "clawback"
    paid = pl.col("status") == "paid"
    # a held or void line's platform fee is held or void with it (reconcile/bookings.py)
    charged = ~pl.col("status").is_in(["held", "void"])
    applied = pl.col("outcome") == "applied"
    unmatched = pl.col("outcome") == "sale_not_found"
    parts = [
        real.group_by("currency").agg(
            sales_count=pl.len().cast(INT),
            gross_sales=pl.col("gross_amount").sum(),
            tax=pl.col("tax").sum(),
            attributed_sales_count=_count_if(attributed),
            attributed_sales=_sum_if("gross_amount", attributed),
            unattributed_sales_count=_count_if(~attributed),
            unattributed_sales=_sum_if("gross_amount", ~attributed),
        ),
        sale.filter(pl.col("test_mode"))
        .group_by("currency")
        .agg(test_sales_count=pl.len().cast(INT), test_sales=pl.col("gross_amount").sum()),
        refund.group_by("currency").agg(
            refunds_count=_count_if(applied),
            refunds=_sum_if("applied_amount", applied),
            unmatched_refunds_count=_count_if(unmatched),
            unmatched_refunds=_sum_if("amount", unmatched),
        ),
        line.group_by("currency").agg(
            commission_lines=pl.len().cast(INT),
            commissions=_sum_if("amount", charged),
            commissions_reversed=_sum_if("reversed", charged),
            platform_fees=_sum_if("platform_fee", charged),
            platform_fees_reversed=_sum_if("platform_fee_reversed", charged),
            adjustments_count=_count_if(adjustment & charged),
            adjustments=_sum_if("amount", adjustment & charged),
            clawbacks_count=_count_if(clawback & charged),
            clawbacks=_sum_if("amount", clawback & charged),
            paid=_sum_if("amount", paid & ~clawback),
            unpaid=_sum_if("amount", ~paid & ~clawback & charged),
            held=_sum_if("amount", pl.col("status") == "held"),
            void=_sum_if("amount", pl.col("status") == "void"),
        ),
        double.group_by("currency").agg(
            double_counts_count=pl.len().cast(INT), double_counts_amount=pl.col("distinct_amount").sum()
        ),
    ]
    currencies = pl.concat([p.select("currency") for p in parts]).unique()
    summary = currencies
    for part in parts:
        summary = summary.join(part, on="currency", how="left")
    summary = (
        summary.with_columns(pl.exclude("currency").fill_null(0))
        .with_columns(net_sales=pl.col("gross_sales") - pl.col("refunds"))
        .select(SUMMARY_COLUMNS)
        .sort("currency")
    )
    by_status = _by_status(line)
    by_partner = line.group_by("currency", "partner_code").agg(
        lines=pl.len().cast(INT),
        commission=_sum_if("amount", charged),
        commission_reversed=_sum_if("reversed", charged),
        platform_fee=_sum_if("platform_fee", charged),
        adjustments=_sum_if("amount", adjustment & charged),
        clawbacks=_sum_if("amount", clawback & charged),
        **{status: _sum_if("amount", pl.col("status") == status) for status in STATUSES},
    )
    corrections = {
        "currency": "currency",
        "sale_period": "sale_period",
        "transaction_id": "transaction_id",
        "partner_code": "partner_code",
        "kind": "kind",
        "status": "status",
        "commission": "amount",
        "commission_reversed": "reversed",
        "platform_fee": "platform_fee",
    }
    order = ["currency", "sale_period", "transaction_id", "partner_code"]
    adjustments, clawbacks = (
        line.filter(kind & charged).select(**corrections).sort(order, nulls_last=True)
        for kind in (adjustment, clawback)
    )
    unattributed = (
        real.filter(~attributed)
        .group_by("currency", reason=pl.col("unattributed_reason").fill_null("unknown"))
        .agg(sales_count=pl.len().cast(INT), amount=pl.col("gross_amount").sum())
    )
    doubles = double.group_by("currency", "kind").agg(
        count=pl.len().cast(INT), amount=pl.col("distinct_amount").sum()
    )
    frames = pl.collect_all(
        [
            summary,
            by_status,
            by_partner.sort(
                ["currency", "commission", "partner_code"], descending=[False, True, False], nulls_last=True
            ),
            adjustments,
            clawbacks,
            unattributed.sort("currency", "reason"),
            doubles.sort("currency", "kind"),
        ]
    )
    names = (
        "summary",
        "by_status",
        "by_partner",
        "adjustments",
        "clawbacks",
        "unattributed",
        "double_counts",
    )
    sections: dict[str, Any] = dict(zip(names, frames, strict=True))
    return FinanceReport(
        program_id=program_id,
        period=period,
        program_name=program_name,
        checks=verify(**sections),
        **sections,
    )


def _by_status(line: pl.LazyFrame) -> pl.LazyFrame:
    """Every status for every currency with lines (zeros included), in STATUSES order."""
    order = pl.DataFrame({"status": list(STATUSES), "rank": list(range(len(STATUSES)))}).lazy()
    totals = line.group_by("currency", "status").agg(
        lines=pl.len().cast(INT),
        commission=pl.col("amount").sum(),
        commission_reversed=pl.col("reversed").sum(),
        platform_fee=pl.col("platform_fee").sum(),
    )
    return (
        line.select("currency")
        .unique()
        .join(order, how="cross")
        .join(totals, on=["currency", "status"], how="left")
        .with_columns(pl.col("lines", "commission", "commission_reversed", "platform_fee").fill_null(0))
        .sort("currency", "rank")
        .drop("rank")
    )


def rechecked(report: FinanceReport) -> FinanceReport:
    """The same report with its checks recomputed from its sections (after any change)."""
    return replace(
        report,
        checks=verify(
            summary=report.summary,
            by_status=report.by_status,
            by_partner=report.by_partner,
            adjustments=report.adjustments,
            clawbacks=report.clawbacks,
            unattributed=report.unattributed,
            double_counts=report.double_counts,
        ),
    )


def from_result(
    result: Result, program_id: str, period: str, program_name: str | None = None
) -> FinanceReport:
    """The report straight from a pipeline result (what the loader reads back from DuckDB)."""
    mine = pl.col("program_id") == program_id
    sale_modes = result.sales.filter(mine).select("sale_id", "test_mode")
    refunds = (
        result.refunds.filter(mine & (pl.col("booked_period") == period))
        .drop("test_mode", strict=False)
        .join(sale_modes, on="sale_id", how="left")
    )
    return build_finance(
        program_id=program_id,
        period=period,
        program_name=program_name,
        sales=result.sales.filter(mine & (pl.col("booked_period") == period)),
        commissions=result.commissions.filter(mine & (pl.col("period") == period)),
        refunds=refunds,
        double_counts=result.double_counts.filter(mine & (period_of(pl.col("occurred_at")) == period)),
    )
