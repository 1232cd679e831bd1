"""The key index's write buffer (ingest/hotkeys.py): operations released inside a group leave
nothing, sealed writes carried across groups and flushed at any point answer exactly as the
index file does once everything is written, on the writer's thread and on any other.

The reference is the same rows, without the released ones, applied one at a time with every row
written to SQLite before the next is looked up: no buffer, no sealed writes, no prefetch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.domain.keys import EVENT_KEY_SPACE, claims_of, refund_claim, sale_claim
from ingest.storage.contract import Needs
from ingest.storage.duckdb import keys as hotkeys
from ingest.storage.duckdb.keys import KeyIndex
from tests.helpers import STORE_AT
from tests.hypothesis_profiles import examples

PROGRAMS = ("p", "q")
CUSTOMERS = ("c1", "c2")
CLICKS = ("k1", "k2")
SALE_IDS = ("t1", "t2", "pi1", "pi2", "ch1")
REFUNDS = ("r1", "r2")
EVENTS = ("e1", "e2", "e3")

# Few values, so rows meet: a lead settles a customer another made provisional, a refund finds
# its sale, a processor event names a sale a track call recorded.
_program = st.sampled_from(("p", "p", "p", "q"))
_outcome = st.sampled_from(("accepted", "accepted", "accepted", "duplicate"))


def _track(kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A track call's raw row of `kind`: a program, an outcome and `fields`."""
    common = {"kind": st.just(kind), "program_id": _program, "outcome": _outcome}
    return st.fixed_dictionaries({**common, **fields})


_click = _track("click", click_id=st.sampled_from(CLICKS), partner_code=st.sampled_from(("ann", "bob")))
_lead = _track(
    "lead",
    customer_key=st.sampled_from(CUSTOMERS),
    click_id=st.none() | st.sampled_from(CLICKS),
    lead_status=st.sampled_from(("settled", "provisional")),
)
_sale = _track(
    "sale",
    transaction_id=st.sampled_from(SALE_IDS),
    customer_key=st.sampled_from(CUSTOMERS),
    amount=st.integers(1, 5_000),
    currency=st.sampled_from(("usd", "eur")),
    test_mode=st.booleans(),
)
_refund = _track(
    "refund",
    transaction_id=st.sampled_from(SALE_IDS),
    refund_id=st.sampled_from(REFUNDS),
    amount=st.integers(1, 2_000),
)
_processor = st.fixed_dictionaries(
    {
        "kind": st.just("stripe"),
        "program_id": st.none() | _program,
        "outcome": st.sampled_from(("accepted", "accepted", "duplicate", "unroutable")),
        "event_id": st.sampled_from(EVENTS),
        "event_type": st.sampled_from(("invoice.paid", "charge.refunded", "customer.created")),
        "invoice_id": st.none() | st.sampled_from(("t1", "t2")),
        "payment_intent_id": st.none() | st.sampled_from(("pi1", "pi2")),
        "charge_id": st.none() | st.just("ch1"),
        "amount": st.none() | st.integers(0, 5_000),
        "currency": st.just("usd"),
        "test_mode": st.booleans(),
    }
)
_row = st.one_of(_click, _lead, _sale, _refund, _processor)
# A group commit: its operations, each a row and whether it is released (refused in the group).
_group = st.lists(st.tuples(_row, st.booleans()), min_size=0, max_size=6)


def _numbered(groups: list[list[tuple[dict[str, Any], bool]]]) -> list[list[tuple[dict[str, Any], bool]]]:
    """Give every row its raw-log fields (seq, received time, event id) in order."""
    seq = 0
    out = []
    for group in groups:
        rows = []
        for fields, released in group:
            seq += 1
            row = {
                "seq": seq,
                "received_at": STORE_AT + timedelta(seconds=seq),
                "event_id": f"ev_{seq}",
                **fields,
            }
            if row["kind"] == "stripe":
                row["event_id"] = fields["event_id"]
            rows.append((row, released))
        out.append(rows)
    return out


def _needs(row: dict[str, Any]) -> Needs:
    """What an operation of this row could ask the group to read ahead (everything it might)."""
    program = row.get("program_id") or "p"
    sale_ids = tuple((program, k) for k in SALE_IDS)
    who = tuple((program, c) for c in CUSTOMERS)
    return Needs(
        claims=tuple(claims_of(row)),
        sales=sale_ids,
        clicks=tuple((program, c) for c in CLICKS),
        bindings=who,
        provisional=who,
        refunds=tuple((program, r) for r in REFUNDS),
        events=EVENTS,
    )


