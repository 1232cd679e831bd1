"""explain: the ladder of a sale, step by step, rendered from the evidence the ladder left.

The reconciler keeps per sale only the evidence (`Result.evidence`, table `rc_evidence`; columns
in reconcile/schema.py EVIDENCE_SCHEMA): what each rule looked up and what it found, as ids. What
the sale itself holds (its transaction id, processor customer, partner, rule, reason) is read
from the sale (`rc_sales`), not stored twice. One SQL query renders them as six rows per sale,
the five rules in ladder order then `result` (a seventh, below, for a sale a flat rule pays
nothing); it is both the view `rc_explain` the job creates over `rc_evidence` and `rc_sales` (so
a read of one sale renders one sale) and, run on an in-memory DuckDB, `steps()` (so the two can
never disagree).

- `looked_up`: what the rule looked for (`svc_click_id=...`, `promo_code=...`, `email=...`,
  `processor_customer_id=...`, `svc_customer_key=...`), null when the sale had nothing for it
  or the rule was not tried.
- `found`: what the lookup found, in words.
- `result`: `matched` | `not_found` | `no_data` (nothing to look up) | `not_tried` (an earlier
  rule matched) | `skipped` (metadata of another program). The sixth row (`rule` = `result`) has
  `attributed` or `unattributed`, with `found` saying by whom and which rule, or the reason.

A sale a flat rule by currency pays nothing (its warning `no_flat_amount_for_currency`,
reconcile/commissions.py) has a seventh row, `rule` = `commission`: `looked_up` its currency,
`found` why it earns nothing, `result` = `no_flat_amount_for_currency` (CONTRACT 15).
"""

from __future__ import annotations

import duckdb
import polars as pl

from reconcile.attribution import NO_FLAT_AMOUNT
from reconcile.schema import EXPLAIN_SCHEMA

_LEAD_NOT_FOUND = """CASE WHEN {p}_lead IS NOT NULL
            THEN 'settled lead ' || {p}_lead || ' has no partner''s click'
            WHEN coalesce({p}_provisional, false) THEN 'only provisional leads'
            ELSE 'no lead with this {what}' END"""
_LEAD_MATCHED = "'settled lead ' || {p}_lead || ' with click ' || {p}_click || ' of partner ' || {p}_partner"
_MISSING = "CASE WHEN metadata_missing THEN 'subscription metadata missing' END"

# (step, rule, value, label, partner, matched text, not-found text, no-data text)
_STEPS = (
    (
        1,
        "click",
        "eff_click",
        "svc_click_id",
        "click_partner",
        "'click ' || eff_click || ' of partner ' || click_partner",
        "'no click with this id in the program'",
        _MISSING,
    ),
    (
        2,
        "promo_code",
        "eff_promo",
        "promo_code",
        "promo_partner",
        "'promo code ' || eff_promo || ' of partner ' || promo_partner",
        "'no partner has this promo code'",
        "NULL",
    ),
    (
        3,
        "email",
        "email_norm",
        "email",
        "e_partner",
        _LEAD_MATCHED.format(p="e"),
        _LEAD_NOT_FOUND.format(p="e", what="email"),
        "NULL",
    ),
    (
        4,
        "processor_customer",
        "processor_customer_id",
        "processor_customer_id",
        "pc_partner",
        "'earlier attributed sale ' || f_sale || ' of partner ' || f_partner",
        "'no earlier attributed sale of this customer'",
        "NULL",
    ),
    (
        5,
        "customer_key",
        "eff_key",
        "svc_customer_key",
        "k_partner",
        _LEAD_MATCHED.format(p="k"),
        _LEAD_NOT_FOUND.format(p="k", what="customer key"),
        _MISSING,
    ),
)
RESULT_STEP = len(_STEPS) + 1
COMMISSION_STEP = RESULT_STEP + 1


