"""`GET /metrics`: Prometheus text exposition of this app's registry (api.observability).
Operator token required, unless `TALLY_METRICS_PUBLIC=1`."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import require_operator, state
from api.openapi import OPERATOR_TOKEN, Doc, document


async def metrics(request: Request) -> Response:
    if not state(request).settings.metrics_public:
        require_operator(request)
    observer = request.app.observer
    if observer is None:  # an app built without observability (the bench's baseline)
        return Response(b"", media_type=CONTENT_TYPE_PLAIN_0_0_4)
    return Response(generate_latest(observer.registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)


routes = [Route("/metrics", metrics, methods=["GET"])]

document(
    {
        metrics: Doc(
            "Prometheus metrics",
            "operations",
            description="Prometheus text exposition of this process's metrics (docs/observability.md "
            "lists every name). Operator token required, unless `TALLY_METRICS_PUBLIC=1`.",
            auth=(OPERATOR_TOKEN,),
            auth_optional=True,
            content={CONTENT_TYPE_PLAIN_0_0_4: {"schema": {"type": "string"}}},
        )
    }
)
