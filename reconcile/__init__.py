"""Reconciliation: the append-only raw log in, the numbers finance pays from out.

Public API
----------
- `reconcile.pipeline.reconcile(raw, programs, partners, now) -> Result`: pure (no I/O, no
  clock). `Result` holds frames: `sales`, `commissions`, `refunds`, `double_counts`, `evidence`,
  `unroutable`, plus `explain` (the ladder step by step, rendered from `evidence` and `sales`) and
  `sorted()` (canonical row order). Output schemas: reconcile/schema.py.
- `reconcile.run.run(store, now, on_progress=None, *, full=False, scope=None) -> RunSummary`:
  one run (of one reconcile partition's programs with `scope`) on the store's engine
  (reconcile/run/engine.py: the embedded database itself, or a replica's
  working copy of the shared log, publishing to it). reconcile/run/job.py reads `raw_events`
  (a full run through its Parquet column mirror, reconcile/run/mirror.py) and the control plane,
  reconciles program chunk by program chunk, and replaces the `rc_*` tables in one transaction,
  recording the run in `rc_runs`; when the previous run can be built on, only what the new rows
  change is recomputed and patched in (reconcile/run/incremental.py, reconcile/run/closure.py,
  reconcile/run/components.py; `RunSummary.mode`).
- `reconcile.explain.steps(evidence, sales)`: the explain steps of some sales (the `rc_explain`
  view renders the same from `rc_evidence` and `rc_sales`).

The rules, one module each, pure: normalise (one sale per transaction), doubles (connect vs
self-hosted), fixes (metadata fixes applied by backfills), leads + attribution (the ladder),
commissions (eligibility, amounts, status), refunds (pro-rata reversals), periods (closed
months and adjustments), explain, customers, terms, bookings, ledger, payouts, unroutable, backfill.
tests/reconcile/reference.py restates them in plain Python. reconcile/run/ is the I/O around them.
"""
