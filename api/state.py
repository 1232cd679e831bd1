"""What the app keeps for its lifetime: settings, the store, the writer."""

from __future__ import annotations

from dataclasses import dataclass

from api.jobs import Reconciler
from api.ratelimit import RateLimiter
from api.settings import Settings
from ingest.duckdb_store import DuckStore
from ingest.writer import Writer


@dataclass
class State:
    settings: Settings
    store: DuckStore
    writer: Writer
    limiter: RateLimiter
    reconciler: Reconciler
