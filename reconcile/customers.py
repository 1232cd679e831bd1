"""The referred customer: the real sales of a program linked through any identity they share.

Two real (non-test) sales of one program belong to one customer when they share a customer key,
a processor customer id, a subscription id or a normalised email (schema.norm_email), directly
or through other sales: the customer is a connected component of the graph sale - identity, so
a one-time purchase and a later subscription, or two subscriptions, of one person are one
customer as soon as some identity ties them. Test sales are never commissioned and link nothing;
each is a customer of its own, as is a real sale without any identity.

The recurring window (reconcile/commissions.py) belongs to the customer. Components are found by
label propagation over integer labels: every sale starts labelled with its own row number; each
identity takes the smallest label of its sales, each sale the smallest label of its identities;
then labels are shortened (a sale takes its label's label) until nothing changes, and the rounds
repeat until no label moves. A label is always the row number of a sale of the same component,
so the result is the smallest row number of each component, whatever the order of rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from reconcile.schema import ENGINE, norm_email

# The identities that link sales, in a fixed order (their index tells identities apart).
IDENTITIES = ("customer_key", "processor_customer_id", "subscription_id", "email")
INPUT = ("program_id", "test_mode", *IDENTITIES)


def _edges(sales: pl.DataFrame, identities: Sequence[str]) -> pl.DataFrame:
    """(row, node): each real sale's row number and the integer id of each identity it has."""
    rows = sales.lazy().select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"),
        "program_id",
        "test_mode",
        *(norm_email(pl.col(n)) if n == "email" else pl.col(n) for n in identities),
    )
    real = rows.filter(~pl.col("test_mode").fill_null(False) & pl.col("program_id").is_not_null())
    pairs = pl.concat(
        [
            real.filter(pl.col(name).is_not_null()).select(
                "row", "program_id", kind=pl.lit(index, pl.Int8), value=pl.col(name)
            )
            for index, name in enumerate(identities)
        ]
    )
    return (  # sorted by node
        pairs.group_by("program_id", "kind", "value")
        .agg("row")
        .with_row_index("node")
        .explode("row")
        .select("row", pl.col("node").cast(pl.UInt32))
        .collect(engine=ENGINE)
    )


def _shorten(label: pl.Series) -> pl.Series:
    """Each label replaced by its own label until none changes (pointer jumping)."""
    while True:
        jumped = label.gather(label)
        if jumped.equals(label):
            return label
        label = jumped


def components(sales: pl.DataFrame, identities: Sequence[str] = IDENTITIES) -> pl.Series:
    """For each row of `sales` (columns INPUT), aligned with it: `customer` (UInt32), the same
    number for sales of one customer (the smallest row number among them). Other `identities`
    (string columns of `sales`) may link the rows instead (reconcile/layers.py adds `sale_id`)."""
    label = pl.int_range(0, sales.height, dtype=pl.UInt32, eager=True)
    edges = _edges(sales, identities)
    if edges.is_empty():
        return label.alias("customer")
    # Two orders of the edges, each sorted by the key it is grouped by (a sorted key groups
    # three times faster): by node (as built) and by row.
    rows, nodes = edges.get_column("row"), edges.get_column("node").set_sorted()
    by_row_order = edges.sort("row")
    row_keys, row_nodes = by_row_order.get_column("row").set_sorted(), by_row_order.get_column("node")
    # node ids are dense and fewer than the edges
    unset = pl.select(pl.repeat(0, edges.height, dtype=pl.UInt32)).to_series()
    while True:
        by_node = (
            pl.DataFrame({"node": nodes, "least": label.gather(rows)})
            .group_by("node")
            .agg(pl.col("least").min())
        )
        # each edge's node's least label: a gather, no join
        reached = (
            unset.clone().scatter(by_node.get_column("node"), by_node.get_column("least")).gather(row_nodes)
        )
        by_row = pl.DataFrame({"row": row_keys, "least": reached}).group_by("row").agg(pl.col("least").min())
        # A sale's own label is among its identities' least labels: the new label is never larger.
        moved = _shorten(label.clone().scatter(by_row.get_column("row"), by_row.get_column("least")))
        if moved.equals(label):
            return label.alias("customer")
        label = moved
