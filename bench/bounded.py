"""Run `python -m bench.reconcile <step> ...` of a tree (this one, or the baseline's export) with
DuckDB's memory bounded as the server bounds it (bench/reconcile.py `_memory_mb`).

The previous release's bench code may open its databases without a bound; every connection a
step opens without a `memory_limit` of its own gets `BENCH_RECONCILE_MEMORY_MB` here, so both
sides of a comparison run under the same bound. Usage (bench/reconcile.py `_child`):
`python bench/bounded.py <tree> <step> <args...>`."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

import duckdb

Connect = Callable[..., duckdb.DuckDBPyConnection]


def bound(limit: str, connect: Connect) -> Connect:
    """`connect` (duckdb.connect) that gives every connection opened without a `memory_limit`
    of its own the bound `limit` (e.g. "512MB")."""

    def bounded(database: Any = ":memory:", *rest: Any, **options: Any) -> duckdb.DuckDBPyConnection:
        config = dict(options.pop("config", None) or {})
        config.setdefault("memory_limit", limit)
        return connect(database, *rest, config=config, **options)

    return bounded


def main() -> None:
    tree, *args = sys.argv[1:]
    duckdb.connect = bound(f"{int(os.environ['BENCH_RECONCILE_MEMORY_MB'])}MB", duckdb.connect)  # type: ignore[assignment]
    sys.path[0] = tree  # instead of this script's folder, whose modules would shadow the tree's
    sys.argv = ["bench.reconcile", *args]
    runpy.run_module("bench.reconcile", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
