"""Reports: finance, double-counting and payout reports, built as frames from the materialised
`rc_*` tables (load.py, reads.py, finance.py, double_counting.py, payouts.py) and rendered as
JSON, CSV, xlsx or standalone HTML (render.py, xlsx.py, html.py, charts.py). Reads go through the
storage contract's `Reader`; books as of a closed month through reconcile/run/engine.py `books`.
"""
