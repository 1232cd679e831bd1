"""Reconcile partitions on PostgreSQL (ingest/storage/partitions.py, api/jobs.py): replicas that
reconcile the programs in partitions, each taking the partitions no other is running, publish
exactly the books one replica reconciling the whole log computes, which are the reference's
(tests/reconcile/reference.py), after first, incremental, booking and full runs; each partition's
working copy holds that partition's rows only; and the partition of a program is the same in
Python and in PostgreSQL.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from datetime import datetime

import polars as pl
import pytest
import time_machine
from hypothesis import event, given
from hypothesis import strategies as st

import reconcile.run
from api.state import State
from ingest.domain.errors import ReconcileRunning
from ingest.storage.partitions import Scope, part_of
from ingest.storage.postgres.store import PgStore
from reconcile.run import job
from reconcile.run.engine import open_engine
from tests.pg import Server
from tests.reconcile import builders as b
from tests.reconcile.apps import (
    Tables,
    app_with,
    assert_same,
    engine_tables,
    published,
    replica,
    stream_rows,
)
from tests.reconcile.compare import checked
from tests.reconcile.database import assert_materialised
from tests.reconcile.streams import Stream, profile, streams


def _whole(database: str, now: datetime, parts: int) -> Tables:
    """The books of the whole log as one replica reconciling it whole computes them (a working
    copy of the whole log, nothing published), checked against the reference."""
    with tempfile.TemporaryDirectory() as folder:
        store = PgStore(database, engine_dir=folder, partitions=parts)
        try:
            with open_engine(store) as engine:
                job.run(engine.cursor, now, full=True)
                raw, programs, partners = job.read(engine.cursor)
                assert_materialised(engine.cursor, checked(raw, programs, partners, now))
                return engine_tables(engine.cursor)
        finally:
            store.close()


def _published(state: State) -> Tables:
    with state.store.reader() as db:
        return published(db)


def _at_once(*runs: Callable[[], object]) -> None:
    """Each of `runs` in a thread of its own, started together; their errors raised."""
    errors: list[BaseException] = []

    def guarded(run: Callable[[], object]) -> None:
        try:
            run()
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _runs(state: State) -> list[tuple[int | None, int | None, str]]:
    with state.store.reader() as db:
        return [
            (p, n, str(m)) for p, n, m in db.rows("SELECT part, parts, mode FROM rc_runs ORDER BY run_no")
        ]


@profile(3, ci=10)
@given(stream=streams(max_events=30), share=st.integers(0, 100), parts=st.integers(2, 3))
def test_replicas_reconciling_partitions_publish_the_books_of_one_replica(
    pg_server: Server, stream: Stream, share: int, parts: int
) -> None:
    database = pg_server.fresh_database()
    cut = len(stream.rows) * share // 100
    first, rest = stream.rows[:cut], stream.rows[cut:]
    with (
        time_machine.travel(stream.now, tick=False),
        app_with(stream, database, rows=first, partitions=parts) as (_client, state, ids),
        replica(database, parts) as other,
    ):
        # both replicas' scheduled runs at once: between them every partition runs, none twice at a time
        _at_once(state.reconciler.run_free, other.reconciler.run_free)
        assert {part for part, _, _ in _runs(state)} == set(range(parts))
        assert {n for _, n, _ in _runs(state)} == {parts}
        assert_same(_published(state), _whole(database, stream.now, parts))
        # more of the log: each partition builds on what it published (incremental where it can)
        state.writer.run_sync(lambda tx: [tx.append(row) for row in stream_rows(stream, ids, rest)])
        seen = len(_runs(state))
        _at_once(state.reconciler.run_free, other.reconciler.run_free)
        event("second runs: " + ", ".join(sorted({mode for _, _, mode in _runs(state)[seen:]})))
        assert_same(_published(state), _whole(database, stream.now, parts))
        # the operator's run takes every partition; a full run of one sends its changes only
        state.reconciler.run()
        with open_engine(other.store, Scope(parts - 1, parts)) as engine:
            job.run(engine.cursor, stream.now, full=True, publish=engine.publish)
            assert engine.publish is not None
            event(f"a partition's full run published: {engine.publish.mode}")
        assert_same(_published(state), _whole(database, stream.now, parts))


def test_a_partition_publishes_its_programs_only_and_leaves_the_others_alone(pg_server: Server) -> None:
    """Three programs with one sale each, in as many partitions as split them: the first
    partition's runs (first, after a sale of each program, after an unroutable event is picked
    up by another partition's program, then full) change the published rows of its own programs
    only (and the unroutable list); the others' stay as their partitions last published them,
    until those run too. Each working copy holds its own programs' rows; the first partition's
    also the unroutable event and the copy a backfill made of it."""
    rows: list[dict[str, object]] = []
    programs = ("prog_a", "prog_b", "prog_c")
    for n, program in enumerate(programs):
        rows += [
            b.click(f"clk_{n}", "p1", program_id=program),
            b.track_sale(f"sale_{n}", f"in_{n}", 10_000, click_id=f"clk_{n}", program_id=program),
        ]
    lost = b.invoice(
        "evt_lost", "in_lost", 5_000, program_id=None, outcome="unroutable", stripe_account="acct_x"
    )
    rows.append(lost)
    stream = Stream(
        rows=rows,
        programs=pl.concat(
            b.programs(stripe_account_id=f"acct_{n}").with_columns(program_id=pl.lit(program))
            for n, program in enumerate(programs)
        ),
        partners=pl.concat(b.partners(("p1", None), program=program) for program in programs),
        now=b.at(days=20),
    )
    database = pg_server.fresh_database()
    with (
        time_machine.travel(stream.now, tick=False),
        app_with(stream, database) as (_client, state, ids),
        tempfile.TemporaryDirectory() as folder,
    ):
        real = {ids[p]: p for p in programs}
        # the fewest partitions that do not put the three (random) program ids in one
        parts = next(n for n in range(2, 64) if len({part_of(p, n) for p in real}) > 1)
        owner = {program: part_of(program, parts) for program in real}
        store = PgStore(database, engine_dir=folder, partitions=parts)
        mine, others = Scope(0, parts), [Scope(part, parts) for part in range(1, parts)]

        def sales() -> dict[str, int]:
            frame = _published(state)["rc_sales"]
            return dict(frame.group_by("program_id").len().iter_rows())  # type: ignore[arg-type]

        try:
            reconcile.run.run(store, stream.now, scope=mine)
            assert sales() == {p: 1 for p in real if owner[p] == 0}
            assert _published(state)["rc_unroutable"].height == 1
            more = [
                b.track_sale(
                    f"sale_more_{n}", f"in_more_{n}", 20_000, click_id=f"clk_{n}", program_id=program
                )
                for n, program in enumerate(programs)
            ]
            state.writer.run_sync(lambda tx: [tx.append(row) for row in stream_rows(stream, ids, more)])
            assert reconcile.run.run(store, stream.now, scope=mine).mode == "incremental"
            assert sales() == {p: 2 for p in real if owner[p] == 0}
            # the lost event picked up by a program of another partition: the first partition's
            # copy holds the backfill's copy (it takes the event off the unroutable list); what
            # it makes of it is the other partition's to publish
            taker = next(p for p in real if owner[p] != 0)
            picked = b.picked_up(lost, real[taker])
            state.writer.run_sync(lambda tx: tx.append(stream_rows(stream, ids, [picked])[0]))
            reconcile.run.run(store, stream.now, scope=mine)
            # and a replica whose copy of the partition is new, publishing its tables whole
            with tempfile.TemporaryDirectory() as fresh_folder:
                fresh = PgStore(database, engine_dir=fresh_folder, partitions=parts)
                try:
                    with open_engine(fresh, mine) as engine:
                        job.run(engine.cursor, stream.now, publish=engine.publish)
                        assert engine.publish is not None and engine.publish.mode == "replace"
                finally:
                    fresh.close()
            assert _published(state)["rc_unroutable"].height == 0
            for name, frame in _published(state).items():
                if name != "rc_unroutable":
                    assert {owner[p] for p in frame.get_column("program_id").unique()} <= {0}, name
            for scope in others:
                reconcile.run.run(store, stream.now, scope=scope, full=True)
            assert sales() == {p: 3 if p == taker else 2 for p in real}
            assert reconcile.run.run(store, stream.now, scope=mine, full=True).mode == "full"
            assert_same(_published(state), _whole(database, stream.now, parts))
            for scope in (mine, *others):
                with open_engine(store, scope) as engine:
                    held = engine.cursor.sql("SELECT DISTINCT program_id FROM raw_events").pl()
                expected = {p for p in real if owner[p] == scope.part}
                if scope.part == 0:
                    expected |= {None, taker}
                assert set(held.get_column("program_id").to_list()) == expected
        finally:
            store.close()


def test_a_program_is_in_the_same_partition_in_python_and_in_postgresql(pg_server: Server) -> None:
    ids = [f"prog_{n:05x}" for n in range(300)] + ["", "é", "prog_" + "x" * 100]
    store = PgStore(pg_server.fresh_database())
    try:
        with store.reader() as db:
            for parts in (2, 3, 7):
                for part in range(parts):
                    condition = Scope(part, parts).programs_sql("id")
                    found = db.rows(f"SELECT id FROM unnest(?::text[]) AS t(id) WHERE {condition}", [ids])
                    assert sorted(str(i) for (i,) in found) == sorted(
                        i for i in ids if part_of(i, parts) == part
                    )
    finally:
        store.close()


def test_a_replica_reconciling_in_other_partitions_than_the_last_one_started_does_not_run(
    pg_server: Server,
) -> None:
    """Replicas must agree on the partitions: the one started last decides, and a replica with
    another setting refuses every run (409, saying what to do) instead of publishing over it."""
    database = pg_server.fresh_database()
    with replica(database, 2) as two, replica(database, 3) as three:
        three.reconciler.run()
        with pytest.raises(ReconcileRunning, match="restart it with the same TALLY_RECONCILE_PARTITIONS"):
            two.reconciler.run()
        with pytest.raises(ReconcileRunning):
            two.reconciler.run_free()
