"""The storage contract every backend must pass: the embedded DuckDB file and PostgreSQL (the
`backend` parameter, tests/conftest.py). Where the backends differ by design (one process on an
embedded file, several on a shared database), the test says which it checks."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ingest.domain.records import (
    LOG_DETAIL_SHOWN,
    LOG_PAGE_MAX,
    Credential,
    Partner,
    Program,
    ProgramSettings,
    StoredSession,
)
from ingest.storage.contract import Store, Tx
from ingest.storage.duckdb.store import DuckStore
from ingest.storage.factory import open_store as open_backend
from ingest.writer import Writer
from tests.conftest import ROOT
from tests.helpers import sql_rows

AT = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def open_store(database: str, tmp_path: Path) -> Callable[[], Store]:
    """Opens a store (a new instance each call) on the test's database."""
    count = iter(range(1_000))
    return lambda: open_backend(database, engine_dir=str(tmp_path / f"engine{next(count)}"))


def _seed(store: Store) -> None:
    w = Writer(store)
    w.start()
    program = Program("prog_1", "ws_1", "P", ProgramSettings(stripe_account_id="acct_9"), AT, AT)

    def op(tx):  # type: ignore[no-untyped-def]
        tx.add_account("acc_1", "o@x.test", AT)
        tx.add_workspace("ws_1", "W", AT)
        tx.add_member("ws_1", "acc_1", "owner", AT)
        tx.put_program(program)
        tx.add_partner(Partner("ptn_1", "prog_1", "alice", "Alice", None, AT))
        tx.add_credential(Credential("h1", "program", "prog_1", "aff_••••••••abcd", AT))
        base = {
            "received_at": AT,
            "source": "track",
            "program_id": "prog_1",
            "outcome": "accepted",
            "body": "{}",
            "headers": "{}",
        }
        tx.append(
            {**base, "kind": "click", "event_id": "clk_1", "click_id": "clk_1", "partner_code": "alice"}
        )
        tx.append(
            {
                **base,
                "kind": "lead",
                "event_id": "lead_1",
                "customer_key": "c1",
                "click_id": "clk_1",
                "lead_status": "settled",
            }
        )
        seq = tx.append(
            {
                **base,
                "kind": "sale",
                "event_id": "sale_1",
                "transaction_id": "in_1",
                "amount": 900,
                "currency": "usd",
                "customer_key": "c1",
            }
        )
        tx.claim_keys("prog_1", ["in_1"], seq)
        tx.append(
            {
                **base,
                "kind": "refund",
                "event_id": "rfd_1",
                "transaction_id": "in_1",
                "refund_id": "re_1",
                "amount": 100,
            }
        )
        tx.check("prog_1", "sale_received", AT)
        tx.log("prog_1", AT, "track/sale", 200, "accepted", "ok", "req_1", seq)

    w.run_sync(op)
    w.stop()


def _put_program(program: Program, tx: Tx) -> None:
    tx.put_program(program)


def test_programs_are_found_by_their_stripe_account_through_changes_rollbacks_and_reopen(
    open_store: Callable[[], Store],
) -> None:
    """Webhook routing's lookup: the programs connected to an account, oldest first, as programs
    are added, moved to another account, and changed in a transaction that fails (undone)."""

    def program(pid: str, account: str | None, minutes: int) -> Program:
        at = AT + timedelta(minutes=minutes)
        return Program(pid, "ws_1", pid, ProgramSettings(stripe_account_id=account), at, at)

    def found(store: Store) -> dict[str, list[str]]:
        return {
            a: [p.program_id for p in store.programs_for_stripe_account(a)]
            for a in ("acct_1", "acct_2", "acct_3")
        }

    store = open_store()
    w = Writer(store)
    w.start()
    try:
        w.run_sync(lambda tx: tx.add_workspace("ws_1", "W", AT))
        added = [
            program("prog_b", "acct_1", 2),
            program("prog_a", "acct_1", 1),
            program("prog_c", "acct_2", 3),
        ]
        for made in added:
            w.run_sync(functools.partial(_put_program, made))
        w.run_sync(lambda tx: tx.put_program(program("prog_d", None, 4)))
        assert found(store) == {"acct_1": ["prog_a", "prog_b"], "acct_2": ["prog_c"], "acct_3": []}
        w.run_sync(lambda tx: tx.put_program(program("prog_b", "acct_2", 2)))
        assert found(store) == {"acct_1": ["prog_a"], "acct_2": ["prog_b", "prog_c"], "acct_3": []}

        def fails(tx):  # type: ignore[no-untyped-def]
            tx.put_program(program("prog_a", "acct_3", 1))
            tx.put_program(program("prog_e", "acct_3", 5))
            raise ValueError("the operation fails after its writes")

        with pytest.raises(ValueError):
            w.run_sync(fails)
        assert found(store) == {"acct_1": ["prog_a"], "acct_2": ["prog_b", "prog_c"], "acct_3": []}
    finally:
        w.stop()
        store.close()
    store = open_store()
    try:
        assert found(store) == {"acct_1": ["prog_a"], "acct_2": ["prog_b", "prog_c"], "acct_3": []}
    finally:
        store.close()


