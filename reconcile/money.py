"""Integer money arithmetic as Polars expressions: no float ever touches an amount.

Amounts are Int64 minor units. Products are formed in Int128 so that `amount * bps` and
`commission * refunded` cannot overflow, then divided with round-half-to-even and brought back
to Int64.
"""

from __future__ import annotations

import polars as pl

BPS = 10_000  # basis points in a whole


def div_half_even(numerator: pl.Expr, denominator: pl.Expr) -> pl.Expr:
    """numerator / denominator rounded half-to-even, for a positive denominator (Int128 in)."""
    quotient = numerator // denominator
    remainder = numerator - quotient * denominator
    twice = remainder * 2
    round_up = (twice > denominator) | ((twice == denominator) & (quotient % 2 != 0))
    return quotient + round_up.cast(pl.Int128)


def _i128(expr: pl.Expr) -> pl.Expr:
    return expr.cast(pl.Int128)


def apply_bps(amount: pl.Expr, bps: pl.Expr) -> pl.Expr:
    """round_half_even(amount * bps / 10000) in minor units."""
    return div_half_even(_i128(amount) * _i128(bps), pl.lit(BPS, pl.Int128)).cast(pl.Int64)


def pro_rata(total: pl.Expr, part: pl.Expr, whole: pl.Expr) -> pl.Expr:
    """round_half_even(total * part / whole); `total` exactly once `part` reaches `whole`.

    Used for refund reversals: `total` is a commission or fee, `part` the cumulative refunded
    amount, `whole` the sale's gross amount. A non-positive `whole` yields `total`.
    """
    safe_whole = pl.when(whole > 0).then(whole).otherwise(1)
    share = div_half_even(_i128(total) * _i128(part), _i128(safe_whole)).cast(pl.Int64)
    return pl.when((part >= whole) | (whole <= 0)).then(total).otherwise(share)
