"""bench/report: the finance report of a program month with 1M sales, json and xlsx, beside reading
the same rows raw (`SELECT * ... WHERE program_id = ? AND period = ?` into Arrow).

The rc_* tables are generated directly in a temporary DuckDB file (no reconcile run; `raw_events`
exists and is empty, so the month is open): 1M sales of the benched program in 2026-01 (3
currencies, 1,000 partners, 10 % unattributed, 1 % test sales), one commission line per
commissioned sale, 5 % refunded, a few thousand double counts, plus 250k rows of another month and
another program that the report must skip.

Measured (median of `BENCH_REPEAT` runs after a warm-up, each on a fresh cursor):
- raw read: the month's rc_sales rows, and rc_sales + rc_commissions rows, into Arrow;
- report: load + build (reports/load.py), then render json / xlsx / html (reports/render.py).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from bench.harness import save
from ingest.storage.duckdb.reader import DuckReader
from ingest.storage.schema import raw_events_ddl
from reports import load
from reports.render import render

PROGRAM = "prog_bench"
PERIOD = "2026-01"
SALES = int(os.environ.get("BENCH_REPORT_SALES", "1000000"))
OTHER = SALES // 4

SALES_SQL = """
CREATE OR REPLACE TABLE rc_sales AS
WITH base AS (
    SELECT
        i,
        CASE WHEN i < {sales} THEN '{program}' ELSE 'prog_other' END AS program_id,
        CASE WHEN i < {sales} OR i % 2 = 0 THEN '{period}' ELSE '2025-12' END AS period,
        CASE WHEN i % 20 = 0 THEN 'jpy' WHEN i % 7 = 0 THEN 'eur' ELSE 'usd' END AS currency,
        i % 100 = 0 AS test_mode,
        CASE WHEN i % 10 = 3 THEN NULL
             ELSE 'partner_' || lpad(((i * 7919) % 1000)::VARCHAR, 4, '0') END AS partner_code,
        (500 + (i * 104729) % 49500)::BIGINT AS amount,
        ((i * 31) % 400)::BIGINT AS tax
    FROM range({total}) t(i)
)
SELECT
    program_id, 'sale_' || i AS sale_id, 'tx_' || i AS transaction_id,
    CASE WHEN i % 10 = 1 THEN 'connect' ELSE 'self_hosted' END AS source,
    amount, amount + tax AS gross_amount, tax, currency, i % 3 = 0 AS is_recurring, test_mode,
    'ck_' || (i % 200000) AS customer_key, NULL::VARCHAR AS processor_customer_id,
    'buyer' || i || '@example.test' AS email, 'clk_' || i AS click_id, NULL::VARCHAR AS subscription_id,
    'in_' || i AS invoice_id, NULL::VARCHAR AS payment_intent_id, NULL::VARCHAR AS checkout_session_id,
    NULL::VARCHAR AS charge_id, 'body' AS metadata_source, partner_code,
    CASE WHEN partner_code IS NULL THEN NULL ELSE 'click' END AS attribution_rule,
    CASE WHEN partner_code IS NOT NULL THEN NULL
         WHEN i % 3 = 0 THEN 'click_not_found' ELSE 'no_attribution_data' END AS unattributed_reason,
    []::VARCHAR[] AS warnings,
    CASE WHEN partner_code IS NULL OR test_mode THEN 0 ELSE amount * 3 // 10 END AS commission,
    CASE WHEN partner_code IS NULL OR test_mode THEN 0 ELSE amount // 20 END AS platform_fee,
    CASE WHEN partner_code IS NULL OR test_mode THEN NULL
         WHEN i % 50 = 7 THEN 'reversed' WHEN i % 40 = 9 THEN 'held'
         WHEN i % 3 = 0 THEN 'pending' ELSE 'approved' END AS commission_status,
    CASE WHEN i % 20 = 5 THEN (amount + tax) // 2 ELSE 0 END AS refunded,
    TIMESTAMPTZ '2026-01-01 00:00:00+00' + to_seconds((i % 2678400)::BIGINT) AS occurred_at, period,
    ['raw_' || i] AS record_ids
FROM base
"""

COMMISSIONS_SQL = """
CREATE OR REPLACE TABLE rc_commissions AS
SELECT
    program_id, sale_id, transaction_id, partner_code, 'commission' AS kind, period, period AS sale_period,
    currency, amount * 3 // 10 AS amount, 0::BIGINT AS reversed, amount // 20 AS platform_fee,
    0::BIGINT AS platform_fee_reversed, refunded, commission_status AS status,
    commission_status = 'held' AS self_referral,
    occurred_at, occurred_at + INTERVAL 30 DAY AS available_at
FROM rc_sales WHERE partner_code IS NOT NULL AND NOT test_mode
UNION ALL
SELECT
    program_id, sale_id, transaction_id, partner_code, 'adjustment', '{period}', '2025-12', currency,
    -100, 100, -5, 5, 0, 'approved', false, occurred_at, occurred_at