def test_everything_survives_reopen(open_store: Callable[[], Store]) -> None:
    store = open_store()
    _seed(store)
    store.close()
    store = open_store()
    try:
        program = store.program("prog_1")
        assert program is not None and program.settings.stripe_account_id == "acct_9"
        assert [p.program_id for p in store.programs_for_stripe_account("acct_9")] == ["prog_1"]
        assert store.role("ws_1", "acc_1") == "owner"
        assert store.workspaces_of("acc_1") == {"ws_1": "owner"}
        assert store.partner("prog_1", "alice") is not None
        cred = store.credential("h1")
        assert cred is not None and cred.kind == "program" and cred.created_at == AT
        assert store.click_partner("prog_1", "clk_1") == "alice"
        binding = store.binding("prog_1", "c1")
        assert binding is not None and binding.partner_code == "alice"
        ledger = store.sale("prog_1", ["in_1"])
        assert ledger is not None and (ledger.amount, ledger.refunded) == (900, 100)
        assert store.refund_seen("prog_1", "re_1")
        assert store.checklist("prog_1") == {"sale_received": AT}
        [line] = store.tracking_log("prog_1", 10)
        assert (line.endpoint, line.raw_seq, line.logged_at) == ("track/sale", 3, AT)
        assert sql_rows(store, "SELECT max(seq) FROM raw_events") == [(4,)]
    finally:
        store.close()


def test_revoked_credentials_do_not_come_back(open_store: Callable[[], Store]) -> None:
    store = open_store()
    _seed(store)
    w = Writer(store)
    w.start()
    w.run_sync(lambda tx: tx.revoke_credentials("program", "prog_1", AT))
    w.stop()
    assert store.credential("h1") is None
    store.close()
    store = open_store()
    assert store.credential("h1") is None
    assert store.program_credential("prog_1") is None
    store.close()


def test_dashboard_sessions_outlive_the_store_and_end_and_expire(open_store: Callable[[], Store]) -> None:
    """Sessions live in the database: a new store instance (a restart) still knows them; an
    ended one is gone; an expired one is not answered, and the next login sweeps it away."""
    live = StoredSession("hash_live", "acc_1", "csrf_1", AT, AT + timedelta(hours=12))
    ended = StoredSession("hash_ended", "acc_1", "csrf_2", AT, AT + timedelta(hours=12))
    short = StoredSession("hash_short", "acc_2", "csrf_3", AT, AT + timedelta(minutes=1))
    store = open_store()
    for session in (live, ended, short):
        store.save_session(session)
    store.end_session("hash_ended")
    store.close()

    store = open_store()
    try:
        assert store.load_session("hash_live", AT + timedelta(hours=1)) == live
        assert store.load_session("hash_ended", AT) is None
        assert store.load_session("hash_short", AT) == short
        assert store.load_session("hash_short", AT + timedelta(minutes=1)) is None
        assert store.load_session("unknown", AT) is None
        two = AT + timedelta(hours=2)
        later = StoredSession("hash_later", "acc_2", "csrf_4", two, two + timedelta(hours=1))
        store.save_session(later)
        assert store.load_session("hash_short", AT) is None  # swept by the later save
        assert store.load_session("hash_live", AT + timedelta(hours=2)) == live
    finally:
        store.close()


