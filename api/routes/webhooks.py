"""Processor webhooks: `POST /webhooks/stripe` (the connect webhook, CONTRACT section 5)."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api import refusals, schemas
from api.auth import state
from api.http import Answer, answer, header, header_names, kept_headers, read_body, request_id
from api.openapi import STRIPE_SIGNATURE, Doc, document
from ingest import deliveries
from ingest.domain.clock import utcnow
from ingest.domain.errors import RateLimited, TallyError

KEPT_HEADERS = frozenset({b"stripe-signature", b"content-type", b"user-agent"})


async def stripe(request: Request) -> Answer:
    received_at = utcnow()
    try:
        body = await read_body(request)
    except TallyError as exc:  # too large, too slow: refused, and counted (api/refusals.py)
        refusals.check(request, exc)
        raise
    st = state(request)
    delivery = deliveries.Delivery(
        body=body,
        signature=header(request, b"stripe-signature"),
        headers=kept_headers(request, KEPT_HEADERS),
        received_at=received_at,
        request_id=request_id(request),
        content_type=header(request, b"content-type"),
        header_names=header_names(request),
    )
    verifier = deliveries.Verifier(st.settings.webhook_secrets(), st.settings.stripe_tolerance_seconds)
    refused = partial(refusals.check, request)  # a bad signature over the refusal rate: 429
    return answer(request, await deliveries.receive(st.store, st.writer, verifier, delivery, refused))


async def stripe_webhook(request: Request) -> Response:
    return (await stripe(request)).response()


# Served by api.hotpath.TallyApp ahead of the middleware stack (the route below answers the same).
HOT = {("POST", "/webhooks/stripe"): stripe}

routes = [Route("/webhooks/stripe", stripe_webhook, methods=["POST"])]

document(
    {
        stripe_webhook: Doc(
            "Receive a Stripe connect webhook delivery",
            "webhooks",
            description="Verified deliveries are appended to the raw log verbatim before the answer; a "
            "repeated event id is answered `duplicate: true`. A signed delivery whose amounts or times are "
            "out of bounds is stored as unusable and answered 422 `validation_error` with `stored: true`. "
            "A client refused more often than `TALLY_REFUSAL_RATE_PER_SECOND` gets 429 `rate_limited`.",
            auth=(STRIPE_SIGNATURE,),
            body_schema={
                "type": "object",
                "description": "A Stripe event, read tolerantly (unknown fields ignored, raw body kept)",
                "required": ["id", "type"],
                "properties": {
                    "id": {"type": "string"},
                    "type": {"type": "string"},
                    "account": {"type": "string"},
                    "livemode": {"type": "boolean"},
                    "created": {"type": "integer"},
                    "data": {"type": "object"},
                },
            },
            example={
                "id": "evt_1",
                "type": "invoice.paid",
                "account": "acct_brand",
                "livemode": True,
                "created": 1763719200,
                "data": {"object": {"id": "in_1", "amount_paid": 4900, "currency": "usd"}},
            },
            data=schemas.Delivery,
            result={
                "received": True,
                "event_id": "evt_1",
                "program_id": "prog_3k9a",
                "duplicate": False,
                "test_mode": False,
            },
            errors=(RateLimited,),
            writes=True,
        )
    }
)
