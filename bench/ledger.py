"""bench/ledger: the ledger's self-checks on a generated log (issue #13). Every finance check of
every program month holds, and every payout batch pays what its lines net to.

The log (bench/rawgen.py, `BENCH_LEDGER_EVENTS` events, default 100,000) has every program make
a payout batch each month (on the 3rd, up to the previous month's end; marked paid on the 8th,
the last one left open) and the first `BENCH_LEDGER_CLOSES` programs (default 2) close every
month. It is written to a DuckDB file as the server would have logged it (before each batch, a
reconcile run at that time books what it shows approved: `replay`) and reconciled in full
(reconcile/run/job.py, as of rawgen.NOW); then, through the same reads the API uses:

- the finance report (reports/load.py) of every program and month with sales or lines: every
  check holds (paid + unpaid + clawbacks = commissions among them; a closed month is checked as
  of its close);
- per program, partner and currency, over all batches (reports/payouts.py): what the batches
  pay is never below zero, and paid + what is still owed = the lines the batches took, summed
  straight from rc_commissions;
- a paid batch's lines are `paid`, an open batch's are not, and a line no batch took is not.

Writes bench/out/ledger.json; exits non-zero when a check fails.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from bench import rawgen
from bench.harness import save
from ingest import actions
from ingest.storage.contract import Reader
from ingest.storage.duckdb.reader import DuckReader
from reconcile.run import job
from reports import load, payouts


def months(db: Reader) -> list[tuple[str, str]]:
    """Every (program, month) with a sale or a ledger line."""
    rows = db.rows(
        "SELECT program_id, period FROM rc_sales UNION SELECT program_id, period FROM rc_commissions"
        " ORDER BY program_id, period"
    )
    return [(str(p), str(m)) for p, m in rows]


def finance_failures(db: Reader) -> tuple[int, int, list[dict[str, Any]]]:
    """(months checked, checks evaluated, failed checks) of every program month's report."""
    checked = evaluated = 0
    failed: list[dict[str, Any]] = []
    for program_id, period in months(db):
        report = load.finance(db, program_id, period)
        checked += 1
        evaluated += report.checks.height
        for row in report.checks.filter(~report.checks.get_column("ok")).iter_rows(named=True):
            failed.append({"program_id": program_id, "period": period, **row})
    return checked, evaluated, failed


def payout_failures(db: Reader) -> tuple[dict[str, int], list[str]]:
    """Counts of batches and lines, and what disagrees between the batches and their lines."""
    failed: list[str] = []
    programs = [str(p) for (p,) in db.rows("SELECT DISTINCT program_id FROM rc_payouts ORDER BY 1")]
    counted = {"batches": 0, "rows": 0}
    for program_id in programs:
        netted = payouts.netted(db, program_id)
        counted["batches"] += len(netted.batches)
        paid: dict[tuple[str, str], int] = {}
        for rows in netted.rows.values():
            for row in rows:
                counted["rows"] += 1
                key = (row["partner_code"], row["currency"])
                if row["amount"] < 0:
                    failed.append(f"{program_id} {key}: a payment below zero")
                paid[key] = paid.get(key, 0) + row["amount"]
        taken = db.rows(
            "SELECT partner_code, currency, SUM(amount) FROM rc_commissions"
            " WHERE program_id = ? AND payout_id IS NOT NULL GROUP BY partner_code, currency",
            [program_id],
        )
        for partner, currency, total in taken:
            key = (str(partner), str(currency))
            owed = netted.carried.get(key, 0)
            if paid.get(key, 0) + owed != int(total):
                failed.append(f"{program_id} {key}: paid {paid.get(key, 0)} + owed {owed} != lines {total}")
    wrong = db.one(
        "SELECT COUNT(*) FROM rc_commissions c LEFT JOIN rc_payouts p"
        " ON p.program_id = c.program_id AND p.payout_id = c.payout_id"
        " WHERE (p.status = 'paid' AND c.status <> 'paid') OR (c.status = 'paid' AND p.status IS NULL)"
        " OR (p.status = 'open' AND c.status = 'paid')"
    )
    if wrong and int(wrong[0]):
        failed.append(f"{wrong[0]} line(s) whose status disagrees with their batch")
    return counted, failed