def test_claims_report_what_they_claimed(open_store: Callable[[], Store]) -> None:
    """A conflicting claim is the write's result: in one transaction or the next, whoever
    claims a taken key learns it from the claim itself."""
    store = open_store()
    try:
        tx = store.begin()
        assert tx.claim_keys("prog_1", ["in_1", "in_2"], 1) == ["in_1", "in_2"]
        assert tx.claim_keys("prog_1", ["in_2", "in_3"], 2) == ["in_3"]
        tx.commit()
        tx = store.begin()
        assert tx.claim_keys("prog_1", ["in_1", "in_4"], 3) == ["in_4"]
        assert tx.claim_keys("prog_2", ["in_1"], 3) == ["in_1"]  # keys are per program
        tx.rollback()
        tx = store.begin()
        assert tx.claim_keys("prog_1", ["in_4"], 4) == ["in_4"]  # a rolled-back claim took nothing
        tx.commit()
    finally:
        store.close()


def test_a_second_store_on_an_embedded_database_is_refused(tmp_path: Path) -> None:
    """The embedded backend has one writer (its journal and key index sit beside the file):
    a second store on the same file, in this process or another, is refused with the reason,
    and may open it once the first has closed."""
    from ingest.storage.duckdb.store import DatabaseInUse

    first = DuckStore(tmp_path / "one.duckdb")
    try:
        with pytest.raises(DatabaseInUse, match="in use by another tally store"):
            DuckStore(tmp_path / "one.duckdb")
    finally:
        first.close()
    DuckStore(tmp_path / "one.duckdb").close()


def test_leases_exclude_other_holders_until_they_expire_or_are_released(
    open_store: Callable[[], Store], backend: str
) -> None:
    store = open_store()
    ttl = timedelta(minutes=10)
    try:
        assert store.acquire_lease("reconcile", "a", AT, ttl)
        assert not store.acquire_lease("reconcile", "b", AT + timedelta(minutes=9), ttl)
        assert store.acquire_lease("reconcile", "a", AT + timedelta(minutes=9), ttl)  # renewed...
        assert not store.acquire_lease("reconcile", "b", AT + timedelta(minutes=18), ttl)  # ...so held
        assert store.acquire_lease("other", "b", AT, ttl)  # leases are per name
        store.release_lease("reconcile", "b")  # not b's to release
        assert not store.acquire_lease("reconcile", "b", AT + timedelta(minutes=10), ttl)
        store.release_lease("reconcile", "a")
        assert store.acquire_lease("reconcile", "b", AT + timedelta(minutes=10), ttl)
    finally:
        store.close()
    reopened = open_store()
    try:
        if _shared(backend):  # a holder gone with its connection frees the lock at once
            assert reopened.acquire_lease("reconcile", "c", AT + timedelta(minutes=11), ttl)
        else:  # a holder that died: its lease outlives it only until it expires
            assert not reopened.acquire_lease("reconcile", "c", AT + timedelta(minutes=19), ttl)
            assert reopened.acquire_lease("reconcile", "c", AT + timedelta(minutes=21), ttl)
    finally:
        reopened.close()


# A process that takes the reconcile lease as the reconciler names itself, then stays alive (on
# the embedded file it closes its store, as one file admits one store, leaving the lease row).
_HOLDER = """
import sys, time
from datetime import UTC, datetime, timedelta
from ingest.storage import lockfile
from ingest.storage.factory import open_store
store = open_store(sys.argv[1], engine_dir=sys.argv[2])
now, ttl = datetime.now(UTC), timedelta(minutes=10)
assert store.acquire_lease("reconcile", lockfile.identity() + ":run1", now, ttl)
if sys.argv[3] == "close":
    store.close()
print("held", flush=True)
time.sleep(600)
"""


def test_a_lease_whose_holder_was_killed_is_free_at_once(
    open_store: Callable[[], Store], backend: str, database: str, tmp_path: Path
) -> None:
    """A holder alive keeps the lease; SIGKILLed mid-run (nothing released), the lease is free
    at once, long before it would expire: on the embedded file its process no longer runs, on
    PostgreSQL its connection (and so its advisory lock) is gone."""
    open_store().close()  # migrated
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLDER,
            database,
            str(tmp_path / "engine-holder"),
            "keep" if _shared(backend) else "close",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        store = open_store()
        try:
            now = datetime.now(UTC)
            assert not store.acquire_lease("reconcile", "next", now, timedelta(minutes=10))
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            # PostgreSQL ends the dead client's session as soon as it reads the closed socket
            deadline = time.monotonic() + (5 if _shared(backend) else 0)
            while not store.acquire_lease(
                "reconcile", "next", now + timedelta(seconds=1), timedelta(minutes=10)
            ):
                assert time.monotonic() < deadline, "the killed holder's lease was not freed"
                time.sleep(0.05)
        finally:
            store.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout:
            holder.stdout.close()


