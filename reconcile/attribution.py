"""The attribution ladder (SEED.md section 6.2), per program, vectorised.

For each counted sale, in this order, the first rule that yields a partner wins:

1. `click`: the sale's click id -> the program's click -> its partner. A click id that the
   program does not know is remembered (`click_not_found`) and the ladder continues.
2. `promo_code`: the sale's promotion code -> the partner the program assigned it to
   (CONTRACT 14; reconcile/promos.py: a checkout's promotion code id, a track sale's code).
3. `email`: the sale's email (normalised) -> the binding settled lead of that email -> partner.
4. `processor_customer`: the sale's processor customer id -> the earliest *earlier* attributed
   sale of that customer in the program (same test/live world) -> its partner.
5. `customer_key`: the sale's customer key -> the binding settled lead of that customer ->
   partner (the first settled lead binds; see reconcile/leads.py).

"Earlier" is the sales' total order (occurred_at, sale_id): earlier business time, ties broken by
the stable sale id, never by arrival order. The earliest attributed sale of a customer is always
attributed by rule 1, 2, 3 or 5 (rule 4 needs an earlier one), so rule 4 reads the customer's first
sale that rules 1, 2, 3 or 5 attribute, if it is earlier than the sale at hand; no iteration
needed. So a renewal (an invoice, which names no promotion code) follows its customer: a
subscription whose checkout a promo code attributed is that partner's by rule 4.

Before the ladder: metadata whose `program_id` names another program is not trusted: the sale
stays unattributed with `program_mismatch`. Sales whose metadata comes from a subscription that
carries none (`metadata_missing`) have no click id or customer key to offer; they can still match
by email or processor customer, and then carry the warning `subscription_metadata_missing`.

An unattributed sale gets one reason, the first that applies: `program_mismatch`,
`subscription_metadata_missing`, `click_not_found`, `lead_provisional` (the customer key or
email has provisional leads and no settled one), `customer_not_found` (some customer data, or a
promotion code no partner has, was given), `no_attribution_data`. (`program_unroutable` belongs
to unroutable events, which are
reported apart and never become sales.)

Warnings, in this order: `click_not_found` (attributed, though the click id it gave is
unknown), `subscription_metadata_missing` (attributed without subscription metadata),
`metadata_fixed` (a backfilled fix applied), `self_referral` (commissioned to a partner whose
email is the customer's: held; see reconcile/commissions.py).
"""

from __future__ import annotations

import polars as pl

from reconcile import leads, promos
from reconcile.lookup import lookup
from reconcile.schema import ENGINE, norm_email

RULES = ("click", "promo_code", "email", "processor_customer", "customer_key")

# The columns of a sale the ladder reads.
INPUT = (
    "program_id",
    "sale_id",
    "source",
    "promo_code",
    "occurred_at",
    "test_mode",
    "click_id",
    "customer_key",
    "email",
    "processor_customer_id",
    "meta_program_id",
    "metadata_missing",
)

# What the ladder leaves per sale: its answer (kept with the sale), and the evidence
# reconcile/explain.py renders (with the answer and the sale's ids, read from the sale).
OUTPUT = (
    "partner_code",
    "attribution_rule",
    "unattributed_reason",
    "click_unknown",
)
EVIDENCE = (
    "program_id",
    "sale_id",
    "mismatch",
    "metadata_missing",
    "meta_program_id",
    "eff_click",
    "click_partner",
    "eff_promo",
    "promo_partner",
    "email_norm",
    "e_lead",
    "e_click",
    "e_partner",
    "e_provisional",
    "f_sale",
    "f_partner",
    "pc_partner",
    "eff_key",
    "k_lead",
    "k_click",
    "k_partner",
    "k_provisional",
)


def _lead_columns(prefix: str) -> dict[str, str]:
    return {
        "bind_lead": f"{prefix}_lead",
        "bind_click": f"{prefix}_click",
        "bind_partner": f"{prefix}_partner",
        "has_provisional": f"{prefix}_provisional",
    }


def _bound(frame: pl.DataFrame, column: str, table: pl.DataFrame, key: str, prefix: str) -> pl.DataFrame:
    keys = frame.select("program_id", pl.col(column).alias(key))
    found = lookup(keys, table, ["program_id", key], list(_lead_columns(prefix)))
    return found.rename(_lead_columns(prefix))