def replay(con: duckdb.DuckDBPyConnection, events: pl.DataFrame) -> int:
    """Append `events` (in seq order) as the server would have logged them: before each payout
    batch, a reconcile run at that time books what it shows approved (api/jobs.py `_book`), so
    the batch takes those lines. The booking rows appended."""
    events = events.sort("seq")
    made = events.filter(pl.col("kind") == "payout_batch").get_column("received_at").unique().sort()
    written, offset = 0, 0
    for at in made.to_list():
        upto = events.slice(written).filter(pl.col("received_at") < at).height
        rawgen.append(con, events.slice(written, upto).with_columns(pl.col("seq") + offset))
        written += upto
        job.run(con, at)
        rows = actions.booking_rows(DuckReader(con.cursor()).dicts(actions.DUE_LINES_SQL), written + offset)
        if rows:
            ((high,),) = con.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchall()
            frame = pl.DataFrame(
                [
                    {**r, "seq": int(high) + 1 + i, "received_at": at, "occurred_at": at, "test_mode": False}
                    for i, r in enumerate(rows)
                ]
            )
            con.register("_booked", frame.to_arrow())
            con.execute("INSERT INTO raw_events BY NAME SELECT * FROM _booked")
            con.unregister("_booked")
            offset += len(rows)
    rawgen.append(con, events.slice(written).with_columns(pl.col("seq") + offset))
    return offset


def run(events: int, closes: int) -> dict[str, Any]:
    log = rawgen.generate(events, payouts=rawgen.PROGRAMS, period_closes=closes)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ledger.duckdb"
        rawgen.write_db(path, replace(log, events=log.events.head(0)))
        con = duckdb.connect(str(path))
        try:
            booked = replay(con, log.events)
            started = time.perf_counter()
            summary = job.run(con, rawgen.NOW)
            reconciled = time.perf_counter() - started
            db = DuckReader(con.cursor())
            kinds = dict(db.rows("SELECT kind, COUNT(*) FROM rc_commissions GROUP BY kind"))
            in_batches = db.one("SELECT COUNT(*) FROM rc_commissions WHERE payout_id IS NOT NULL")
            started = time.perf_counter()
            checked, evaluated, failed_checks = finance_failures(db)
            counted, failed_payouts = payout_failures(db)
            verified = time.perf_counter() - started
        finally:
            con.close()
    return {
        "events": log.events.height,
        "booking_rows": booked,
        "period_closes": closes,
        "reconcile_seconds": round(reconciled, 2),
        "verify_seconds": round(verified, 2),
        "sales": summary.sales,
        "commission_lines": summary.commissions,
        "lines_by_kind": {str(k): int(v) for k, v in kinds.items()},
        "lines_in_batches": int(in_batches[0]) if in_batches else 0,
        "payout_batches": counted["batches"],
        "payout_rows": counted["rows"],
        "program_months_checked": checked,
        "finance_checks_evaluated": evaluated,
        "finance_checks_failed": failed_checks,
        "payout_checks_failed": failed_payouts,
    }


def main() -> None:
    events = int(os.environ.get("BENCH_LEDGER_EVENTS", "100000"))
    closes = int(os.environ.get("BENCH_LEDGER_CLOSES", "2"))
    result = run(events, closes)
    path = save("ledger", result)
    failures = len(result["finance_checks_failed"]) + len(result["payout_checks_failed"])
    r = result
    print(
        f"bench/ledger: {r['events']} events, {r['sales']} sales, {r['commission_lines']} lines "
        f"({r['lines_by_kind']}), {r['payout_batches']} payout batches; "
        f"{r['finance_checks_evaluated']} finance checks over {r['program_months_checked']} program "
        f"months, {failures} failed; reconcile {r['reconcile_seconds']} s -> {path}"
    )
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
