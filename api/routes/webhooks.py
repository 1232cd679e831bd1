"""Processor webhooks: `POST /webhooks/stripe` (the connect webhook, CONTRACT section 5)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.auth import state
from api.http import header, kept_headers, ok, read_body, request_id
from ingest import deliveries
from ingest.clock import utcnow

KEPT_HEADERS = frozenset({b"stripe-signature", b"content-type", b"user-agent"})


async def stripe_webhook(request: Request) -> Response:
    received_at = utcnow()
    body = await read_body(request)
    st = state(request)
    delivery = deliveries.Delivery(
        body=body,
        signature=header(request, b"stripe-signature"),
        headers=kept_headers(request, KEPT_HEADERS),
        received_at=received_at,
        request_id=request_id(request),
    )
    verifier = deliveries.Verifier(st.settings.webhook_secrets(), st.settings.stripe_tolerance_seconds)
    return ok(request, await deliveries.receive(st.store, st.writer, verifier, delivery))


# Served by api.hotpath.TallyApp ahead of the middleware stack (the route below answers the same).
HOT = {("POST", "/webhooks/stripe"): stripe_webhook}

routes = [Route("/webhooks/stripe", stripe_webhook, methods=["POST"])]
