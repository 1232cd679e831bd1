"""The attribution ladder (SEED.md section 6.2), per program, vectorised.

For each counted sale, in this order, the first rule that yields a partner wins:

1. `click`: the sale's click id -> the program's click -> its partner. A click id that the
   program does not know is remembered (`click_not_found`) and the ladder continues.
2. `email`: the sale's email (normalised) -> the binding settled lead of that email -> partner.
3. `processor_customer`: the sale's processor customer id -> the earliest *earlier* attributed
   sale of that customer in the program (same test/live world) -> its partner.
4. `customer_key`: the sale's customer key -> the binding settled lead of that customer ->
   partner (the first settled lead binds; see reconcile/leads.py).

"Earlier" is the sales' total order (occurred_at, sale_id): earlier business time, ties broken by
the stable sale id, never by arrival order. The earliest attributed sale of a customer is always
attributed by rule 1, 2 or 4 (rule 3 needs an earlier one), so rule 3 reads the customer's first
sale that rules 1, 2 or 4 attribute, if it is earlier than the sale at hand; no iteration needed.

Before the ladder: metadata whose `program_id` names another program is not trusted: the sale
stays unattributed with `program_mismatch`. Sales whose metadata comes from a subscription that
carries none (`metadata_missing`) have no click id or customer key to offer; they can still match
by email or processor customer, and then carry the warning `subscription_metadata_missing`.

An unattributed sale gets one reason, the first that applies: `program_mismatch`,
`subscription_metadata_missing`, `click_not_found`, `lead_provisional` (the customer key or
email has provisional leads and no settled one), `customer_not_found` (some customer data was
given), `no_attribution_data`. (`program_unroutable` belongs to unroutable events, which are
reported apart and never become sales.)

Warnings of an attributed sale: `click_not_found` (a click id was given but unknown),
`subscription_metadata_missing`; of any sale: `metadata_fixed` (a backfilled fix applied).
"""

from __future__ import annotations

import polars as pl

from reconcile.schema import norm_email

RULES = ("click", "email", "processor_customer", "customer_key")

# Evidence columns the ladder leaves on each sale for reconcile/explain.py.
EVIDENCE = (
    "mismatch",
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
)


def _lookup_columns(frame: pl.LazyFrame, prefix: str) -> pl.LazyFrame:
    return frame.rename(
        {
            "bind_lead": f"{prefix}_lead",
            "bind_click": f"{prefix}_click",
            "bind_partner": f"{prefix}_partner",
            "has_settled": f"{prefix}_settled",
            "has_provisional": f"{prefix}_provisional",
        }
    )


def attribute(
    sales: pl.LazyFrame,
    click_table: pl.LazyFrame,
    by_key: pl.LazyFrame,
    by_email: pl.LazyFrame,
) -> pl.LazyFrame:
    """Sales with partner_code, attribution_rule, unattributed_reason, warnings and evidence."""
    mismatch = pl.col("meta_program_id").is_not_null() & (pl.col("meta_program_id") != pl.col("program_id"))
    trusted = ~pl.col("mismatch") & ~pl.col("metadata_missing")
    base = sales.with_columns(mismatch=mismatch, email_norm=norm_email(pl.col("email"))).with_columns(
        eff_click=pl.when(trusted).then(pl.col("click_id")),
        eff_key=pl.when(trusted).then(pl.col("customer_key")),
        email_norm=pl.when(~pl.col("mismatch")).then(pl.col("email_norm")),
        pc_id=pl.when(~pl.col("mismatch")).then(pl.col("processor_customer_id")),
    )
    looked = (
        base.join(
            click_table.rename({"click_id": "eff_click", "partner_code": "click_partner"}),
            on=["program_id", "eff_click"],
            how="left",
        )
        .join(
            _lookup_columns(by_email, "e"),
            on=["program_id", "email_norm"],
            how="left",
        )
        .join(
            _lookup_columns(by_key.rename({"customer_key": "eff_key"}), "k"),
            on=["program_id", "eff_key"],
            how="left",
        )
        .with_columns(static=pl.coalesce("click_partner", "e_partner", "k_partner"))
    )
    first_static = (
        looked.filter(pl.col("static").is_not_null() & pl.col("pc_id").is_not_null())
        .sort("occurred_at", "sale_id")
        .group_by("program_id", "test_mode", "pc_id")
        .agg(
            f_sale=pl.col("sale_id").first(),
            f_occurred=pl.col("occurred_at").first(),
            f_partner=pl.col("static").first(),
        )
    )
    earlier = (pl.col("f_occurred") < pl.col("occurred_at")) | (
        (pl.col("f_occurred") == pl.col("occurred_at")) & (pl.col("f_sale") < pl.col("sale_id"))
    )
    laddered = looked.join(first_static, on=["program_id", "test_mode", "pc_id"], how="left").with_columns(
        pc_partner=pl.when(earlier).then(pl.col("f_partner"))
    )
    partner = pl.coalesce("click_partner", "e_partner", "pc_partner", "k_partner")
    rule = (
        pl.when(pl.col("click_partner").is_not_null())
        .then(pl.lit("click"))
        .when(pl.col("e_partner").is_not_null())
        .then(pl.lit("email"))
        .when(pl.col("pc_partner").is_not_null())
        .then(pl.lit("processor_customer"))
        .when(pl.col("k_partner").is_not_null())
        .then(pl.lit("customer_key"))
    )
    click_unknown = pl.col("eff_click").is_not_null() & pl.col("click_partner").is_null()
    provisional_only = (pl.col("k_provisional").fill_null(False) & ~pl.col("k_settled").fill_null(False)) | (
        pl.col("e_provisional").fill_null(False) & ~pl.col("e_settled").fill_null(False)
    )
    any_customer = (
        pl.col("email_norm").is_not_null() | pl.col("pc_id").is_not_null() | pl.col("eff_key").is_not_null()
    )
    reason = (
        pl.when(pl.col("partner_code").is_not_null())
        .then(None)
        .when(pl.col("mismatch"))
        .then(pl.lit("program_mismatch"))
        .when(pl.col("metadata_missing"))
        .then(pl.lit("subscription_metadata_missing"))
        .when(click_unknown)
        .then(pl.lit("click_not_found"))
        .when(provisional_only)
        .then(pl.lit("lead_provisional"))
        .when(any_customer)
        .then(pl.lit("customer_not_found"))
        .otherwise(pl.lit("no_attribution_data"))
    )
    attributed = pl.col("partner_code").is_not_null()
    warnings = pl.concat_list(
        pl.when(attributed & click_unknown).then(pl.lit("click_not_found")),
        pl.when(attributed & pl.col("metadata_missing")).then(pl.lit("subscription_metadata_missing")),
        pl.when(pl.col("fixed")).then(pl.lit("metadata_fixed")),
    ).list.drop_nulls()
    return (
        laddered.with_columns(
            partner_code=pl.when(~pl.col("mismatch")).then(partner),
            attribution_rule=pl.when(~pl.col("mismatch")).then(rule),
        )
        .with_columns(unattributed_reason=reason, warnings=warnings)
        .drop("static", "f_occurred", "pc_id")
    )
