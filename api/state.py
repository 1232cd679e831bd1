"""What the app keeps for its lifetime: settings, the store, the writer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from api.jobs import Reconciler
from api.ratelimit import RateLimiter
from api.settings import Settings
from ingest.storage.contract import Store
from ingest.writer import Writer

T = TypeVar("T")


@dataclass
class State:
    settings: Settings
    store: Store
    writer: Writer
    limiter: RateLimiter
    reconciler: Reconciler
    refusals: RateLimiter  # per client: refusals of unverified calls (api/refusals.py)


async def read_tables(store: Store, read: Callable[..., T], *args: Any) -> T:
    """`read(reader, *args)` on a fresh `Reader` in a worker thread: reads of the
    materialised tables (sales, explain, commissions, reports, dashboard pages) never block the
    event loop, however large the month."""

    def run() -> T:
        with store.reader() as db:
            return read(db, *args)

    return await asyncio.to_thread(run)


async def read_store(read: Callable[..., T], *args: Any) -> T:
    """`read(*args)`, a blocking read of the store itself (a tracking-log page), in a worker
    thread: the event loop keeps serving while the database answers."""
    return await asyncio.to_thread(read, *args)