FROM rc_sales WHERE period = '2025-12' AND partner_code IS NOT NULL AND sale_id LIKE '%00'
"""

REFUNDS_SQL = """
CREATE OR REPLACE TABLE rc_refunds AS
SELECT
    program_id, 're_' || sale_id AS refund_id, source, 'evt_' || sale_id AS event_id, transaction_id,
    NULL::VARCHAR AS charge_id, sale_id, transaction_id AS sale_transaction_id, refunded AS amount,
    refunded AS applied_amount, 'applied' AS outcome, 0::BIGINT AS commission_reversed,
    0::BIGINT AS platform_fee_reversed, currency, occurred_at, period
FROM rc_sales WHERE refunded > 0
"""

DOUBLES_SQL = """
CREATE OR REPLACE TABLE rc_double_counts AS
SELECT
    program_id, CASE WHEN i % 2 = 0 THEN 'connect_and_self_hosted' ELSE 'ingest_refused' END AS kind,
    transaction_id, sale_id, ['raw_' || i] AS connect_record_ids, 'dup_' || i AS duplicate_id,
    transaction_id AS duplicate_transaction_id, 'transaction_id' AS matched_on, amount, currency, occurred_at
FROM (SELECT *, row_number() OVER () AS i FROM rc_sales WHERE sale_id LIKE '%000')
"""


def generate(path: Path) -> dict[str, int]:
    con = duckdb.connect(str(path))
    try:
        con.execute("SET TimeZone = 'UTC'")
        # A real database always has the raw log: the report looks up the month's close in it
        # (empty here: the month is open).
        con.execute(raw_events_ddl())
        con.execute(SALES_SQL.format(sales=SALES, total=SALES + OTHER, program=PROGRAM, period=PERIOD))
        for sql in (COMMISSIONS_SQL, REFUNDS_SQL, DOUBLES_SQL):
            con.execute(sql.format(period=PERIOD))
        counts = {}
        for table in ("rc_sales", "rc_commissions", "rc_refunds", "rc_double_counts"):
            row = con.execute(f"SELECT count(*) FROM {table}").fetchall()
            counts[table] = int(row[0][0])
        con.execute("CHECKPOINT")
        return counts
    finally:
        con.close()


def timed(repeat: int, work: Callable[[], Any]) -> tuple[float, Any]:
    """Median seconds of `repeat` runs after one warm-up, and the last result."""
    result = work()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def main(repeat: int = int(os.environ.get("BENCH_REPEAT", "3"))) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="tally-bench-report-") as tmp:
        path = Path(tmp) / "report.duckdb"
        started = time.perf_counter()
        counts = generate(path)
        generated = time.perf_counter() - started
        con = duckdb.connect(str(path), read_only=True)
        try:
            params = [PROGRAM, PERIOD]

            def raw_sales() -> int:
                sql = "SELECT * FROM rc_sales WHERE program_id = ? AND period = ?"
                return int(con.cursor().sql(sql, params=params).to_arrow_table().num_rows)

            def raw_both() -> int:
                cur = con.cursor()
                rows = 0
                for table in ("rc_sales", "rc_commissions"):
                    sql = f"SELECT * FROM {table} WHERE program_id = ? AND period = ?"
                    rows += cur.sql(sql, params=params).to_arrow_table().num_rows
                return rows

            t_raw, sales_rows = timed(repeat, raw_sales)
            t_raw_both, both_rows = timed(repeat, raw_both)
            t_build, report = timed(
                repeat, lambda: load.finance(DuckReader(con.cursor()), PROGRAM, PERIOD, "Bench")
            )
            t_json, json_out = timed(repeat, lambda: render(report, "json"))
            t_xlsx, xlsx_out = timed(repeat, lambda: render(report, "xlsx"))
            t_html, html_out = timed(repeat, lambda: render(report, "html"))
        finally:
            con.close()
    assert report.reconciled, "the generated month must reconcile"
    rows = [
        ("raw read: rc_sales rows -> Arrow", t_raw, sales_rows, 0),
        ("raw read: sales + commission rows", t_raw_both, both_rows, 0),
        ("report: load + build", t_build, sales_rows, 0),
        ("report json (build + render)", t_build + t_json, sales_rows, len(json_out[0])),
        ("report xlsx (build + render)", t_build + t_xlsx, sales_rows, len(xlsx_out[0])),
        ("report html (build + render)", t_build + t_html, sales_rows, len(html_out[0])),
    ]
    print(f"generated {counts} in {generated:.1f} s")
    print(f"{'run':<38}{'seconds':>10}{'x raw sales':>13}{'rows':>10}{'bytes':>10}")
    for label, seconds, n, size in rows:
        print(f"{label:<38}{seconds:>10.3f}{seconds / t_raw:>13.2f}{n:>10}{size:>10}")
    result: dict[str, object] = {
        "sales": SALES,
        "repeat": repeat,
        "tables": counts,
        "generate_seconds": round(generated, 2),
        "currencies": list(report.currencies),
        "partners": report.by_partner.height,
        "runs": [
            {"label": label, "seconds": round(s, 4), "ratio_vs_raw_sales": round(s / t_raw, 2), "bytes": size}
            for label, s, _, size in rows
        ],
    }
    save("report", result)
    return result


if __name__ == "__main__":
    main()
