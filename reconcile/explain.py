"""explain: the ladder of every sale, step by step, as a long frame.

Five rows per sale (step 1..5): the four rules in ladder order, then `result`.

- `looked_up`: what the rule looked for (`svc_click_id=...`, `email=...`,
  `processor_customer_id=...`, `svc_customer_key=...`), null when the sale had nothing for it
  or the rule was not tried.
- `found`: what the lookup found, in words.
- `result`: `matched` | `not_found` | `no_data` (nothing to look up) | `not_tried` (an earlier
  rule matched) | `skipped` (metadata of another program); for the last row `attributed` or
  `unattributed`, with `found` saying by whom and which rule, or the reason.
"""

from __future__ import annotations

import polars as pl

MISSING = "subscription metadata missing"


def _lead_found(prefix: str, what: str) -> pl.Expr:
    return (
        pl.when(pl.col(f"{prefix}_lead").is_not_null())
        .then(pl.format("settled lead {} has no partner's click", f"{prefix}_lead"))
        .when(pl.col(f"{prefix}_provisional").fill_null(False))
        .then(pl.lit("only provisional leads"))
        .otherwise(pl.lit(f"no lead with this {what}"))
    )


def _step(
    number: int,
    rule: str,
    value: pl.Expr,
    label: str,
    partner: pl.Expr,
    matched_text: pl.Expr,
    not_found_text: pl.Expr,
    no_data_text: pl.Expr | None = None,
) -> list[pl.Expr]:
    earlier_rule = pl.col("rule_index") < number
    result = (
        pl.when(pl.col("mismatch"))
        .then(pl.lit("skipped"))
        .when(earlier_rule)
        .then(pl.lit("not_tried"))
        .when(value.is_null())
        .then(pl.lit("no_data"))
        .when(partner.is_not_null())
        .then(pl.lit("matched"))
        .otherwise(pl.lit("not_found"))
    )
    tried = pl.col("result").is_in(["matched", "not_found"])
    no_data = pl.lit(None, pl.String) if no_data_text is None else no_data_text
    found = (
        pl.when(pl.col("result") == "matched")
        .then(matched_text)
        .when(pl.col("result") == "not_found")
        .then(not_found_text)
        .when(pl.col("result") == "no_data")
        .then(no_data)
    )
    return [
        pl.lit(number, pl.Int64).alias("step"),
        pl.lit(rule).alias("rule"),
        result.alias("result"),
        pl.when(tried).then(pl.lit(f"{label}=") + value).alias("looked_up"),
        found.alias("found"),
    ]


def steps(attributed: pl.LazyFrame) -> pl.LazyFrame:
    """The explain frame for sales carrying the evidence of reconcile/attribution.py."""
    rule_index = (
        pl.when(pl.col("attribution_rule") == "click")
        .then(1)
        .when(pl.col("attribution_rule") == "email")
        .then(2)
        .when(pl.col("attribution_rule") == "processor_customer")
        .then(3)
        .when(pl.col("attribution_rule") == "customer_key")
        .then(4)
        .otherwise(9)
    )
    base = attributed.select(
        "program_id",
        "sale_id",
        "transaction_id",
        "mismatch",
        "metadata_missing",
        "meta_program_id",
        "processor_customer_id",
        "partner_code",
        "attribution_rule",
        "unattributed_reason",
        "eff_click",
        "click_partner",
        "email_norm",
        "e_lead",
        "e_click",
        "e_partner",
        "e_settled",
        "e_provisional",
        "f_sale",
        "f_partner",
        "pc_partner",
        "eff_key",
        "k_lead",
        "k_click",
        "k_partner",
        "k_settled",
        "k_provisional",
        rule_index=rule_index,
    )
    missing = pl.when(pl.col("metadata_missing")).then(pl.lit(MISSING))
    specs = [
        _step(
            1,
            "click",
            pl.col("eff_click"),
            "svc_click_id",
            pl.col("click_partner"),
            pl.format("click {} of partner {}", "eff_click", "click_partner"),
            pl.lit("no click with this id in the program"),
            missing,
        ),
        _step(
            2,
            "email",
            pl.col("email_norm"),
            "email",
            pl.col("e_partner"),
            pl.format("settled lead {} with click {} of partner {}", "e_lead", "e_click", "e_partner"),
            _lead_found("e", "email"),
        ),
        _step(
            3,
            "processor_customer",
            pl.col("processor_customer_id"),
            "processor_customer_id",
            pl.col("pc_partner"),
            pl.format("earlier attributed sale {} of partner {}", "f_sale", "f_partner"),
            pl.lit("no earlier attributed sale of this customer"),
        ),
        _step(
            4,
            "customer_key",
            pl.col("eff_key"),
            "svc_customer_key",
            pl.col("k_partner"),
            pl.format("settled lead {} with click {} of partner {}", "k_lead", "k_click", "k_partner"),
            _lead_found("k", "customer key"),
            missing,
        ),
    ]
    ids = ["program_id", "sale_id", "transaction_id"]
    frames = []
    for step, rule, result, looked_up, found in specs:
        frames.append(
            base.with_columns(step, rule, result)
            .with_columns(looked_up, found)
            .select(*ids, "step", "rule", "looked_up", "found", "result")
        )
    attributed_now = pl.col("partner_code").is_not_null()
    frames.append(
        base.select(
            *ids,
            step=pl.lit(5, pl.Int64),
            rule=pl.lit("result"),
            looked_up=pl.when(pl.col("mismatch")).then(pl.lit("program_id=") + pl.col("meta_program_id")),
            found=pl.when(attributed_now)
            .then(pl.format("partner {} by rule {}", "partner_code", "attribution_rule"))
            .otherwise(pl.col("unattributed_reason")),
            result=pl.when(attributed_now).then(pl.lit("attributed")).otherwise(pl.lit("unattributed")),
        )
    )
    return pl.concat(frames)