def attribute(
    sales: pl.DataFrame,
    click_table: pl.DataFrame,
    by_key: pl.DataFrame,
    by_email: pl.DataFrame,
    promo_table: pl.DataFrame,
) -> pl.DataFrame:
    """The ladder for each sale (columns INPUT), aligned with `sales`: OUTPUT and EVIDENCE.
    `promo_table`: the partners promo codes name (reconcile/promos.py `assignments`)."""
    mismatch = pl.col("meta_program_id").is_not_null() & (pl.col("meta_program_id") != pl.col("program_id"))
    trusted = ~pl.col("mismatch") & ~pl.col("metadata_missing")
    base = (
        sales.select(INPUT)
        .with_columns(mismatch=mismatch)
        .with_columns(
            eff_click=pl.when(trusted).then(pl.col("click_id")),
            eff_key=pl.when(trusted).then(pl.col("customer_key")),
            eff_promo=pl.when(~pl.col("mismatch")).then(pl.col("promo_code")),
            email_norm=pl.when(~pl.col("mismatch")).then(norm_email(pl.col("email"))),
            pc_id=pl.when(~pl.col("mismatch")).then(pl.col("processor_customer_id")),
        )
    )
    looked = base.with_columns(
        click_partner=leads.click_partner(base, "program_id", "eff_click", click_table),
        promo_partner=promos.partner(base, "eff_promo", promo_table),
    ).hstack(
        [
            *_bound(base, "email_norm", by_email, "email_norm", "e").get_columns(),
            *_bound(base, "eff_key", by_key, "customer_key", "k").get_columns(),
        ]
    )
    looked = looked.with_columns(
        static=pl.coalesce("click_partner", "promo_partner", "e_partner", "k_partner")
    )
    first_static = (
        looked.lazy()
        .filter(pl.col("static").is_not_null() & pl.col("pc_id").is_not_null())
        .select("program_id", "test_mode", "pc_id", "occurred_at", "sale_id", "static")
        .sort("occurred_at", "sale_id")
        .group_by("program_id", "test_mode", "pc_id")
        .agg(
            f_sale=pl.col("sale_id").first(),
            f_occurred=pl.col("occurred_at").first(),
            f_partner=pl.col("static").first(),
        )
    )
    customer = ["program_id", "test_mode", "pc_id"]
    firsts = lookup(looked.select(customer), first_static, customer, ["f_sale", "f_occurred", "f_partner"])
    earlier = (pl.col("f_occurred") < pl.col("occurred_at")) | (
        (pl.col("f_occurred") == pl.col("occurred_at")) & (pl.col("f_sale") < pl.col("sale_id"))
    )
    laddered = looked.hstack(firsts.get_columns()).with_columns(
        pc_partner=pl.when(earlier).then(pl.col("f_partner"))
    )
    partner = pl.coalesce("click_partner", "promo_partner", "e_partner", "pc_partner", "k_partner")
    rule = (
        pl.when(pl.col("click_partner").is_not_null())
        .then(pl.lit("click"))
        .when(pl.col("promo_partner").is_not_null())
        .then(pl.lit("promo_code"))
        .when(pl.col("e_partner").is_not_null())
        .then(pl.lit("email"))
        .when(pl.col("pc_partner").is_not_null())
        .then(pl.lit("processor_customer"))
        .when(pl.col("k_partner").is_not_null())
        .then(pl.lit("customer_key"))
    )
    provisional_only = (pl.col("k_provisional").fill_null(False) & pl.col("k_lead").is_null()) | (
        pl.col("e_provisional").fill_null(False) & pl.col("e_lead").is_null()
    )
    any_customer = (
        pl.col("email_norm").is_not_null()
        | pl.col("pc_id").is_not_null()
        | pl.col("eff_key").is_not_null()
        | pl.col("eff_promo").is_not_null()
    )
    reason = (
        pl.when(pl.col("partner_code").is_not_null())
        .then(None)
        .when(pl.col("mismatch"))
        .then(pl.lit("program_mismatch"))
        .when(pl.col("metadata_missing"))
        .then(pl.lit("subscription_metadata_missing"))
        .when(pl.col("click_unknown"))
        .then(pl.lit("click_not_found"))
        .when(provisional_only)
        .then(pl.lit("lead_provisional"))
        .when(any_customer)
        .then(pl.lit("customer_not_found"))
        .otherwise(pl.lit("no_attribution_data"))
    )
    return (
        laddered.lazy()
        .with_columns(
            partner_code=pl.when(~pl.col("mismatch")).then(partner),
            attribution_rule=pl.when(~pl.col("mismatch")).then(rule),
            click_unknown=pl.col("eff_click").is_not_null() & pl.col("click_partner").is_null(),
        )
        .with_columns(unattributed_reason=reason)
        .select(*OUTPUT, *(c for c in EVIDENCE if c not in OUTPUT))
        .collect(engine=ENGINE)
    )


NO_FLAT_AMOUNT = "no_flat_amount_for_currency"


def warnings(
    attributed: pl.Expr,
    click_unknown: pl.Expr,
    missing: pl.Expr,
    fixed: pl.Expr,
    self_referral: pl.Expr,
    no_flat_amount: pl.Expr,
) -> pl.Expr:
    """The sale's warnings, in this order: click_not_found and subscription_metadata_missing
    (attributed sales only), metadata_fixed, self_referral, no_flat_amount_for_currency (a flat
    rule by currency names no amount for the sale's: reconcile/commissions.py)."""
    joined = pl.concat_str(
        pl.when(attributed & click_unknown).then(pl.lit("click_not_found")),
        pl.when(attributed & missing).then(pl.lit("subscription_metadata_missing")),
        pl.when(fixed).then(pl.lit("metadata_fixed")),
        pl.when(self_referral).then(pl.lit("self_referral")),
        pl.when(no_flat_amount).then(pl.lit(NO_FLAT_AMOUNT)),
        separator=",",
        ignore_nulls=True,
    )
    return pl.when(joined != "").then(joined.str.split(",")).otherwise(pl.lit([], pl.List(pl.String)))
