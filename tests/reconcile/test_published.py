"""What a PostgreSQL replica publishes is what its engine computed (reconcile/engine.py): for
random logs, through the real app on a database of the test's cluster, a first reconcile (a
full run: the published tables replaced) and, after more of the log arrives, a second one
(incremental where it can be: only its changes sent), then full runs later and back again (only
the rows that differ sent). After each, every published table equals the engine's, which equals
the reference (tests/reconcile/reference.py). Then a replica with
an empty working copy (another process, or one restarted without `TALLY_ENGINE_DIR`) reads the
same tables and, reconciling, publishes them unchanged.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta

import time_machine
from hypothesis import event, given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from api.app import create_app
from ingest.storage.contract import Reader
from reconcile.run import job
from reconcile.run.engine import open_engine
from tests.conftest import OP
from tests.pg import Server
from tests.reconcile.apps import (
    app_with,
    assert_reference,
    assert_same,
    published,
    replica_settings,
    stream_rows,
    tables,
)
from tests.reconcile.streams import Stream, profile, streams


def _reconcile(client: TestClient) -> str:
    r = client.post("/api/v1/operator/reconcile", headers=OP)
    assert r.status_code == 200, r.text
    return str(r.json()["data"]["mode"])


@profile(3, ci=15)
@given(stream=streams(max_events=30), share=st.integers(0, 100))
def test_published_tables_are_the_engines_after_full_and_incremental_runs(
    pg_server: Server, stream: Stream, share: int
) -> None:
    database = pg_server.fresh_database()
    cut = len(stream.rows) * share // 100
    first, rest = stream.rows[:cut], stream.rows[cut:]
    with time_machine.travel(stream.now, tick=False):
        with app_with(stream, database, rows=first) as (client, state, ids):
            _reconcile(client)
            with state.store.reader() as db:
                assert_same(published(db), tables(state))
            state.writer.run_sync(lambda tx: [tx.append(row) for row in stream_rows(stream, ids, rest)])
            event(f"second run: {_reconcile(client)}")
            engine = tables(state)
            with state.store.reader() as db:
                assert_same(published(db), engine)
            assert_reference(state, stream)
            # a full run on the same replica, later (statuses move on): it sends what changed
            later = stream.now + timedelta(days=45)
            with open_engine(state.store) as session:
                job.run(session.cursor, later, full=True, publish=session.publish)
                event(f"third run published: {session.publish.mode}")
            with state.store.reader() as db:
                assert_same(published(db), tables(state))
            with open_engine(state.store) as session:  # back to `now`, for the replica below
                job.run(session.cursor, stream.now, full=True, publish=session.publish)
            with state.store.reader() as db:
                assert_same(published(db), engine)
        # another replica, its working copy empty: it reads what was published, and its own
        # first (full) run publishes the same tables again
        with (
            tempfile.TemporaryDirectory() as folder,
            TestClient(create_app(replica_settings(database, folder))) as other,
        ):
            state = other.app.state.tally  # type: ignore[attr-defined]
            with state.store.reader() as db:
                assert_same(published(db), engine)
            assert _reconcile(other) == "full"
            with state.store.reader() as db:
                assert_same(published(db), engine)


def test_statuses_published_by_an_incremental_run_follow_time_both_ways(pg_server: Server) -> None:
    """Between two runs only `now` and one unrelated event change: a pending line that has
    become approvable is published approved; were the clock to go back, the statuses follow it
    back, as on the embedded backend (the published tables stay the engine's)."""
    from tests.reconcile import builders as b

    stream = Stream(
        rows=[
            b.click("clk_1", "p1"),
            b.lead("lead_1", "ck_1", click_id="clk_1"),
            b.track_sale("sale_1", "in_1", 10_000, customer_key="ck_1", occurred_at=b.at(days=0)),
        ],
        programs=b.programs(holding_days=30),
        partners=b.partners(("p1", None)),
        now=b.at(days=20),
    )
    database = pg_server.fresh_database()
    statuses = []
    with (
        time_machine.travel(stream.now, tick=False) as clock,
        app_with(stream, database) as (client, state, ids),
    ):
        for step, days in enumerate((20, 40, 10)):
            clock.move_to(b.at(days=days))
            if step:
                extra = b.click(f"clk_extra_{step}", "p1", received_at=b.at(days=days))
                state.writer.run_sync(lambda tx, row=extra: tx.append(stream_rows(stream, ids, [row])[0]))
            mode = _reconcile(client)
            with state.store.reader() as db:
                published_now = published(db)
            assert_same(published_now, tables(state))
            sales = published_now["rc_sales"]
            statuses.append((mode, sales.get_column("commission_status").to_list()))
    assert statuses == [("full", ["pending"]), ("incremental", ["approved"]), ("incremental", ["pending"])]


def test_a_full_run_sends_only_the_rows_that_changed_unless_most_did(pg_server: Server) -> None:
    """Thirty sales, thirty days' holding: a full run when only the first sale's line has become
    approvable rewrites only that sale's published rows (the others keep the row versions, `xmin`,
    of the previous publish); a full run when every line has moved replaces the tables whole; and a
    replica whose previous run is not the one published (another replica published since) replaces
    them too, whatever it changed itself."""
    from ingest.storage.postgres.store import PgStore
    from tests.reconcile import builders as b

    rows: list[dict[str, object]] = []
    for n in range(30):
        rows += [
            b.click(f"clk_{n}", "p1"),
            b.lead(f"lead_{n}", f"ck_{n}", click_id=f"clk_{n}"),
            b.track_sale(
                f"sale_{n}",
                f"in_{n}",
                10_000,
                customer_key=f"ck_{n}",
                occurred_at=b.at(days=0 if n == 0 else 5 + n),
            ),
        ]
    stream = Stream(
        rows=rows, programs=b.programs(holding_days=30), partners=b.partners(("p1", None)), now=b.at(days=20)
    )
    database = pg_server.fresh_database()

    def versions(db: Reader) -> dict[str, int]:
        found = db.rows("SELECT transaction_id, xmin::text FROM rc_sales")
        return {str(txn): int(xmin) for txn, xmin in found}

    def full_run(store: PgStore, days: float) -> str | None:
        with open_engine(store) as session:
            job.run(session.cursor, b.at(days=days), full=True, publish=session.publish)
            return session.publish.mode

    with (
        time_machine.travel(stream.now, tick=False),
        app_with(stream, database) as (_client, state, _),
        tempfile.TemporaryDirectory() as folder,
    ):
        store: PgStore = state.store  # type: ignore[assignment]
        assert full_run(store, 20) == "replace"  # the first run of this working copy
        with store.reader() as db:
            before = versions(db)
        assert full_run(store, 30.5) == "changes"
        with store.reader() as db:
            after = versions(db)
            assert_same(published(db), tables(state))
        assert [txn for txn in before if before[txn] != after[txn]] == ["in_0"]
        assert full_run(store, 70) == "replace"  # every line approved: most rows differ
        with store.reader() as db:
            assert_same(published(db), tables(state))
        other = PgStore(database, engine_dir=folder)
        try:
            assert full_run(other, 20) == "replace"  # all pending again, published by `other`
        finally:
            other.close()
        assert full_run(store, 70) == "replace"  # not "changes": its own previous run is not published
        with store.reader() as db:
            assert_same(published(db), tables(state))
