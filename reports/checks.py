"""The finance report's checks: per currency, each total against the sum of its detail lines.

Partner lines sum to the commission, reversal, fee, adjustment, clawback and per-status totals;
statuses other than held and void sum to the commissions, and the held and void ones to their
totals; what is paid, what is not and the clawbacks sum to the commissions (paid + unpaid +
clawbacks = commissions); net = gross - refunds; attributed +
unattributed = all sales; the unattributed reasons and double-count kinds sum to their totals;
the adjustment and clawback sections list as many lines as the summary counts, summing to it.
Totals (`expected`) come from the summary or the by-status section, sums (`actual`) from the
detail sections; each section is computed separately from the month's rows, so a wrong grouping
or a tampered section fails.
"""

from __future__ import annotations

import polars as pl

STATUSES = ("pending", "approved", "held", "reversed", "void", "paid")
APART = ("held", "void")  # statuses the totals leave out, shown apart
INT = pl.Int64()

CHECK_SCHEMA: dict[str, pl.DataType] = {
    "currency": pl.String(),
    "name": pl.String(),
    "expected": INT,
    "actual": INT,
    "ok": pl.Boolean(),
}


CHECK_LABELS = {
    "net_sales": "net sales = gross sales - refunds",
    "sales_split_count": "attributed + unattributed sales = all sales (count)",
    "sales_split_amount": "attributed + unattributed sales = gross sales",
    "unattributed_reasons": "unattributed reasons sum to unattributed sales",
    "partners_commissions": "partner lines sum to commissions",
    "partners_commissions_reversed": "partner lines sum to commissions reversed",
    "partners_platform_fees": "partner lines sum to platform fees",
    "partners_adjustments": "partner lines sum to adjustments",
    "partners_clawbacks": "partner lines sum to clawbacks",
    "payouts_commissions": "paid + unpaid + clawbacks = commissions",
    "partners_lines": "partner lines sum to the commission line count",
    "statuses_commissions": "statuses (held and void apart) sum to commissions",
    "statuses_held": "held lines sum to held",
    "statuses_void": "void lines sum to void",
    **{f"partners_{s}": f"partner lines sum to {s} commissions" for s in STATUSES},
    "adjustment_lines": "adjustment lines sum to adjustments",
    "adjustment_lines_count": "adjustment lines listed = adjustment lines",
    "clawback_lines": "clawback lines sum to clawbacks",
    "clawback_lines_count": "clawback lines listed = clawback lines",
    "double_count_kinds": "double-count kinds sum to double counts",
}


def verify(
    *,
    summary: pl.DataFrame,
    by_status: pl.DataFrame,
    by_partner: pl.DataFrame,
    adjustments: pl.DataFrame,
    clawbacks: pl.DataFrame,
    unattributed: pl.DataFrame,
    double_counts: pl.DataFrame,
) -> pl.DataFrame:
    """Per currency, each total (`expected`) against the sum of its detail lines (`actual`)."""
    rows: list[tuple[str, str, int, int]] = []
    for s in summary.iter_rows(named=True):
        c = s["currency"]
        rows += [
            (c, "net_sales", s["gross_sales"] - s["refunds"], s["net_sales"]),
            (
                c,
                "sales_split_count",
                s["sales_count"],
                s["attributed_sales_count"] + s["unattributed_sales_count"],
            ),
            (c, "sales_split_amount", s["gross_sales"], s["attributed_sales"] + s["unattributed_sales"]),
            (c, "unattributed_reasons", s["unattributed_sales"], _total(unattributed, c, "amount")),
            (c, "partners_commissions", s["commissions"], _total(by_partner, c, "commission")),
            (
                c,
                "partners_commissions_reversed",
                s["commissions_reversed"],
                _total(by_partner, c, "commission_reversed"),
            ),
            (c, "partners_platform_fees", s["platform_fees"], _total(by_partner, c, "platform_fee")),
            (c, "partners_adjustments", s["adjustments"], _total(by_partner, c, "adjustments")),
            (c, "partners_clawbacks", s["clawbacks"], _total(by_partner, c, "clawbacks")),
            (c, "payouts_commissions", s["commissions"], s["paid"] + s["unpaid"] + s["clawbacks"]),
            (c, "partners_lines", s["commission_lines"], _total(by_partner, c, "lines")),
            (
                c,
                "statuses_commissions",
                s["commissions"],
                sum(_total(by_status, c, "commission", st) for st in STATUSES if st not in APART),
            ),
            (c, "statuses_held", s["held"], _total(by_status, c, "commission", "held")),
            (c, "statuses_void", s["void"], _total(by_status, c, "commission", "void")),
            *(
                (c, f"partners_{st}", _total(by_status, c, "commission", st), _total(by_partner, c, st))
                for st in STATUSES
            ),
            (c, "adjustment_lines", s["adjustments"], _total(adjustments, c, "commission")),
            (c, "adjustment_lines_count", s["adjustments_count"], _count(adjustments, c)),
            (c, "clawback_lines", s["clawbacks"], _total(clawbacks, c, "commission")),
            (c, "clawback_lines_count", s["clawbacks_count"], _count(clawbacks, c)),
            (c, "double_count_kinds", s["double_counts_count"], _total(double_counts, c, "count")),
        ]
    checks = pl.DataFrame(rows, schema={k: v for k, v in CHECK_SCHEMA.items() if k != "ok"}, orient="row")
    return checks.with_columns(ok=pl.col("expected") == pl.col("actual"))


def _count(frame: pl.DataFrame, currency: str) -> int:
    return frame.filter(pl.col("currency") == currency).height


def _total(frame: pl.DataFrame, currency: str, column: str, status: str | None = None) -> int:
    mine = frame.filter(pl.col("currency") == currency)
    if status is not None:
        mine = mine.filter(pl.col("status") == status)
    return int(mine.get_column(column).sum())
