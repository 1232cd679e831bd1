"""One reconcile run in a process of its own, for the crash tests (tests/test_crash_reconcile.py):

    python -m tests.reconcile_process DATABASE ENGINE_DIR NOW [full] [part=N/PARTS] [MODULE.NAME=INTEGER ...]

opens the store as `tally serve` does (an embedded DuckDB file, or a PostgreSQL URL whose working
copy lives in ENGINE_DIR), runs `reconcile.run.run(store, NOW)` (a full run with `full`), and
prints the run's summary as one JSON line (`part=N/PARTS`: a run of partition N, from 0, of
PARTS, ingest/storage/partitions.py). Each MODULE.NAME=INTEGER sets a module constant first
(sizes of chunks, mirror segments and pull windows, so that a small log takes several). With
`TALLY_TEST_PAUSE_AT` set (ingest/pause.py) the run stops at that point for the test to kill it.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from datetime import datetime

import reconcile.run
from ingest.storage.factory import open_store
from ingest.storage.partitions import Scope


def main(argv: list[str]) -> None:
    database, engine_dir, now, *rest = argv
    scope, parts = None, 1
    for setting in rest:
        if setting.startswith("part="):
            part, parts = (int(n) for n in setting.removeprefix("part=").split("/"))
            scope = Scope(part, parts)
        elif "=" in setting:
            name, value = setting.split("=", 1)
            module, attribute = name.rsplit(".", 1)
            setattr(importlib.import_module(module), attribute, int(value))
    store = open_store(database, engine_dir=engine_dir, partitions=parts)
    try:
        summary = reconcile.run.run(store, datetime.fromisoformat(now), full="full" in rest, scope=scope)
    finally:
        store.close()
    print(json.dumps(dataclasses.asdict(summary)))


if __name__ == "__main__":
    main(sys.argv[1:])
