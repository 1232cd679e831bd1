"""Pause points: where the crash tests stop a process to SIGKILL it at an exact step.

The reconciler's runs, publishes and working-copy pulls call `pause(<point>)` at the steps a
crash must be survivable from (tests/test_crash_reconcile.py). Outside the tests it does
nothing: only when the environment variable `TALLY_TEST_PAUSE_AT` is `<point>:<file>` does the
process, on reaching that point, write its pid to `<file>` and wait there until it is killed.
Never set it on a server that should keep running.

Points: `reconcile.chunk` (a full run's first chunk written to its staging tables),
`reconcile.commit` (a run's final transaction, its results and record in place and, on a
replica of a shared database, published; not committed yet), `publish.commit` (a replica's
publishing transaction on PostgreSQL, its rows sent; not committed yet), `pull.window` (a
replica's working copy has taken a window of the log's rows; not committed yet),
`mirror.segment` (a full run has written a column-mirror segment; not registered yet),
`components.batch` (a run rebuilding the component store has written a batch to its own
tables; nothing in the store yet), `act.decided` / `act.appended` / `act.reconciled` (an
engineer action under the run lock — a payout batch, its payment or cancel, a failed row, a
finance action, a manual entry — decided and nothing appended; its row durable in the log and not
reconciled; reconciled, its caller not answered yet).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "TALLY_TEST_PAUSE_AT"
POINTS = (
    "reconcile.chunk",
    "reconcile.commit",
    "publish.commit",
    "pull.window",
    "mirror.segment",
    "components.batch",
    "act.decided",
    "act.appended",
    "act.reconciled",
)


def pausing(point: str) -> bool:
    """Whether `pause(point)` would wait (see the module docstring)."""
    name, _, marker = os.environ.get(PAUSE_ENV, "").partition(":")
    return name == point and bool(marker)


def pause(point: str) -> None:
    """Wait here for ever when `TALLY_TEST_PAUSE_AT` names `point` (see the module docstring)."""
    if not pausing(point):
        return
    marker = Path(os.environ[PAUSE_ENV].partition(":")[2])
    written = marker.with_name(f"{marker.name}.{os.getpid()}")
    written.write_text(str(os.getpid()))
    written.rename(marker)  # whole: the test reads it as soon as it appears
    while True:  # until the test's SIGKILL
        time.sleep(1)
