"""How long work reports how far it has got, for every caller that shows it (the CLI's bars, the
NDJSON progress lines of the API, the reconcile lease's renewals).
"""

from __future__ import annotations

from collections.abc import Callable

# (stage, done, total): a reconcile run's steps, a backup's tables.
Progress = Callable[[str, int, int], None]

# (done, total) rows of the raw log applied: the embedded key index catching up with the log
# (`tally migrate`, a store opening); its one stage goes without saying.
RowsApplied = Callable[[int, int], None]
