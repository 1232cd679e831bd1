"""Several `tally serve` replicas on one PostgreSQL database act as one service (real processes,
a PostgreSQL cluster of the tests' own, tests/pg.py).

- The same transaction id, or processor event id, sent to two replicas at the same moment: one
  2xx and one duplicate answer, one logged sale.
- A key regenerated through one replica is refused by the other at once.
- The scheduled reconcile runs on one replica at a time; reads on any replica see the latest run.
- A replica killed in the middle of a reconcile leaves the previous results intact, and the
  other replica reconciles at once (the run lock died with the killed replica's connection).
- Dashboard sessions work on every replica.
- A replica killed under load loses no acknowledged event.
- While PostgreSQL is down a replica answers 503 `database_unavailable` (never a 2xx), and it
  recovers by itself when the database is back.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import OP, WEBHOOK_SECRET, LiveServer, bearer, live_program, start_server
from tests.helpers import csrf_of
from tests.pg import Cluster, Server
from tests.processes import Load, kill, wait_until
from tests.stripe_fixtures import load_event, signed_delivery, with_metadata

pytestmark = pytest.mark.slow

SALE = "/api/v1/track/sale"


def _replica(database: str, tmp_path: Path, name: str, **env: str) -> LiveServer:
    return start_server(database, TALLY_ENGINE_DIR=str(tmp_path / f"engine-{name}"), **env)


@pytest.fixture
def replicas(pg_server: Server, tmp_path: Path) -> Iterator[tuple[LiveServer, LiveServer]]:
    database = pg_server.fresh_database()
    a = _replica(database, tmp_path, "a")
    b = _replica(database, tmp_path, "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def _at_once(*calls: tuple[str, str, dict[str, object], dict[str, str]]) -> list[httpx.Response]:
    """POST each (url, path, json, headers) from its own thread, released together."""
    barrier = threading.Barrier(len(calls))
    out: list[httpx.Response | None] = [None] * len(calls)

    def go(index: int) -> None:
        url, path, body, headers = calls[index]
        with httpx.Client(base_url=url, timeout=30) as c:
            barrier.wait()
            out[index] = c.post(path, json=body, headers=headers)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in out if r is not None]


def _deliver_at_once(body: bytes, header: str, *urls: str) -> list[httpx.Response]:
    barrier = threading.Barrier(len(urls))
    answers: list[httpx.Response] = []

    def post(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            barrier.wait()
            answers.append(c.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": header}))

    threads = [threading.Thread(target=post, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _rows(database: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(database) as con:
        return con.execute(sql.encode(), params).fetchall()


def _sold(client: httpx.Client, key: str, txn: str) -> httpx.Response:
    body = {"transaction_id": txn, "customer_external_id": "c", "amount": 100}
    return client.post(SALE, json=body, headers=bearer(key))


def test_the_same_sale_at_two_replicas_at_once_is_recorded_once(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    _, _, key = live_program(a.url)
    auth = bearer(key)
    for n in range(15):
        body = {"transaction_id": f"in_race_{n}", "customer_external_id": "c", "amount": 100}
        answers = _at_once((a.url, SALE, body, auth), (b.url, SALE, body, auth))
        assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
        codes = [r.json()["error"]["code"] for r in answers if r.status_code == 409]
        assert codes == ["duplicate_transaction"]
    rows = _rows(
        str(a.database),
        "SELECT transaction_id, count(*) FILTER (WHERE outcome = 'accepted'),"
        " count(*) FILTER (WHERE outcome = 'duplicate') FROM raw_events WHERE kind = 'sale'"
        " GROUP BY 1 ORDER BY 1",
    )
    assert len(rows) == 15 and all(row[1:] == (1, 1) for row in rows)


def test_the_same_processor_event_at_two_replicas_at_once_is_taken_once(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    owner, pid, _ = live_program(a.url)
    with httpx.Client(base_url=a.url, timeout=10) as c:
        r = c.patch(f"/api/v1/programs/{pid}", json={"stripe_account_id": "acct_replicas"}, headers=owner)
        assert r.status_code == 200, r.text
    base = load_event("stripe-ruby-mock__invoice.payment_succeeded.json", account="acct_replicas")
    for n in range(10):
        event = with_metadata({**base, "id": f"evt_race_{n}"}, {"svc_customer_key": "c"}, where="legacy")
        body, header = signed_delivery(event, WEBHOOK_SECRET, int(time.time()))
        answers = _deliver_at_once(body, header, a.url, b.url)
        assert [r.status_code for r in answers] == [200, 200]
        assert sorted(r.json()["data"]["duplicate"] for r in answers) == [False, True]
    rows = _rows(
        str(a.database),
        "SELECT event_id, outcome FROM raw_events WHERE kind = 'stripe' ORDER BY event_id, outcome",
    )
    assert rows == [(f"evt_race_{n}", o) for n in range(10) for o in ("accepted", "duplicate")]


def test_a_key_regenerated_through_one_replica_is_refused_by_the_other_at_once(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    owner, pid, old = live_program(a.url)
    with httpx.Client(base_url=a.url, timeout=10) as ca, httpx.Client(base_url=b.url, timeout=10) as cb:
        for n in range(5):
            assert _sold(cb, old, f"in_k{n}").status_code == 200
            r = ca.post(f"/api/v1/programs/{pid}/api-key", headers=owner)
            assert r.status_code == 201, r.text
            new = r.json()["data"]["api_key"]
            refused = _sold(cb, old, f"in_old{n}")
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            assert _sold(cb, new, f"in_new{n}").status_code == 200
            old = new
        # a rotation flag set through B is on A's answers at once
        path = f"/api/v1/operator/programs/{pid}/api-key/rotation"
        r = cb.post(path, json={"deadline": "2099-01-01T00:00:00Z"}, headers=OP)
        assert r.status_code == 200, r.text
        r = _sold(ca, old, "in_flagged")
        assert r.status_code == 200 and r.headers.get("Sunset")
        assert "api_key_rotation_required" in [w["code"] for w in r.json()["warnings"]]


def test_dashboard_sessions_work_on_every_replica_and_end_on_every_replica(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    r = httpx.post(
        f"{a.url}/api/v1/operator/accounts", json={"email": "d@x.test", "workspace_name": "W"}, headers=OP
    )
    token = r.json()["data"]["token"]
    with httpx.Client(base_url=a.url, timeout=10) as ca:
        form = ca.get("/dashboard/login")
        r = ca.post("/dashboard/login", data={"token": token, "csrf_token": csrf_of(form.text)})
        assert r.status_code == 303, r.text
        session = ca.cookies.get("tally_session")
    assert session
    with httpx.Client(base_url=b.url, timeout=10, cookies={"tally_session": session}) as cb:
        page = cb.get("/dashboard", follow_redirects=False)
        assert page.status_code == 200, page.text
        r = cb.post("/dashboard/logout", data={"csrf_token": csrf_of(page.text)}, follow_redirects=False)
        assert r.status_code == 303
    with httpx.Client(base_url=a.url, timeout=10, cookies={"tally_session": session}) as ca:
        assert ca.get("/dashboard", follow_redirects=False).status_code == 303  # ended everywhere


def test_a_key_regenerated_on_the_dashboard_is_shown_once_by_whichever_replica_serves_the_page(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    owner, pid, old = live_program(a.url)
    token = owner["Authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=a.url, timeout=10) as ca:
        form = ca.get("/dashboard/login")
        ca.post("/dashboard/login", data={"token": token, "csrf_token": csrf_of(form.text)})
        session = ca.cookies.get("tally_session")
        page = ca.get(f"/dashboard/programs/{pid}/api-key")
        r = ca.post(
            f"/dashboard/programs/{pid}/api-key",
            data={"csrf_token": csrf_of(page.text), "confirm": "regenerate"},
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text
        shown_at = r.headers["location"]
    with httpx.Client(base_url=b.url, timeout=10, cookies={"tally_session": str(session)}) as cb:
        shown = cb.get(shown_at)
        found = re.search(r'<code id="new-api-key" class="secret">([^<]+)</code>', shown.text)
        assert found, "the replica serving the redirect shows the new key"
        new = found.group(1)
        assert new.startswith("aff_") and new != old
        assert _sold(cb, new, "in_new").status_code == 200
    with httpx.Client(base_url=a.url, timeout=10, cookies={"tally_session": str(session)}) as ca:
        assert new not in ca.get(shown_at).text  # once: a reload on any replica shows it no more


def _runs(database: str) -> list[tuple[object, ...]]:
    return _rows(database, "SELECT run_id, started_at, finished_at, sales FROM rc_runs ORDER BY run_no")


def test_scheduled_reconciles_take_turns_and_every_replica_reads_the_latest(
    pg_server: Server, tmp_path: Path
) -> None:
    database = pg_server.fresh_database()
    a = _replica(database, tmp_path, "a", TALLY_RECONCILE_INTERVAL_SECONDS="1")
    b = _replica(database, tmp_path, "b", TALLY_RECONCILE_INTERVAL_SECONDS="1")
    try:
        owner, pid, key = live_program(a.url)
        with httpx.Client(base_url=b.url, timeout=10) as cb:
            for n in range(20):
                assert _sold(cb, key, f"in_{n}").status_code == 200

        def caught_up() -> bool:
            runs = _runs(database)
            return len(runs) >= 6 and runs[-1][3] == 20

        wait_until(caught_up, "six scheduled runs, the last with every sale", 60, every=0.2)
        runs = _runs(database)
        spans = sorted((r[1], r[2]) for r in runs)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end  # no run started before the one before it had finished
        for url in (a.url, b.url):
            r = httpx.get(f"{url}/api/v1/programs/{pid}/sales", params={"limit": 100}, headers=owner)
            assert r.status_code == 200 and len(r.json()["data"]) == 20
    finally:
        a.stop()
        b.stop()


def _reconcile_quietly(url: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the replica is killed under it
        httpx.post(f"{url}/api/v1/operator/reconcile", headers=OP, timeout=60)


def test_a_replica_killed_mid_reconcile_leaves_the_previous_results_and_frees_the_lock(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    """A's run is held in the middle of publishing (the test locks `rc_runs` against writes, so
    A's publish transaction waits with the new tables half in place), then A is killed."""
    a, b = replicas
    owner, pid, key = live_program(a.url)
    database = str(a.database)
    with httpx.Client(base_url=a.url, timeout=30) as ca:
        for n in range(30):
            assert _sold(ca, key, f"in_{n}").status_code == 200
        assert ca.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
        for n in range(30, 60):
            assert _sold(ca, key, f"in_{n}").status_code == 200
    before = _runs(database)
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tally'"
    waiting += " AND wait_event_type = 'Lock'"
    with psycopg.connect(database) as blocker:
        blocker.execute(b"LOCK TABLE rc_runs IN EXCLUSIVE MODE")  # reads go on, writes wait
        run = threading.Thread(target=_reconcile_quietly, args=(a.url,))
        run.start()
        wait_until(lambda: _rows(database, waiting) == [(1,)], "A's publish to wait on rc_runs", every=0.05)
        kill(a.process)
        blocker.rollback()
    run.join(30)
    # The killed replica's sessions end once their server processes see it gone: its publish
    # transaction is rolled back and its run lock (an advisory lock) released.
    held = "SELECT count(*) FROM pg_locks WHERE database = (SELECT oid FROM pg_database WHERE datname ="
    held += " current_database()) AND (locktype = 'advisory' OR relation = 'rc_runs'::regclass)"
    wait_until(lambda: _rows(database, held) == [(0,)], "the killed replica's sessions to end")
    assert _runs(database) == before  # the published tables are still the previous run's
    r = httpx.get(f"{b.url}/api/v1/programs/{pid}/sales", params={"limit": 100}, headers=owner)
    assert len(r.json()["data"]) == 30
    r = httpx.post(f"{b.url}/api/v1/operator/reconcile", headers=OP, timeout=30)  # no lease to wait for
    assert r.status_code == 200, r.text
    r = httpx.get(f"{b.url}/api/v1/programs/{pid}/sales", params={"limit": 100}, headers=owner)
    assert len(r.json()["data"]) == 60


