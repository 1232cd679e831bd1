"""Reconciliation: the append-only raw log in, the numbers finance pays from out.

Public API
----------
- `reconcile.pipeline.reconcile(raw, programs, partners, now) -> Result`: pure (no I/O, no
  clock). `Result` holds frames: `sales`, `commissions`, `refunds`, `double_counts`, `evidence`,
  `unroutable`, plus `explain` (the ladder step by step, rendered from `evidence` and `sales`) and
  `sorted()` (canonical row order). Output schemas: reconcile/schema.py.
- `reconcile.job.run(con, now, on_progress=None, *, full=False) -> RunSummary`: reads
  `raw_events` (a full run through its Parquet column mirror, reconcile/mirror.py) and the
  control plane from a DuckDB connection, reconciles program chunk by program chunk, and
  replaces the `rc_*` tables in one transaction, recording the run in `rc_runs`; when the
  previous run can be built on, only what the new rows change is recomputed and patched in
  (reconcile/incremental.py, reconcile/closure.py; `RunSummary.mode`).
- `reconcile.explain.steps(evidence, sales)`: the explain steps of some sales (the `rc_explain`
  view renders the same from `rc_evidence` and `rc_sales`).

The rules, one module each: normalise (one sale per transaction), doubles (connect vs
self-hosted), fixes (metadata fixes applied by backfills), leads + attribution (the ladder),
commissions (eligibility, amounts, status), refunds (pro-rata reversals), periods (closed
months and adjustments), explain. tests/reconcile/reference.py restates them in plain Python.
"""