def _apply(index: KeyIndex, row: dict[str, Any]) -> list[bool]:
    index.observe(row)
    return [index.claim(program, key) for program, key in claims_of(row)]


def _decisions(index: KeyIndex) -> dict[str, Any]:
    """Every answer the index gives (ledgers by their contents: their ids are the index's own)."""
    out: dict[str, Any] = {}
    for p in PROGRAMS:
        for c in CLICKS:
            out[f"click {p} {c}"] = index.click_partner(p, c)
        for c in CUSTOMERS:
            out[f"binding {p} {c}"] = index.binding(p, c)
            out[f"provisional {p} {c}"] = index.provisional_click(p, c)
        for k in SALE_IDS:
            out[f"sale {p} {k}"] = index.sale(p, [k])
            out[f"claim {p} {k}"] = index.claimed(p, sale_claim(k))
        for r in REFUNDS:
            out[f"refund {p} {r}"] = index.refund_seen(p, r)
            out[f"claim {p} refund {r}"] = index.claimed(p, refund_claim(r))
    for e in EVENTS:
        out[f"event {e}"] = index.event_seen(e)
        out[f"claim * {e}"] = index.claimed(EVENT_KEY_SPACE, e)
    return out


def _elsewhere(read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`read()` on another thread (what the event loop or a reader sees)."""
    box: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: box.append(read()))
    worker.start()
    worker.join()
    return box[0]


def _write_each(index: KeyIndex, rows: Iterable[dict[str, Any]]) -> list[list[bool]]:
    """The reference: each row its own transaction, in the file before the next is read."""
    claims = []
    for row in rows:
        index.begin()
        claims.append(_apply(index, row))
        index.commit(row["seq"], hotkeys.anchor_of(row["received_at"]), force=True)
    return claims


@settings(max_examples=examples(60, ci=400), deadline=None)
@given(
    groups=st.lists(_group, min_size=1, max_size=10),
    flush_rows=st.integers(1, 12),
    prefetch=st.booleans(),
)
def test_the_buffer_answers_as_the_file_does(
    tmp_path_factory: pytest.TempPathFactory, groups: list[Any], flush_rows: int, prefetch: bool
) -> None:
    tmp = tmp_path_factory.mktemp("keys")
    reference = KeyIndex(tmp / "reference.sqlite")
    index = KeyIndex(tmp / "buffered.sqlite")
    saved = hotkeys.FLUSH_ROWS, hotkeys.FLUSH_SECONDS
    hotkeys.FLUSH_ROWS, hotkeys.FLUSH_SECONDS = flush_rows, 3600.0  # flushed by rows only
    try:
        claims, reference_claims, last_kept = [], [], 0
        every_kept: list[dict[str, Any]] = []
        for group in _numbered(groups):
            index.begin()
            if prefetch:
                index.prefetch([_needs(row) for row, _ in group])
            kept = []
            for row, released in group:
                mark = index.mark()
                made = _apply(index, row)
                if released:
                    index.release(mark)
                else:
                    claims.append(made)
                    kept.append(row)
            last = kept[-1] if kept else None
            index.commit(
                last["seq"] if last else None, hotkeys.anchor_of(last["received_at"]) if last else ""
            )
            reference_claims += _write_each(reference, kept)
            every_kept += kept
            last_kept = last["seq"] if last else last_kept
            # Between groups the sealed writes may or may not be in the file yet: the writer's
            # thread and any other answer as the file does with the same rows in it.
            assert claims == reference_claims
            assert _decisions(index) == _decisions(reference)
            assert _elsewhere(lambda: _decisions(index)) == _decisions(reference)
        index.flush()
        assert index.position()[0] == last_kept
        assert index.counts() == reference.counts()
        # Catching up (or rebuilding) applies the same rows in runs read ahead: the same index.
        rebuilt = KeyIndex(tmp / "rebuilt.sqlite")
        try:
            assert rebuilt.apply(every_kept, commit_every=3) == len(every_kept)
            assert _decisions(rebuilt) == _decisions(reference)
            assert rebuilt.counts() == reference.counts()
        finally:
            rebuilt.close()
    finally:
        hotkeys.FLUSH_ROWS, hotkeys.FLUSH_SECONDS = saved
        index.close()
        reference.close()
