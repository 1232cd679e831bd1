"""The Starlette application: routes by audience, the error map, and the lifespan that owns the
store, the single writer and the reconcile schedule."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from api.errors import EXCEPTION_HANDLERS
from api.http import RequestIdMiddleware
from api.ratelimit import RateLimiter
from api.routes import accounts, agent, docs, operator, script, track, webhooks
from api.settings import Settings
from api.state import State
from ingest.duckdb_store import DuckStore
from ingest.writer import Writer

log = logging.getLogger("tally")


def create_app(settings: Settings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = DuckStore(settings.database)
        writer = Writer(store)
        writer.start()
        limiter = RateLimiter(settings.public_rate_per_second, settings.public_rate_burst)
        app.state.tally = State(settings, store, writer, limiter)
        log.info("tally: database %s open, accepting writes", settings.database)
        try:
            yield
        finally:
            writer.stop()
            store.close()

    routes = [*docs.routes, *track.routes, *accounts.routes, *operator.routes, *agent.routes]
    routes += [*webhooks.routes, *script.routes]
    return Starlette(
        routes=routes,
        middleware=[Middleware(RequestIdMiddleware)],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
