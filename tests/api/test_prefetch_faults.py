"""A group commit whose read-ahead (`Tx.prefetch`) fails must not let a sale through twice:
re-posts of recorded sales that share groups with a request whose prefetch raises are each
refused (409, or 503 with the failed group), never acknowledged; the log and the claims stay
one per sale, nothing is set aside, and the server starts again on the same database.

The fault is injected where each backend reads ahead: the embedded key index's SQLite statement
(an `sqlite3.OperationalError`, as a failing disk gives), and PostgreSQL's sale lookup (an error
the statement raises). A sale whose transaction id holds `poison` is what makes it fail."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.testclient import TestClient

from api.app import create_app
from api.settings import Settings
from ingest.storage.duckdb import keys as hotkeys
from ingest.storage.postgres import tx as postgres_tx
from tests.conftest import World, make_world
from tests.helpers import sql_rows

SALES = 8
ROUNDS = 6
POISON = "poison"


class _PoisonedPrefetch:
    """The key index's writer connection: a prefetch statement whose keys hold `poison` fails."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        reads_ahead = any(part in sql for part in hotkeys._PREFETCH.values())  # (one statement, of parts)
        if reads_ahead and any(POISON.encode() in keys for keys in args[0]):
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return self.con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Call with the app's store: from then on a group's prefetch fails when it reads a
    poisoned key (undone at the end of the test)."""
    undo: list[Any] = []

    def poison(store: Any) -> None:
        keys = getattr(store, "keys", None)
        if keys is not None:  # the embedded backend
            keys._w = _PoisonedPrefetch(keys._w)
            undo.append(lambda: setattr(keys, "_w", keys._w.con))
        else:
            sql = postgres_tx._LOOKUP_SQL["sales"]
            unnest = b"unnest(%s::varchar[], %s::varchar[]) AS w(p, k)"
            assert sql.count(unnest) == 1
            failing = (
                b"(SELECT p, k FROM unnest(%s::varchar[], %s::varchar[]) AS u(p, k)"
                b" WHERE 1 / (CASE WHEN strpos(k, 'poison') > 0 THEN 0 ELSE 1 END) = 1) AS w(p, k)"
            )
            monkeypatch.setitem(postgres_tx._LOOKUP_SQL, "sales", sql.replace(unnest, failing))

    yield poison
    for step in undo:
        step()


def _sale(world: World, txn: str) -> int:
    body = {"transaction_id": txn, "customer_external_id": "c", "amount": 100}
    return world.client.post("/api/v1/track/sale", json=body, headers=world.key).status_code


def test_reposts_beside_a_failing_prefetch_are_each_refused_and_the_server_restarts(
    settings: Settings, poisoned: Any
) -> None:
    recorded = [f"in_{n}" for n in range(SALES)]
    with TestClient(create_app(settings)) as client:
        world = make_world(client)
        assert [_sale(world, txn) for txn in recorded] == [200] * SALES
        store = client.app.state.tally.store  # type: ignore[attr-defined]
        poisoned(store)
        calls = [f"{POISON}_{r}_{n}" for r in range(ROUNDS) for n in range(2)]
        calls += recorded * ROUNDS
        calls.sort(key=lambda txn: (txn.rsplit("_", 1)[-1], txn))  # poison beside every re-post
        with ThreadPoolExecutor(16) as pool:
            answers = list(zip(calls, pool.map(lambda txn: _sale(world, txn), calls), strict=True))
        acknowledged = sorted(txn for txn, status in answers if status == 200)
        assert acknowledged == []  # every re-post refused; every poisoned sale failed
        assert {status for txn, status in answers if not txn.startswith(POISON)} <= {409, 503}
        assert any(status == 409 for _, status in answers)
        client.app.state.tally.writer.sync_blocking()  # type: ignore[attr-defined]
        accepted = sql_rows(
            store,
            "SELECT transaction_id, count(*) FROM raw_events WHERE kind = 'sale' AND outcome = 'accepted'"
            " GROUP BY 1 ORDER BY 1",
        )
        assert accepted == [(txn, 1) for txn in sorted(recorded)]
        claims = sql_rows(store, "SELECT key, count(*) FROM idempotency_keys GROUP BY 1 ORDER BY 1")
        assert claims == [(f"sale:{txn}", 1) for txn in sorted(recorded)]
        assert getattr(store, "set_aside", 0) == 0
        assert client.get("/readyz").status_code == 200
    # The server starts again on the same database, and still knows every sale.
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 200
        world = World(client, world.account_token, world.workspace_id, world.program_id, world.api_key)
        assert [_sale(world, txn) for txn in recorded] == [409] * SALES
        assert _sale(world, "in_new") == 200
