"""The I/O around the pure rules: a reconcile run over a store's log, and what it reads.

- `run(store, now, on_progress=None, *, full=False, scope=None) -> RunSummary`: one run (of the
  whole log, or of the programs of one reconcile partition `scope` of a shared database,
  ingest/storage/partitions.py) on the store's engine (reconcile/run/engine.py `open_engine`):
  reconcile/run/job.py reads the raw log (a full
  run through its Parquet column mirror, reconcile/run/mirror.py; an incremental one only what
  the new rows change, reconcile/run/incremental.py, reconcile/run/closure.py and the component
  store of reconcile/run/components.py), replaces or
  patches the `rc_*` tables in one transaction, records the run in `rc_runs`, and publishes it
  where the engine is a working copy of a shared log.
- `backfill_inputs(store, program_id)`: the log, programs and partners a backfill previews on,
  and the unroutable events it may pick up (reconcile/run/source.py `unpicked`).
- `close_bookings(store, program_ids, now, scope=None)`: what the period closes of those
  programs that no booking holds yet book (reconcile/periods.py `to_book`; a run's summary names
  the programs in `unbooked_closes`), valued once on each program's log.
- `books(reader, program_id, before_seq)` (reconcile/run/engine.py): the log as of a period close,
  for the reports.

The server schedules runs and holds the run lock (api/jobs.py); nothing here takes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import polars as pl

from ingest.progress import Progress
from ingest.storage.contract import Store
from ingest.storage.partitions import Scope, part_of
from reconcile import pipeline
from reconcile.run import job, source
from reconcile.run.engine import Engine, books, open_engine
from reconcile.run.job import ReconcileFailed, RunSummary


def run(
    store: Store,
    now: datetime,
    on_progress: Progress | None = None,
    *,
    full: bool = False,
    scope: Scope | None = None,
) -> RunSummary:
    """One reconcile run of `store`'s log (or of the programs of partition `scope` of it) as of
    `now` (see the module docstring); the caller holds the reconcile lease (of that partition).
    Raises `ReconcileFailed` when the run could not be completed (the previous results stay)."""
    with open_engine(store, scope) as engine:
        return job.run(engine.cursor, now, on_progress, full=full, publish=engine.publish)


def backfill_inputs(
    store: Store, program_id: str
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The raw log of `program_id`, the programs and the partners as the engine has them, and the
    unroutable events not picked up yet that the program's processor account could take. In
    partitions, the program's rows come from its partition's engine and the unroutable events
    from the first partition's, which alone holds them (the caller holds both leases)."""
    parts = store.partitions
    scope = None if parts <= 1 else Scope(part_of(program_id, parts), parts)
    first = None if scope is None or scope.part == 0 else Scope(0, parts)
    with open_engine(store, scope) as engine:
        raw, programs, partners = job.read(engine.cursor, program_id=program_id)
        account = programs.filter(pl.col("program_id") == program_id).get_column("stripe_account_id")
        connected = account.item() if account.len() == 1 else None
        if first is None:
            return raw, programs, partners, source.unpicked(engine.cursor, connected)
    with open_engine(store, first) as engine:
        return raw, programs, partners, source.unpicked(engine.cursor, connected)


def close_bookings(
    store: Store, program_ids: Sequence[str], now: datetime, scope: Scope | None = None
) -> pl.DataFrame:
    """What the period closes of `program_ids` that no booking holds yet book (the module
    docstring): each program's log read from the engine (of partition `scope`), its closes'
    snapshots valued as a run values them. The caller holds the reconcile lease."""
    frames = []
    with open_engine(store, scope) as engine:
        for program_id in program_ids:
            raw, programs, partners = job.read(engine.cursor, program_id=program_id)
            frames.append(pipeline.close_bookings(raw, programs, partners, now))
    if not frames:
        return pl.DataFrame(schema={"program_id": pl.String, "close_seq": pl.Int64})
    return pl.concat(frames, how="diagonal_relaxed")


__all__ = [
    "Engine",
    "ReconcileFailed",
    "RunSummary",
    "backfill_inputs",
    "books",
    "close_bookings",
    "open_engine",
    "run",
]
