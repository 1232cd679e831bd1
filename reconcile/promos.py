"""Promo codes (CONTRACT 14): which partner a sale's promotion code names. Pure.

An owner assigns a code to a partner with a `promo_code` row of the raw log (ingest/actions.py
`promo_code_row`: the code customers type in `promo_code`, the processor's promotion code id
`promo_...` in `object_id`, the partner in `partner_code`). Each is a key of the program:

- `promo_code:<CODE>`: the code as customers type it, without case (upper-cased);
- `promotion_code:<id>`: the processor's id, as it is.

A key names the partner of the first accepted assignment that has it (by `seq`; ingest refuses
a second one, ingest/domain/keys.py `promo_claims`, so a log holds one). An assignment is a fact
about the code, not about a moment: it names the partner of every sale with that code, earlier
sales too, whatever order the rows arrived in (a sale booked before the assignment was logged
changes by new lines, as for a late lead: reconcile/bookings.py).

A sale's key comes from the sale itself: a connect sale's `promo_code` is the promotion code id
its checkout session applied (`discounts[].promotion_code`), so it matches `promotion_code:`; a
self-hosted sale's is the code the customer typed (track/sale `promo_code`), so it matches
`promo_code:`. The ladder (reconcile/attribution.py) tries it right after the click id.
"""

from __future__ import annotations

import polars as pl

from reconcile.lookup import lookup
from reconcile.schema import ENGINE

KIND = "promo_code"
CODE = "promo_code:"
PROCESSOR_ID = "promotion_code:"


def assignments(log: pl.LazyFrame) -> pl.DataFrame:
    """program_id, promo_key, partner_code, promo_event: the partner each key names."""
    rows = log.filter(
        (pl.col("kind") == KIND)
        & (pl.col("outcome") == "accepted")
        & pl.col("program_id").is_not_null()
        & pl.col("partner_code").is_not_null()
    ).select("program_id", "seq", "partner_code", promo_event="event_id", code="promo_code", pid="object_id")
    keyed = pl.concat(
        [
            rows.filter(pl.col("code").is_not_null()).select(
                "program_id",
                "seq",
                "partner_code",
                "promo_event",
                promo_key=CODE + pl.col("code").str.to_uppercase(),
            ),
            rows.filter(pl.col("pid").is_not_null()).select(
                "program_id", "seq", "partner_code", "promo_event", promo_key=PROCESSOR_ID + pl.col("pid")
            ),
        ]
    )
    return (
        keyed.sort("seq")
        .unique(subset=["program_id", "promo_key"], keep="first", maintain_order=True)
        .drop("seq")
        .collect(engine=ENGINE)
    )


def sale_key(promo: str = "promo_code") -> pl.Expr:
    """Each sale's promo key (columns `source` and `promo`): see the module docstring."""
    code = pl.col(promo)
    return (
        pl.when(pl.col("source") == "connect")
        .then(PROCESSOR_ID + code)
        .otherwise(CODE + code.str.to_uppercase())
    )


def partner(frame: pl.DataFrame, promo: str, table: pl.DataFrame) -> pl.Series:
    """The partner named by each row's promo code (column `promo`, with `program_id` and
    `source`), aligned with `frame`; null where none is."""
    keys = frame.select("program_id", promo_key=sale_key(promo))
    return lookup(keys, table, ["program_id", "promo_key"], ["partner_code"]).get_column("partner_code")
