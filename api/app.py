"""The Starlette application: routes by audience, the error map, and the lifespan that owns the
store, the single writer and the reconcile schedule."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from api.errors import EXCEPTION_HANDLERS
from api.failsafe import FailsafeMiddleware
from api.hotpath import TallyApp
from api.http import RequestIdMiddleware
from api.jobs import Reconciler
from api.observability import ObserveMiddleware, Observer, engine_version
from api.outbound.derive import Deriver
from api.outbound.worker import Deliverer
from api.ratelimit import RateLimiter
from api.routes import (
    accounts,
    agent,
    backfill,
    dashboard,
    dashboard_payouts,
    dashboard_sales,
    dashboard_webhooks,
    demo,
    docs,
    operator,
    partners,
    payouts,
    portal,
    reference,
    reports,
    script,
    track,
    webhook_endpoints,
    webhooks,
)
from api.routes import backup as backup_routes
from api.routes import metrics as metrics_routes
from api.serving import one_line
from api.settings import Settings
from api.state import State
from ingest.storage.factory import is_shared, open_store
from ingest.writer import Writer

log = logging.getLogger("tally")


def create_app(settings: Settings, *, observe: bool = True) -> Starlette:
    """The app; `observe=False` leaves out access lines and metrics (the bench's baseline only)."""
    observer: Observer | None = None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            store = open_store(
                settings.database,
                key_cache_mb=settings.key_cache_mb,
                memory_mb=settings.database_memory_mb,
                engine_dir=settings.engine_dir or None,
                credential_cache=settings.credential_cache,
                partitions=settings.reconcile_partitions,
            )
        except Exception as exc:  # `tally serve` reports this one line and exits (api.serving)
            app.state.startup_failure = f"cannot open the database {settings.database_name}: {one_line(exc)}"
            raise
        writer = Writer(store)
        if observer is not None:
            writer.on_commit = observer.commit
            backend = "postgresql" if is_shared(settings.database) else "duckdb"
            observer.started(backend, engine_version(store))
        writer.start()
        limiter = RateLimiter(settings.public_rate_per_second, settings.public_rate_burst)
        refusals = RateLimiter(
            settings.refusal_rate_per_second, settings.refusal_rate_burst, "refused requests"
        )
        reconciler = Reconciler(store, writer, settings.reconcile_interval_seconds, observer)
        app.state.tally = State(settings, store, writer, limiter, reconciler, refusals)
        deliverer = Deliverer(store, settings.webhooks_allow_private, own_process=True)
        deriver = Deriver(store, on_new=deliverer.wake)
        deliverer.every_so_often = deriver.rotations
        reconciler.after_run = deriver.after_run
        app.state.webhooks = deliverer
        if settings.webhooks_delivery:
            deliverer.start()
        reconciler.start()
        log.info("database %s open, accepting writes", settings.database_name)
        try:
            yield
        finally:
            reconciler.stop()
            deliverer.stop()
            writer.stop()
            store.close()
            log.info("stopped: database %s closed", settings.database_name)

    routes = [*docs.routes, *track.routes, *accounts.routes, *operator.routes, *agent.routes, *reports.routes]
    routes += [*webhooks.routes, *script.routes, *demo.routes, *backfill.routes, *payouts.routes]
    routes += webhook_endpoints.routes
    routes += [*partners.routes, *portal.routes]
    routes += [
        *dashboard.routes,
        *dashboard_sales.routes,
        *dashboard_payouts.routes,
        *dashboard_webhooks.routes,
    ]
    routes += reference.routes
    routes += backup_routes.routes
    routes += metrics_routes.routes
    middleware = [Middleware(RequestIdMiddleware), Middleware(FailsafeMiddleware)]
    if observe:  # outermost: it sees every answer, the failsafe's 500s included
        observer = Observer(lambda: getattr(app.state, "tally", None))
        middleware.insert(0, Middleware(ObserveMiddleware, observer=observer))
    app = TallyApp(
        hot={**track.HOT, **webhooks.HOT},
        observer=observer,
        routes=routes,
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    return app
