"""Fixtures of the ingest tests: a store on a real DuckDB file with its writer running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.storage.duckdb.store import DuckStore
from ingest.writer import Writer


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[DuckStore, Writer]]:
    store = DuckStore(tmp_path / "w.duckdb")
    w = Writer(store)
    w.start()
    yield store, w
    w.stop()
    store.close()
