"""Human labels for the finance report's fields, shared by the html and xlsx renderers."""

from __future__ import annotations

from reports.checks import CHECK_LABELS, STATUSES

SUMMARY_LABELS: dict[str, str] = {
    "sales_count": "Sales",
    "gross_sales": "Gross sales",
    "tax": "of which tax",
    "refunds_count": "Refunds",
    "refunds": "Refunded",
    "net_sales": "Net sales",
    "attributed_sales_count": "Attributed sales",
    "attributed_sales": "Attributed sales amount",
    "unattributed_sales_count": "Unattributed sales",
    "unattributed_sales": "Unattributed sales amount",
    "test_sales_count": "Test sales (excluded)",
    "test_sales": "Test sales amount (excluded)",
    "unmatched_refunds_count": "Refunds of unknown sales",
    "unmatched_refunds": "Refunds of unknown sales amount",
    "commission_lines": "Commission lines",
    "commissions": "Commissions (net of reversals)",
    "commissions_reversed": "Commissions reversed by refunds",
    "platform_fees": "Platform fees (net of reversals)",
    "platform_fees_reversed": "Platform fees reversed by refunds",
    "adjustments_count": "Adjustment lines",
    "adjustments": "Adjustments (in commissions)",
    "double_counts_count": "Double counts (counted once)",
    "double_counts_amount": "Double counts amount",
}

COLUMN_LABELS: dict[str, str] = {
    "currency": "Currency",
    "status": "Status",
    "partner_code": "Partner",
    "lines": "Lines",
    "commission": "Commission",
    "commission_reversed": "Reversed by refunds",
    "platform_fee": "Platform fee",
    "adjustments": "Adjustments",
    **{s: f"{s.capitalize()}" for s in STATUSES},
    "sale_period": "Sale month",
    "transaction_id": "Transaction",
    "reason": "Reason",
    "sales_count": "Sales",
    "amount": "Amount",
    "kind": "Kind",
    "count": "Count",
    "name": "Check",
    "expected": "Total",
    "actual": "Sum of lines",
    "ok": "OK",
}

# Fields that count things; every other integer field is money in minor units.
COUNT_FIELDS = frozenset(
    {name for name in SUMMARY_LABELS if name.endswith("_count")} | {"commission_lines", "lines", "count"}
)


def is_money(field: str) -> bool:
    return field not in COUNT_FIELDS


def check_label(name: str) -> str:
    return CHECK_LABELS.get(name, name)


# Checks whose totals are counts rather than money.
COUNT_CHECKS = frozenset({"sales_split_count", "partners_lines", "double_count_kinds"})
