"""The storage contract of the partners' portal (ingest/storage/contract.py `Portal`), on every
backend: one-time sign-in links, partner sessions and payout details live in the database; a
link is taken exactly once, however many instances (replicas) use it at the same moment."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ingest.domain.records import PartnerSession, PayoutDetails, PortalLink
from ingest.storage.contract import Store
from ingest.storage.factory import open_store as open_backend

AT = datetime(2026, 11, 1, tzinfo=UTC)
WEEK = timedelta(days=7)


@pytest.fixture
def open_store(database: str, tmp_path: Path) -> Callable[[], Store]:
    count = iter(range(1_000))
    return lambda: open_backend(database, engine_dir=str(tmp_path / f"engine{next(count)}"))


def _link(token_hash: str, at: datetime = AT, code: str = "alice") -> PortalLink:
    return PortalLink(token_hash, "prog_1", code, at, at + WEEK, "acc_1")


def test_a_link_is_taken_once_and_never_after_it_expires(open_store: Callable[[], Store]) -> None:
    store = open_store()
    try:
        store.add_portal_link(_link("h_used"))
        store.add_portal_link(_link("h_late"))
        store.add_portal_link(_link("h_kept", code="bob"))
        store.close()
        store = open_store()  # a restart keeps them
        assert store.use_portal_link("h_used", AT + timedelta(days=6)) == _link("h_used")
        assert store.use_portal_link("h_used", AT + timedelta(days=6)) is None  # single use
        assert store.use_portal_link("h_late", AT + WEEK) is None  # expired at seven days
        assert store.use_portal_link("h_late", AT) is None  # and the expired use took it
        assert store.use_portal_link("unknown", AT) is None
        later = AT + timedelta(days=8)
        store.add_portal_link(_link("h_new", later))  # sweeps the expired ones
        assert store.use_portal_link("h_kept", AT) is None
        assert store.use_portal_link("h_new", later) == _link("h_new", later)
    finally:
        store.close()


def test_concurrent_uses_of_one_link_give_it_to_exactly_one(
    open_store: Callable[[], Store], backend: str
) -> None:
    """Sixteen sign-ins at the same moment, through two instances where the backend takes
    several (PostgreSQL replicas) or threads of the one (the embedded file): one gets the link."""
    first = open_store()
    stores = [first]
    try:
        if backend == "postgresql":
            stores.append(open_store())
        for n in range(20):
            first.add_portal_link(_link(f"h_{n}"))
        start = threading.Barrier(16)

        def use(index: int) -> list[str]:
            store = stores[index % len(stores)]
            start.wait()
            return [f"h_{n}" for n in range(20) if store.use_portal_link(f"h_{n}", AT) is not None]

        with ThreadPoolExecutor(16) as pool:
            taken = [h for found in pool.map(use, range(16)) for h in found]
        assert sorted(taken) == sorted(f"h_{n}" for n in range(20))  # each once, none lost
    finally:
        for store in stores:
            store.close()


def test_partner_sessions_outlive_the_store_and_end_and_expire(open_store: Callable[[], Store]) -> None:
    live = PartnerSession("s_live", "prog_1", "alice", "csrf_1", AT, AT + timedelta(hours=12))
    ended = PartnerSession("s_ended", "prog_1", "alice", "csrf_2", AT, AT + timedelta(hours=12))
    short = PartnerSession("s_short", "prog_1", "bob", "csrf_3", AT, AT + timedelta(minutes=1))
    store = open_store()
    for session in (live, ended, short):
        store.save_partner_session(session)
    store.end_partner_session("s_ended")
    store.close()
    store = open_store()
    try:
        assert store.load_partner_session("s_live", AT + timedelta(hours=1)) == live
        assert store.load_partner_session("s_ended", AT) is None
        assert store.load_partner_session("s_short", AT) == short
        assert store.load_partner_session("s_short", AT + timedelta(minutes=1)) is None
        # a dashboard session of the same hash is another thing: never a partner's
        assert store.load_session("s_live", AT) is None
        later = AT + timedelta(hours=2)
        store.save_partner_session(PartnerSession("s_2", "prog_1", "bob", "c", later, later + WEEK))
        assert store.load_partner_session("s_short", AT) is None  # swept
    finally:
        store.close()


def test_payout_details_are_set_replaced_and_kept_per_program(open_store: Callable[[], Store]) -> None:
    first = PayoutDetails("prog_1", "alice", "paypal", "alice@pay.test", "Alice A", "usd", AT, "partner")
    second = PayoutDetails("prog_1", "alice", "wise", "alice@wise.test", "Alice B", "eur", AT, "acc_1")
    other = PayoutDetails("prog_2", "alice", "paypal", "a2@pay.test", "Alice C", "gbp", AT, "partner")
    store = open_store()
    try:
        assert store.payout_details("prog_1") == {}
        store.set_payout_details(first)
        store.set_payout_details(other)
        assert store.payout_details("prog_1") == {"alice": first}
        store.set_payout_details(second)
        store.close()
        store = open_store()
        assert store.payout_details("prog_1") == {"alice": second}
        assert store.payout_details("prog_2") == {"alice": other}
    finally:
        store.close()
