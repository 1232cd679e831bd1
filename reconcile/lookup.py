"""Aligned lookups: the cheap way to bring a table's values next to many rows.

`lookup` answers "for each row of `keys`, the matching row of `table`" as a frame with exactly
`keys.height` rows in `keys`' order, so the result can be placed beside `keys` (`hstack`) with no
join back. Only rows whose key is complete are looked up (a null key matches nothing), the join
carries only the key and the wanted columns, and the answers are scattered into place by row
number. When the table has several rows for one key, the first in `order` wins.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from reconcile.schema import ENGINE

_IX = "__row"


def lookup(
    keys: pl.DataFrame,
    table: pl.DataFrame | pl.LazyFrame,
    on: Sequence[str],
    values: Sequence[str],
    *,
    right_on: Sequence[str] | None = None,
    order: Sequence[str] = (),
) -> pl.DataFrame:
    """`values` of `table` for each row of `keys` (matched `on` = `right_on`), aligned to `keys`."""
    right_keys = list(right_on or on)
    complete = pl.all_horizontal(pl.col(c).is_not_null() for c in on)
    probe = keys.lazy().select(*on).with_row_index(_IX).filter(complete)
    right = table.lazy().select(*right_keys, *values, *(c for c in order if c not in values))
    found = probe.join(right, left_on=list(on), right_on=right_keys, how="inner").collect(engine=ENGINE)
    if order:
        repeated = found.get_column(_IX).is_duplicated()
        if repeated.any():  # rare: resolve only the rows whose key the table repeats
            first = found.filter(repeated).sort(_IX, *order).filter(pl.col(_IX).is_first_distinct())
            found = pl.concat([found.filter(~repeated), first])
    found = found.select(_IX, *values).rechunk()
    schema = found.schema
    if any(schema[name].is_nested() for name in values):  # scatter takes flat types only
        rows = pl.int_range(0, keys.height, dtype=pl.UInt32, eager=True).alias(_IX).to_frame()
        return rows.join(found, on=_IX, how="left", maintain_order="left").select(values)
    return pl.DataFrame(
        [
            pl.repeat(None, keys.height, dtype=schema[name], eager=True)
            .scatter(found.get_column(_IX), found.get_column(name))
            .alias(name)
            for name in values
        ]
    )


def lookup_small(keys: pl.Series, table: pl.DataFrame, key: str, values: Sequence[str]) -> pl.DataFrame:
    """`values` of the row of a small `table` (unique in `key`) whose `key` equals each of
    `keys`, aligned with `keys`: one enum cast and a gather, no join."""
    table = table.filter(pl.col(key).is_not_null() & pl.col(key).is_first_distinct())
    categories = table.get_column(key)
    if categories.is_empty():
        return pl.DataFrame(
            [pl.repeat(None, keys.len(), dtype=table.schema[v], eager=True).alias(v) for v in values]
        )
    index = keys.cast(pl.Enum(categories.to_list()), strict=False).to_physical()
    return table.select(values).gather(index)
