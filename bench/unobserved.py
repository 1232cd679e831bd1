"""`tally serve` built without access lines and request/commit/reconcile metrics
(`create_app(observe=False)`): the baseline bench/ingest's observability run compares against.
Not a product setting; run as `python -m bench.unobserved serve ...` (same arguments)."""

from __future__ import annotations

import functools
import sys

from api import app, cli

app.create_app = functools.partial(app.create_app, observe=False)  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
