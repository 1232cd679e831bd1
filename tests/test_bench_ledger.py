"""bench/ledger on a small generated log: the finance checks of every program month hold, and the
payout batches agree with their lines (the bench itself runs 100k events and more)."""

from __future__ import annotations

from bench import ledger


def test_the_finance_checks_and_payouts_hold_on_a_generated_log() -> None:
    result = ledger.run(6_000, closes=1)
    assert result["finance_checks_failed"] == [] and result["payout_checks_failed"] == []
    assert result["program_months_checked"] > 100 and result["finance_checks_evaluated"] > 1_000
    assert result["payout_batches"] == 20 * 12 and result["lines_in_batches"] > 0
    assert result["lines_by_kind"].get("clawback", 0) > 0