def test_a_replica_killed_under_load_loses_no_acknowledged_event(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    a, b = replicas
    _, _, key = live_program(a.url)
    loads = [Load(a.url, key, workers=4), Load(b.url, key, workers=4)]
    loads[0].wait_for(300)
    kill(a.process)
    loads[1].wait_for(len(loads[1].acked) + 100)  # B goes on taking sales once A is gone
    acked = [txn for load in loads for txn in load.stop()]
    assert len(acked) >= 300
    accepted = "SELECT transaction_id FROM raw_events WHERE outcome = 'accepted'"
    stored = {str(row[0]) for row in _rows(str(b.database), accepted)}
    assert set(acked) <= stored
    seqs = [int(str(row[0])) for row in _rows(str(b.database), "SELECT seq FROM raw_events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))  # no gap, no duplicate


def test_while_postgresql_is_down_a_replica_answers_503_and_recovers_by_itself(tmp_path: Path) -> None:
    cluster = Cluster(durable=True)
    try:
        database = cluster.url(cluster.create_database())
        server = _replica(database, tmp_path, "a")
        try:
            _, _, key = live_program(server.url)
            with httpx.Client(base_url=server.url, timeout=30) as c:
                assert _sold(c, key, "in_before").status_code == 200
                cluster.stop("immediate")
                for n in range(5):
                    r = _sold(c, key, f"in_down_{n}")
                    assert r.status_code == 503, r.text
                    assert r.json()["error"]["code"] == "database_unavailable"
                    assert r.json()["error"]["doc_url"].endswith("#database_unavailable")
                assert c.get("/readyz").status_code == 503
                assert c.get("/healthz").status_code == 200  # the process is up
                cluster.start()
                wait_until(lambda: c.get("/readyz").status_code == 200, "the replica to be ready", every=0.2)
                assert _sold(c, key, "in_after").status_code == 200
                assert _sold(c, key, "in_before").status_code == 409  # acknowledged before: still there
        finally:
            server.stop()
        accepted = "SELECT transaction_id FROM raw_events WHERE outcome = 'accepted' ORDER BY seq"
        assert _rows(database, accepted) == [("in_before",), ("in_after",)]  # nothing of the refused ones
    finally:
        cluster.close()


def test_after_postgresql_restarts_the_first_calls_find_healthy_connections(tmp_path: Path) -> None:
    """PostgreSQL restarted between two calls (no call saw it down): every pooled, lookup and
    writer connection of the replica is dead, and each is found so when it is checked out and
    replaced, so the first reconcile, sale and read after the restart answer 200, not 503."""
    cluster = Cluster()
    try:
        database = cluster.url(cluster.create_database())
        server = _replica(database, tmp_path, "a")
        try:
            owner, pid, key = live_program(server.url)
            with httpx.Client(base_url=server.url, timeout=60) as c:
                assert _sold(c, key, "in_before").status_code == 200
                assert c.post("/api/v1/operator/reconcile", headers=OP).status_code == 200
                assert c.get(f"/api/v1/programs/{pid}/sales", headers=owner).status_code == 200
                cluster.restart()
                r = c.post("/api/v1/operator/reconcile", headers=OP)
                assert r.status_code == 200, r.text
                assert _sold(c, key, "in_after").status_code == 200
                r = c.get(f"/api/v1/programs/{pid}/sales", headers=owner)
                assert r.status_code == 200 and len(r.json()["data"]) == 1
        finally:
            server.stop()
    finally:
        cluster.close()


def test_right_after_postgresql_comes_back_under_load_requests_answer_or_say_when_to_retry(
    tmp_path: Path,
) -> None:
    """PostgreSQL stopped (fast, immediate) and started again three times under load. While it
    is down, and in the moment after it accepts connections before the replica's probe has
    reached it (its next attempt, every `PROBE_SECONDS`: docs/operations.md says so), a request
    answers 503 `database_unavailable` with `Retry-After: 1`; a client that waits that long gets
    a 2xx on a retry (the first, unless the machine is very busy), and every request after it
    answers 2xx (no connection of the pool, of a lookup thread or of the writer left broken, no
    second outage)."""
    cluster = Cluster(durable=True)  # an immediate stop is a crash: what was committed stays
    try:
        database = cluster.url(cluster.create_database())
        server = _replica(database, tmp_path, "a")
        try:
            owner, pid, key = live_program(server.url)
            load = Load(server.url, key, workers=4)
            load.wait_for(20)
            with httpx.Client(base_url=server.url, timeout=30) as c:
                for n, mode in enumerate(("fast", "immediate", "fast")):
                    cluster.stop(mode)
                    r = _sold(c, key, f"in_down_{n}")
                    assert (r.status_code, r.json()["error"]["code"]) == (503, "database_unavailable"), r.text
                    assert r.headers.get("Retry-After") == "1"
                    cluster.start()
                    r = _sold(c, key, f"in_up_{n}")  # the instant it accepts connections
                    for _ in range(5):  # a client honouring Retry-After (more than once: a loaded CI)
                        if r.status_code != 503:
                            break
                        assert r.json()["error"]["code"] == "database_unavailable", r.text
                        assert r.headers.get("Retry-After") == "1"
                        time.sleep(int(r.headers["Retry-After"]))
                        r = _sold(c, key, f"in_up_{n}")
                    assert r.status_code == 200, r.text
                    for m in range(10):
                        assert _sold(c, key, f"in_up_{n}_{m}").status_code == 200
                        read = c.get(f"/api/v1/programs/{pid}/sales", params={"limit": 1}, headers=owner)
                        assert read.status_code == 200, read.text
            acked = load.stop()
            assert len(acked) >= 20
        finally:
            server.stop()
        accepted = {str(row[0]) for row in _rows(database, "SELECT transaction_id FROM raw_events")}
        assert set(acked) <= accepted
        assert {f"in_up_{n}" for n in range(3)} <= accepted
        assert not any(txn.startswith("in_down_") for txn in accepted)
    finally:
        cluster.close()
