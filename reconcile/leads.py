"""Clicks and leads: the lookup tables the attribution ladder reads.

- A click (accepted `track` row of kind `click`) maps its click id to the partner code it was
  recorded for, within its program (should an id be recorded twice, the first in
  (occurred_at, event_id) counts).
- A lead is *settled* when ingest recorded it so (`lead_status = 'settled'`: a server-mode
  lead, or a browser lead on a program that does not require server-side leads); otherwise it is
  provisional and never attributes by itself.
- A provisional browser lead is settled by a later server-mode lead for the same customer. The
  settled lead's click is its own click id, or, when it carries none, the click of the customer's
  earliest provisional lead that has one, provided that provisional lead occurred no later than
  the settled one.
- The first settled lead of a customer, in the order (occurred_at, lead_id), *binds* the
  customer to the partner of its click; later leads do not rebind. When that lead has no click,
  or a click unknown to the program, the customer is bound to no partner. The same holds for an
  email: its earliest settled lead decides.

`lookup_table(key)` gives, per program and customer key (or normalised email): the binding lead
(lead id, click id, partner code) if any settled lead exists, and whether provisional leads
exist, which the ladder needs to name its reason (`lead_provisional`).
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from reconcile.lookup import lookup
from reconcile.schema import ENGINE, norm_email

LeadKey = Literal["customer_key", "email_norm"]


_ROW = "__lead"
CLICK_COLUMNS = ("program_id", "click_id", "partner_code", "occurred_at", "event_id")


def clicks(raw: pl.LazyFrame) -> pl.DataFrame:
    """Accepted clicks: program_id, click_id, partner_code, and (occurred_at, event_id), the
    order in which the first of a repeated click id wins (see `click_partner`)."""
    return (
        raw.filter(
            (pl.col("kind") == "click")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("click_id").is_not_null()
            & pl.col("partner_code").is_not_null()
        )
        .select(CLICK_COLUMNS)
        .collect(engine=ENGINE)
    )


def click_partner(frame: pl.DataFrame, program: str, click: str, click_table: pl.DataFrame) -> pl.Series:
    """The partner of each row's click (columns `program`, `click`), aligned with `frame`."""
    keys = frame.select(pl.col(program).alias("program_id"), pl.col(click).alias("click_id"))
    found = lookup(
        keys, click_table, ["program_id", "click_id"], ["partner_code"], order=["occurred_at", "event_id"]
    )
    return found.get_column("partner_code")


def leads(raw: pl.LazyFrame, click_table: pl.DataFrame) -> pl.DataFrame:
    """Every accepted lead; settled ones with their effective click and its partner."""
    base = (
        raw.filter(
            (pl.col("kind") == "lead")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
        )
        .select(
            "program_id",
            "customer_key",
            "occurred_at",
            lead_id=pl.col("event_id"),
            email_norm=norm_email(pl.col("email")),
            settled=(pl.col("lead_status") == "settled").fill_null(False),
            own_click=pl.col("click_id"),
        )
        .collect(engine=ENGINE)
    )
    first_provisional = (
        base.lazy()
        .filter(~pl.col("settled") & pl.col("own_click").is_not_null() & pl.col("customer_key").is_not_null())
        .sort("occurred_at", "lead_id")
        .group_by("program_id", "customer_key")
        .agg(p_click=pl.col("own_click").first(), p_occurred=pl.col("occurred_at").first())
    )
    inherits = pl.col("settled") & pl.col("own_click").is_null()
    probe = base.select(pl.when(inherits).then(pl.col("program_id")).alias("program_id"), "customer_key")
    provisional = lookup(probe, first_provisional, ["program_id", "customer_key"], ["p_click", "p_occurred"])
    with_click = base.hstack(provisional.get_columns()).with_columns(
        lead_click=pl.when(pl.col("settled")).then(
            pl.coalesce(
                pl.col("own_click"),
                pl.when(pl.col("p_occurred") <= pl.col("occurred_at")).then(pl.col("p_click")),
            )
        )
    )
    partner = click_partner(with_click, "program_id", "lead_click", click_table)
    return with_click.select(
        "program_id", "lead_id", "customer_key", "email_norm", "settled", "occurred_at", "lead_click"
    ).with_columns(lead_partner=partner)


def lookup_table(lead_frame: pl.DataFrame, key: LeadKey) -> pl.DataFrame:
    """Per (program_id, key): the binding lead, its click and partner (may be null), and
    whether provisional leads exist."""
    settled = pl.col("settled")
    summary = (
        lead_frame.lazy()
        .select("program_id", key, "occurred_at", "lead_id", "settled")
        .with_row_index(_ROW)
        .filter(pl.col(key).is_not_null())
        .sort("occurred_at", "lead_id")
        .group_by("program_id", key)
        .agg(pl.col(_ROW).filter(settled).first().alias("row"), has_provisional=(~settled).any())
        .collect(engine=ENGINE)
    )
    bound = lead_frame.select(
        bind_lead=pl.col("lead_id"), bind_click=pl.col("lead_click"), bind_partner=pl.col("lead_partner")
    ).gather(summary.get_column("row"))
    return summary.drop("row").hstack(bound.get_columns())
