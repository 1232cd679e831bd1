"""Human labels: the finance report's fields (html and xlsx renderers) and the codes the
dashboard and the reports show (attribution rules, reasons, statuses, warnings, tracking-log
outcomes, checklist steps). Pages show the label and keep the code on hover (`title`)."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup

from ingest.domain.clock import rfc3339
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
    "commissions": "Commissions (net of reversals; held and void apart)",
    "commissions_reversed": "Commissions reversed by refunds",
    "platform_fees": "Platform fees (net of reversals)",
    "platform_fees_reversed": "Platform fees reversed by refunds",
    "adjustments_count": "Adjustment lines",
    "adjustments": "Adjustments (in commissions)",
    "clawbacks_count": "Clawback lines",
    "clawbacks": "Clawbacks (in commissions)",
    "paid": "Paid out (clawbacks apart)",
    "unpaid": "Not paid out yet (clawbacks apart)",
    "held": "Held (not in commissions)",
    "void": "Void (not in commissions)",
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
    "clawbacks": "Clawbacks",
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
COUNT_CHECKS = frozenset(
    {
        "sales_split_count",
        "partners_lines",
        "double_count_kinds",
        "adjustment_lines_count",
        "clawback_lines_count",
    }
)


# Codes -> labels, by kind. A code without a label is shown humanised (`code_label`).
CODE_LABELS: dict[str, dict[str, str]] = {
    "rule": {
        "click": "Click",
        "promo_code": "Promo code",
        "email": "Email of a lead",
        "processor_customer": "Earlier sale of the same customer",
        "customer_key": "Customer key of a lead",
        "result": "Result",
        "commission": "Commission",
    },
    "reason": {
        "no_attribution_data": "No click, email or customer to go by",
        "click_not_found": "Click not found",
        "customer_not_found": "Customer not found",
        "lead_provisional": "Lead not yet confirmed",
        "subscription_metadata_missing": "Subscription metadata missing",
        "program_mismatch": "Belongs to another program",
        "program_unroutable": "No program to route to",
        "account_not_connected": "No program has this processor account",
        "account_shared": "Several programs share the account; the metadata names none",
        "no_account": "No processor account, and no program named",
        "awaiting_backfill": "A program has the account now: its next backfill picks it up",
        "unknown": "Unknown",
    },
    "status": {
        "pending": "Pending",
        "approved": "Approved",
        "held": "Held",
        "reversed": "Reversed",
        "void": "Void",
        "paid": "Paid",
    },
    "warning": {
        "click_not_found": "Click not found",
        "subscription_metadata_missing": "Subscription metadata missing",
        "metadata_fixed": "Metadata fixed by an engineer",
        "self_referral": "Self-referral",
        "no_flat_amount_for_currency": "No flat commission in this currency",
    },
    "outcome": {
        "accepted": "Accepted",
        "duplicate": "Duplicate (already recorded)",
        "test_mode": "Test sale",
        "unroutable": "No program to route to",
        "unusable": "Unusable (stored, not counted)",
        "picked_up": "Picked up by a backfill (was unroutable)",
    },
    "step": {
        "api_key_generated": "API key generated",
        "test_sale_received": "Test sale received",
        "click_received": "Click received",
        "lead_received": "Lead received",
        "sale_received": "Sale received",
        "processor_event_received": "Payment-processor event received",
    },
    "ladder": {
        "matched": "Matched",
        "not_found": "Not found",
        "no_data": "Nothing to look up",
        "not_tried": "Not tried (an earlier rule matched)",
        "skipped": "Skipped (another program's metadata)",
        "attributed": "Attributed",
        "unattributed": "Unattributed",
        "no_flat_amount_for_currency": "No flat commission in this currency",
    },
    "source": {"connect": "Payment processor", "self_hosted": "Your server"},
    "double_count": {
        "connect_and_self_hosted": "Seen by the processor and your server",
        "self_hosted_repeat": "Sent twice by your server",
        "ingest_refused": "Duplicate refused on arrival",
    },
}


def code_label(kind: str, code: str) -> str:
    """The human label of `code` (a value of the `kind` of code); unknown codes are humanised:
    `rate_limited` -> `Rate limited`."""
    found = CODE_LABELS.get(kind, {}).get(code)
    if found is not None:
        return found
    return code.replace("_", " ").strip().capitalize() or code


MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def date_text(moment: datetime, with_time: bool = True) -> str:
    """A time as people read it, in UTC: `2 Jan 2026, 10:00 UTC` (or `2 Jan 2026`)."""
    utc = moment
    if moment.tzinfo is not None:
        try:
            utc = moment.astimezone(UTC)
        except OverflowError:  # an old stored time at the very edge of the range: shown as stored
            utc = moment
    day = f"{utc.day} {MONTHS[utc.month - 1]} {utc.year}"
    return f"{day}, {utc.hour:02d}:{utc.minute:02d} UTC" if with_time else day


def when_html(moment: datetime | None, with_time: bool = True) -> Markup:
    """`<time>` showing the date (and time, UTC); the full RFC 3339 timestamp on hover."""
    if moment is None:
        return Markup("—")
    full = rfc3339(moment)
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(full, date_text(moment, with_time))


def label_html(kind: str, code: str | None) -> Markup:
    """A code as its human label, the code itself on hover (`title`)."""
    if code is None or code == "":
        return Markup("—")
    return Markup('<span class="code-label" title="{0}">{1}</span>').format(code, code_label(kind, code))