def _ladder_step(step: int, rule: str, value: str, label: str, partner: str, *texts: str) -> str:
    matched, not_found, no_data = texts
    return f"""SELECT program_id, sale_id, transaction_id, {step} AS step, '{rule}' AS rule,
        CASE WHEN mismatch THEN 'skipped'
             WHEN rule_index < {step} THEN 'not_tried'
             WHEN {value} IS NULL THEN 'no_data'
             WHEN {partner} IS NOT NULL THEN 'matched'
             ELSE 'not_found' END AS result,
        '{label}=' || {value} AS looked_up_text,
        {matched} AS matched_text, {not_found} AS not_found_text, {no_data} AS no_data_text
    FROM ranked"""


def query(evidence: str, sales: str) -> str:
    """The explain steps of every sale in the table (or view) named `evidence`, whose sales are
    in `sales`."""
    ladder = "\n    UNION ALL ".join(_ladder_step(*spec) for spec in _STEPS)
    return f"""WITH ranked AS (
    SELECT e.*, s.transaction_id, s.processor_customer_id, s.partner_code, s.attribution_rule,
        s.unattributed_reason, s.currency, s.warnings,
        CASE s.attribution_rule WHEN 'click' THEN 1 WHEN 'promo_code' THEN 2 WHEN 'email' THEN 3
            WHEN 'processor_customer' THEN 4 WHEN 'customer_key' THEN 5 ELSE 9 END AS rule_index
    FROM {evidence} AS e JOIN {sales} AS s USING (program_id, sale_id)
), ladder AS (
    {ladder}
)
SELECT program_id, sale_id, transaction_id, CAST(step AS BIGINT) AS step, rule,
    CASE WHEN result IN ('matched', 'not_found') THEN looked_up_text END AS looked_up,
    CASE result WHEN 'matched' THEN matched_text WHEN 'not_found' THEN not_found_text
        WHEN 'no_data' THEN no_data_text END AS found,
    result
FROM ladder
UNION ALL
SELECT program_id, sale_id, transaction_id, CAST({RESULT_STEP} AS BIGINT) AS step, 'result' AS rule,
    CASE WHEN mismatch THEN 'program_id=' || meta_program_id END AS looked_up,
    CASE WHEN partner_code IS NOT NULL THEN 'partner ' || partner_code || ' by rule ' || attribution_rule
        ELSE unattributed_reason END AS found,
    CASE WHEN partner_code IS NOT NULL THEN 'attributed' ELSE 'unattributed' END AS result
FROM ranked
UNION ALL
SELECT program_id, sale_id, transaction_id, CAST({COMMISSION_STEP} AS BIGINT) AS step, 'commission' AS rule,
    'currency=' || currency AS looked_up,
    'the flat commission names no amount for ' || coalesce(upper(currency), 'a sale without a currency')
        || ': the sale earns no commission' AS found,
    '{NO_FLAT_AMOUNT}' AS result
FROM ranked WHERE array_position(warnings, '{NO_FLAT_AMOUNT}') IS NOT NULL"""


def view_ddl() -> str:
    """The view `rc_explain` the job creates: explain steps over `rc_evidence` and `rc_sales`."""
    return f"CREATE OR REPLACE VIEW rc_explain AS {query('rc_evidence', 'rc_sales')}"


def steps(evidence: pl.DataFrame, sales: pl.DataFrame) -> pl.DataFrame:
    """The explain steps (six rows per sale, a seventh for a sale the flat rule pays nothing)
    of the sales in `evidence` (the sales themselves in `sales`), in order."""
    with duckdb.connect() as con:
        con.register("evidence", evidence.to_arrow())
        con.register("sales", sales.to_arrow())
        frame: pl.DataFrame = con.sql(
            f"SELECT * FROM ({query('evidence', 'sales')}) ORDER BY program_id, sale_id, step"
        ).pl()
    return frame.select(pl.col(name).cast(dtype) for name, dtype in EXPLAIN_SCHEMA.items())
