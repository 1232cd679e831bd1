"""Clicks and leads: the lookup tables the attribution ladder reads.

- A click (accepted `track` row of kind `click`) maps its click id to the partner code it was
  recorded for, within its program.
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

`lookup(key)` gives, per program and customer key (or normalised email): the binding lead
(lead id, click id, partner code) if any settled lead exists, and whether provisional leads
exist, which the ladder needs to name its reason (`lead_provisional`).
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from reconcile.schema import materialise, norm_email

LeadKey = Literal["customer_key", "email_norm"]


def clicks(raw: pl.LazyFrame) -> pl.LazyFrame:
    """program_id, click_id -> partner_code (first recorded wins should an id repeat)."""
    return (
        raw.filter(
            (pl.col("kind") == "click")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("click_id").is_not_null()
            & pl.col("partner_code").is_not_null()
        )
        .sort("occurred_at", "event_id")
        .group_by("program_id", "click_id")
        .agg(partner_code=pl.col("partner_code").first())
    )


def leads(raw: pl.LazyFrame) -> pl.LazyFrame:
    """Every accepted lead; settled ones with their effective click (`lead_click`)."""
    base = materialise(
        raw.filter(
            (pl.col("kind") == "lead")
            & (pl.col("outcome") == "accepted")
            & pl.col("program_id").is_not_null()
            & pl.col("event_id").is_not_null()
        ).select(
            "program_id",
            "customer_key",
            "occurred_at",
            lead_id=pl.col("event_id"),
            email_norm=norm_email(pl.col("email")),
            settled=(pl.col("lead_status") == "settled").fill_null(False),
            lead_click=pl.col("click_id"),
        )
    )
    first_provisional = (
        base.filter(
            ~pl.col("settled") & pl.col("lead_click").is_not_null() & pl.col("customer_key").is_not_null()
        )
        .sort("occurred_at", "lead_id")
        .group_by("program_id", "customer_key")
        .agg(p_click=pl.col("lead_click").first(), p_occurred=pl.col("occurred_at").first())
    )
    inherits = pl.col("settled") & pl.col("lead_click").is_null() & pl.col("customer_key").is_not_null()
    inherited = (
        base.filter(inherits)
        .join(first_provisional, on=["program_id", "customer_key"], how="left")
        .with_columns(
            lead_click=pl.when(pl.col("p_occurred") <= pl.col("occurred_at")).then(pl.col("p_click"))
        )
        .drop("p_click", "p_occurred")
    )
    own = base.filter(~inherits).with_columns(
        lead_click=pl.when(pl.col("settled")).then(pl.col("lead_click"))
    )
    return pl.concat([own, inherited])


def lookup(lead_frame: pl.LazyFrame, click_table: pl.LazyFrame, key: LeadKey) -> pl.LazyFrame:
    """Per (program_id, key): binding lead, its click and partner (may be null), has_provisional."""
    settled = pl.col("settled")
    binding = (
        lead_frame.filter(pl.col(key).is_not_null())
        .sort("occurred_at", "lead_id")
        .group_by("program_id", key)
        .agg(
            bind_lead=pl.col("lead_id").filter(settled).first(),
            bind_click=pl.col("lead_click").filter(settled).first(),
            has_provisional=(~settled).any(),
        )
    )
    return binding.join(
        click_table.rename({"click_id": "bind_click", "partner_code": "bind_partner"}),
        on=["program_id", "bind_click"],
        how="left",
    )