def _click(n: int) -> dict[str, object]:
    return {
        "received_at": AT,
        "source": "track",
        "kind": "click",
        "program_id": "prog_1",
        "outcome": "accepted",
        "event_id": f"clk_{n}",
        "click_id": f"clk_{n}",
        "partner_code": "alice",
        "body": "{}",
        "headers": "{}",
    }


def test_a_group_commit_keeps_its_rows_numbers_whatever_their_size(
    open_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raw rows, tracking-log lines and claims of one group commit get consecutive numbers in
    the order they were appended, each line and claim naming its own row, also when the rows
    are sent in several statements (PostgreSQL sends them as JSON documents of at most
    `CHUNK_BYTES`; here a few rows each)."""
    from ingest.storage.postgres import tx as postgres_tx

    monkeypatch.setattr(postgres_tx, "CHUNK_BYTES", 2_000)
    store = open_store()
    try:
        tx = store.begin()
        tx.append(_click(0))
        tx.commit()  # one row before: the group's numbers start after it
        store.flush()
        first = sql_rows(store, "SELECT max(seq) FROM raw_events")[0][0]
        tx = store.begin()
        bodies = [json.dumps({"n": n, "pad": "x" * (300 * n)}) for n in range(12)]
        for n, body in enumerate(bodies, start=1):
            seq = tx.append({**_click(n), "body": body})
            tx.log("prog_1", AT, "track/click", 201, "accepted", f"click {n}", None, seq)
            tx.claim_keys("prog_1", [f"key_{n}"], seq)
        tx.commit()
        store.flush()
        rows = sql_rows(store, "SELECT seq, event_id, body FROM raw_events ORDER BY seq")
        assert [r[0] for r in rows] == list(range(first, first + 13))
        assert [(r[1], r[2]) for r in rows[1:]] == [(f"clk_{n}", b) for n, b in enumerate(bodies, start=1)]
        lines = sql_rows(store, "SELECT detail, raw_seq FROM tracking_log ORDER BY log_id")
        assert lines == [(f"click {n}", first + n) for n in range(1, 13)]
        claims = sql_rows(store, "SELECT key, raw_seq FROM idempotency_keys ORDER BY raw_seq")
        assert claims == [(f"key_{n}", first + n) for n in range(1, 13)]
    finally:
        store.close()


def test_the_watermark_promises_no_lower_row_can_still_appear(open_store: Callable[[], Store]) -> None:
    store = open_store()
    try:
        assert store.watermark() == 0
        for n in range(3):
            tx = store.begin()
            tx.append(_click(n))
            tx.commit()
        mark = store.watermark()
        visible = [r[0] for r in sql_rows(store, "SELECT seq FROM raw_events ORDER BY seq")]
        assert [s for s in visible if s <= mark] == list(range(1, mark + 1))  # nothing missing below it
        store.flush()
        assert store.watermark() == 3
        assert [r[0] for r in sql_rows(store, "SELECT seq FROM raw_events ORDER BY seq")] == [1, 2, 3]
    finally:
        store.close()


def test_checklist_steps_are_kept_the_first_time_only(open_store: Callable[[], Store]) -> None:
    store = open_store()
    try:
        for at in (AT, AT + timedelta(days=1)):
            tx = store.begin()
            tx.check("prog_1", "click_received", at)
            tx.check("prog_1", "click_received", at + timedelta(hours=1))
            tx.commit()
        assert store.checklist("prog_1") == {"click_received": AT}
    finally:
        store.close()
    reopened = open_store()
    try:
        assert reopened.checklist("prog_1") == {"click_received": AT}
    finally:
        reopened.close()


def test_the_tracking_log_pages_newest_first(open_store: Callable[[], Store]) -> None:
    store = open_store()
    try:
        tx = store.begin()
        for n in range(5):
            tx.log(
                "prog_1", AT + timedelta(seconds=n), "track/click", 200, "accepted", f"line {n}", None, None
            )
        tx.log("prog_2", AT, "track/click", 200, "accepted", "another program", None, None)
        tx.commit()
        store.flush()
        first = store.tracking_log("prog_1", 2)
        assert [line.detail for line in first] == ["line 4", "line 3"]
        rest = store.tracking_log("prog_1", 10, before=first[-1].log_id)
        assert [line.detail for line in rest] == ["line 2", "line 1", "line 0"]
        assert store.tracking_log("prog_1", 10, before=rest[-1].log_id) == []
    finally:
        store.close()


def test_a_tracking_log_page_is_bounded_whatever_the_log_holds(open_store: Callable[[], Store]) -> None:
    """Lines written before refusal notes were bounded may hold a megabyte each: a page cuts
    them, and never holds more than LOG_PAGE_MAX lines, whatever the caller asks."""
    store = open_store()
    huge = "x" * (1024 * 1024)
    try:
        tx = store.begin()
        for n in range(LOG_PAGE_MAX + 20):
            detail = huge if n % 100 == 0 else f"line {n}"
            tx.log("prog_1", AT, "webhooks/stripe", 400, "invalid_signature", detail, None, None)
            if n % 100 == 50:
                tx.log("prog_2", AT, "webhooks/stripe", 400, "invalid_signature", huge, None, None)
        tx.commit()
        store.flush()
        page = store.tracking_log("prog_1", 10_000)
        assert len(page) == LOG_PAGE_MAX and {line.program_id for line in page} == {"prog_1"}
        assert [line.detail for line in page[:2]] == [
            f"line {LOG_PAGE_MAX + 19}",
            f"line {LOG_PAGE_MAX + 18}",
        ]
        assert max(len(line.detail) for line in page) == LOG_DETAIL_SHOWN  # the megabyte lines, cut
        rest = store.tracking_log("prog_1", 3, before=page[-1].log_id)
        assert [line.detail for line in rest] == ["line 19", "line 18", "line 17"]
        ids = [line.log_id for line in page + rest]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    finally:
        store.close()


def _shared(backend: str) -> bool:
    """Whether the backend takes several store instances (processes) on one database."""
    return backend == "postgresql"


def _sale(n: int, txn: str) -> dict[str, object]:
    return {
        "received_at": AT,
        "source": "track",
        "kind": "sale",
        "program_id": "prog_1",
        "outcome": "accepted",
        "event_id": f"sale_{n}",
        "transaction_id": txn,
        "customer_key": "c1",
        "amount": 100,
        "currency": "usd",
        "body": "{}",
        "headers": "{}",
    }


def test_two_instances_claiming_the_same_keys_at_once_each_key_goes_to_one(
    open_store: Callable[[], Store], backend: str
) -> None:
    """Two instances (two replicas) over one database, each with its writer, claim overlapping
    keys at the same moment: every key is claimed exactly once, and each claimer learns from its
    own claim whether it won. (The embedded backend refuses a second instance instead.)"""
    first = open_store()
    try:
        if not _shared(backend):
            with pytest.raises(Exception, match="in use by another tally store"):
                open_store()
            return
        second = open_store()
        writers = [Writer(first), Writer(second)]
        for w in writers:
            w.start()
        keys = [f"in_{n}" for n in range(200)]
        start = threading.Barrier(8)

        def claimer(index: int) -> list[str]:
            w = writers[index % 2]
            start.wait()
            won: list[str] = []
            mine = keys[index % 3 :] if index % 2 == 0 else keys[::-1]  # overlapping, in both orders
            for key in mine:
                won += w.run_sync(lambda tx, k=key: tx.claim_keys("prog_1", [k], tx.append(_sale(0, k))))
            return won

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(claimer, range(8)))
        for w in writers:
            w.stop()
        won = sorted(k for r in results for k in r)
        assert won == sorted(keys)  # each key once, none lost
        rows = sql_rows(first, "SELECT key, count(*) FROM idempotency_keys GROUP BY key HAVING count(*) > 1")
        assert rows == []
        second.close()
    finally:
        first.close()


@pytest.mark.shared
def test_a_key_revoked_through_one_instance_is_refused_through_another_at_once(
    open_store: Callable[[], Store], backend: str
) -> None:
    """A regenerated key: the old credential revoked and the new one issued through instance A
    is what instance B answers from the moment A's commit returns (no cache to go stale)."""
    a, b = open_store(), open_store()
    try:
        _seed(a)
        assert b.credential("h1") is not None  # B has looked it up (and would have cached it)
        w = Writer(a)
        w.start()
        new = Credential("h2", "program", "prog_1", "aff_••••••••wxyz", AT)

        def regenerate(tx):  # type: ignore[no-untyped-def]
            tx.revoke_credentials("program", "prog_1", AT)
            tx.add_credential(new)

        w.run_sync(regenerate)
        w.stop()
        assert b.credential("h1") is None
        found = b.credential("h2")
        assert found is not None and found.subject_id == "prog_1"
        assert b.program_credential("prog_1") == found
    finally:
        b.close()
        a.close()


@pytest.mark.shared
def test_a_cached_program_key_is_read_again_by_every_group_commit(
    open_store: Callable[[], Store], backend: str
) -> None:
    """The track endpoints read program keys from a replica's cache; every group commit reads
    the keys its operations were let in with again, and an operation whose key another instance
    flagged or revoked meanwhile is handed back (`KeyChanged`) with the cache now holding the key
    as it is, so the endpoint decides it again: flagged (rotation headers) or refused."""
    from ingest.storage.contract import Needs
    from ingest.writer import KeyChanged

    a, b = open_store(), open_store()
    wa, wb = Writer(a), Writer(b)
    try:
        _seed(a)
        wa.start()
        wb.start()
        read = b.credential_and_program("h1")
        assert read is not None and read[0].flagged_at is None

        def nothing(tx):  # type: ignore[no-untyped-def]
            return "done"

        assert wb.submit(nothing, needs=Needs(key=read)).result() == "done"  # still as read
        wa.run_sync(lambda tx: tx.flag_credential("h1", AT, AT + timedelta(days=30)))
        assert b.credential_and_program("h1") == read  # B's cache has not seen it...
        with pytest.raises(KeyChanged):
            wb.submit(nothing, needs=Needs(key=read)).result()  # ...its next group commit has
        flagged = b.credential_and_program("h1")
        assert flagged is not None and flagged[0].flagged_at == AT
        assert wb.submit(nothing, needs=Needs(key=flagged)).result() == "done"
        wa.run_sync(lambda tx: tx.revoke_credentials("program", "prog_1", AT))
        with pytest.raises(KeyChanged):
            wb.submit(nothing, needs=Needs(key=flagged)).result()
        assert b.credential_and_program("h1") is None  # refused from now on
    finally:
        wb.stop()
        wa.stop()
        b.close()
        a.close()


@pytest.mark.shared
def test_a_transaction_that_commits_late_never_lands_below_the_watermark(
    open_store: Callable[[], Store], backend: str
) -> None:
    """Concurrent writers commit out of order: one instance's transaction holds rows while
    another commits. The watermark read meanwhile covers only rows already visible, and the
    held rows, once committed, all come above every seq that was visible before: a reconciler
    that has read up to the watermark never misses them."""
    a, b = open_store(), open_store()
    try:
        held = a.begin()
        for n in range(3):
            held.append(_click(100 + n))
        for n in range(5):
            tx = b.begin()
            tx.append(_click(n))
            tx.commit()
        mark = b.watermark()
        seen = sorted(r[0] for r in sql_rows(b, "SELECT seq FROM raw_events"))
        assert seen == list(range(1, mark + 1))  # everything at or below it is visible
        held.commit()
        late = sorted(
            r[0] for r in sql_rows(a, "SELECT seq FROM raw_events WHERE event_id LIKE ?", ["clk_10%"])
        )
        assert len(late) == 3 and min(late) > mark
        assert a.watermark() == mark + 3
    finally:
        b.close()
        a.close()


@pytest.mark.shared
def test_the_raw_log_refuses_updates_deletes_and_truncation_in_the_database(
    open_store: Callable[[], Store], backend: str, database: str
) -> None:
    """On PostgreSQL the database itself keeps the raw log append-only: whatever a client with
    tally's own role tries, UPDATE, DELETE and TRUNCATE of `raw_events` are refused and the rows
    stay as they were. (The embedded file has one process, tally's: tests/ingest/test_append_only.py
    checks no code path of it issues such statements.)"""
    import psycopg

    store = open_store()
    try:
        tx = store.begin()
        for n in range(3):
            tx.append(_click(n))
        tx.commit()
        before = sql_rows(store, "SELECT * FROM raw_events ORDER BY seq")
    finally:
        store.close()
    for statement in (
        "UPDATE raw_events SET partner_code = 'mallory'",
        "DELETE FROM raw_events WHERE seq = 2",
        "TRUNCATE raw_events",
        "TRUNCATE raw_events CASCADE",
    ):
        with (
            psycopg.connect(database, autocommit=True) as con,
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"),
        ):
            con.execute(statement.encode())
    store = open_store()
    try:
        assert sql_rows(store, "SELECT * FROM raw_events ORDER BY seq") == before
    finally:
        store.close()
