"""One small program month with every kind of figure, built as raw-log rows (tests/reconcile/builders.py).

Program: 30 % commission, 5 % platform fee, 30 holding days, lifetime window; `NOW` is 2026-02-14 12:00.
January 2026 (T0 = Jan 10 12:00), usd unless said:

- s1  p1 (click -> lead ck_1)  100.00, refunded 33.33 on Jan 12      -> approved, commission 30.00 - 10.00
- s2  p2 (click -> lead ck_2)  200.00 on Jan 25, refunded 20.00 Feb 4 -> pending, 60.00 - 6.00
- s3  p1, the partner's own email, 50.00                            -> held, 15.00
- s4  p2  40.00, fully refunded on Jan 14                             -> reversed, 12.00 - 12.00
- cs_9 a connect checkout of 30.00 by p2's click on Jan 18, also tracked self-hosted as pi_9 (a pair)
- s5  7.00 with no attribution data; s6 8.00 with an unknown click; s7 a 9.00 test sale
- a duplicate of s1's transaction refused at ingest; a 1.00 refund of an unknown transaction
- s8  p1  50.00 EUR on Jan 17                                         -> pending, 15.00
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import polars as pl

from reconcile.pipeline import Result, reconcile
from tests.reconcile import builders as b
from tests.reconcile.builders import at

NOW = datetime(2026, 2, 14, 12, 0, tzinfo=UTC)
PROGRAM = b.PROGRAM
JANUARY = "2026-01"
FEBRUARY = "2026-02"
PARTNERS = b.partners(("p1", "p1@partner.test"), ("p2", "p2@partner.test"))


def january() -> list[dict[str, Any]]:
    return [
        b.click("clk_1", "p1"),
        b.click("clk_2", "p2"),
        b.click("clk_3", "p1"),
        b.lead("lead_1", "ck_1", click_id="clk_1"),
        b.lead("lead_2", "ck_2", click_id="clk_2"),
        b.lead("lead_3", "ck_3", click_id="clk_3"),
        b.track_sale("s1", "tx_1", 10_000, customer_key="ck_1"),
        b.track_refund("re_1", "tx_1", 3_333, occurred_at=at(2)),
        b.track_sale("s2", "tx_2", 20_000, customer_key="ck_2", occurred_at=at(15)),
        b.track_refund("re_2", "tx_2", 2_000, occurred_at=at(25)),
        b.track_sale("s3", "tx_3", 5_000, customer_key="ck_3", email="P1@partner.test", occurred_at=at(1)),
        b.track_sale("s4", "tx_4", 4_000, customer_key="ck_2", occurred_at=at(3)),
        b.track_refund("re_4", "tx_4", 4_000, occurred_at=at(4)),
        b.session("evt_9", "cs_9", 3_000, payment_intent_id="pi_9", click_id="clk_2", occurred_at=at(8)),
        b.track_sale("s9", "pi_9", 3_000, occurred_at=at(8)),
        b.track_sale("s5", "tx_5", 700, occurred_at=at(5)),
        b.track_sale("s6", "tx_6", 800, click_id="clk_missing", occurred_at=at(6)),
        b.track_sale("s7", "tx_7", 900, test_mode=True, occurred_at=at(1)),
        b.track_sale("s1_again", "tx_1", 10_000, customer_key="ck_1", outcome="duplicate", occurred_at=at(1)),
        b.track_refund("re_x", "tx_unknown", 100, occurred_at=at(3)),
        b.track_sale("s8", "tx_8", 5_000, customer_key="ck_1", currency="eur", occurred_at=at(7)),
    ]


def run(rows: list[dict[str, Any]], now: datetime = NOW) -> Result:
    return reconcile(b.frame(rows), b.programs(), PARTNERS, now)


def only(frame: pl.DataFrame, **where: Any) -> dict[str, Any]:
    rows = frame.filter(*(pl.col(k) == v for k, v in where.items()))
    assert rows.height == 1, f"{where}: {rows.height} rows"
    return rows.row(0, named=True)
