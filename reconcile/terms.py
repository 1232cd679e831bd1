"""Program terms over time: a sale is valued with the terms in force when it occurred.

A program's money terms (TERMS: commission type, rate, flat amount, recurring months, platform
fee, holding days) change through its settings (API, dashboard, agent endpoint). Each change is
appended to the raw log as a `program_terms` action (ingest/actions.py `terms_row`, body
`{"from": {...}, "to": {...}, "by": who}`, every term on both sides) at its log time, like the
other engineer actions, so the ledger stays a function of the log. The flat commission is read
as the JSON text of its value (an integer, or an object by currency since CONTRACT 15; older
rows hold integers and read as they always did).

A sale is valued with the terms in force when it occurred: those set by the last change
logged before its `occurred_at` (strictly: a sale at the very instant of a change keeps the
terms it had; a change takes effect at the latest log time of itself and every earlier change
of its program, so changes apply in the order they were made, the last of equal times
winning), else the `from` terms of the program's first change, else the program's settings as
they are now (a program never changed since this was logged). A change therefore applies to
sales that occur after it: it never rewrites a line already booked, approved, paid or pending
(unless the sale is dated after the change), and a month's figures keep the terms they were
earned under. The recurring window's
anchor is the customer's first commissioned sale whatever the terms (reconcile/commissions.py);
each sale is inside or outside the window by the months in force at its own time.

The terms of the whole log are found once per run (`history`) and used for every prefix the
ledger values (period closes), so that books as of a close agree with the run's.
"""

from __future__ import annotations

import polars as pl

from ingest.domain.records import MONEY_TERMS
from reconcile.schema import ENGINE, INT, PROGRAM_DEFAULTS, PROGRAM_SCHEMA, STR, UTC

KIND = "program_terms"
TERMS = MONEY_TERMS
# Terms read as text rather than decoded: a per-currency setting is an integer or an object
# (reconcile/schema.py `setting_text`), kept as the JSON text of its side of the body.
_AS_TEXT = ("commission_flat",)
_BODY = pl.Struct(
    {
        side: pl.Struct({name: PROGRAM_SCHEMA[name] for name in TERMS if name not in _AS_TEXT})
        for side in ("from", "to")
    }
)
HOLDING_SCHEMA: dict[str, pl.DataType] = {"program_id": STR, "since": UTC, "until": UTC, "holding_days": INT}


def history(raw: pl.LazyFrame, programs: pl.DataFrame) -> pl.DataFrame:
    """The `programs` (prepared: one row each, defaults filled) with a `since` column (UTC,
    null = from the start): one row per program that never changed, else one for the terms
    before its first change (since null) and one per change, in effect after `since`."""
    changes = (
        raw.filter((pl.col("kind") == KIND) & (pl.col("outcome") == "accepted"))
        .filter(pl.col("program_id").is_in(programs.get_column("program_id").implode()))
        .select("program_id", "seq", "received_at", "body")
        .sort("seq")
        .with_columns(since=pl.col("received_at").cum_max().over("program_id"))
        .with_columns(terms=pl.col("body").str.json_decode(_BODY))
        .collect(engine=ENGINE)
    )
    base = programs.with_columns(since=pl.lit(None, UTC))
    if changes.is_empty():
        return base
    rest = [c for c in programs.columns if c not in TERMS]
    current = programs.select(rest)

    def version(side: str, since: pl.Expr) -> pl.DataFrame:
        picked = changes.select(
            "program_id",
            "seq",
            since.alias("since"),
            pl.col("terms").struct.field(side).struct.unnest(),
            *(pl.col("body").str.json_path_match(f"$.{side}.{name}").alias(name) for name in _AS_TEXT),
        )
        return picked.join(current, on="program_id").select(*programs.columns, "since", "seq")

    first = version("from", pl.lit(None, UTC)).filter(pl.col("seq") == pl.col("seq").min().over("program_id"))
    versions = pl.concat([first, version("to", pl.col("since"))]).with_columns(
        pl.col(name).fill_null(pl.lit(value, PROGRAM_SCHEMA[name]))
        for name, value in PROGRAM_DEFAULTS.items()
        if name in TERMS
    )
    # Of changes taking effect at one time, the last made holds.
    versions = versions.sort("seq").unique(["program_id", "since"], keep="last", maintain_order=True)
    unchanged = base.join(changes.select("program_id").unique(), on="program_id", how="anti")
    return pl.concat([unchanged, versions.drop("seq")]).sort("program_id", "since", nulls_last=False)


def changed(history: pl.DataFrame) -> bool:
    """Whether any program's terms changed (more than one version)."""
    return bool(history.get_column("since").is_not_null().any())


def holding(history: pl.DataFrame) -> pl.DataFrame:
    """program_id, since, until (null = unbounded) and holding_days of each version, in force
    for sales with since < occurred_at <= until: the status refresh's table of a sale's holding
    days (reconcile/run/closure.py)."""
    return (
        history.sort("program_id", "since", nulls_last=False)
        .select(
            "program_id",
            "since",
            until=pl.col("since").shift(-1).over("program_id"),
            holding_days="holding_days",
        )
        .select(pl.col(name).cast(dtype) for name, dtype in HOLDING_SCHEMA.items())
    )
