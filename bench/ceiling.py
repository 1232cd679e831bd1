"""The ceilings tally's ingest is measured against, each on the same uvicorn as `tally serve`:

- `app`: the framework ceiling, a minimal Starlette endpoint that only parses the JSON body;
- `bare`: the interpreter's limit, a bare ASGI callable (no framework) that decodes and validates
  the same track/sale body with msgspec (the fields, bounds and unknown-field refusal of
  `ingest.domain.inputs.SaleIn`) and answers a small JSON envelope;
- `webhook`: the signed webhook's ceiling, a minimal Starlette endpoint that checks the
  `Stripe-Signature` (ingest.stripe.verify_signature, the bench's secret) and parses the body.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bench.harness import WEBHOOK_SECRET
from ingest.domain.errors import TallyError
from ingest.stripe import verify_signature


async def parse_only(request: Request) -> Response:
    body = json.loads(await request.body())
    return Response(json.dumps({"data": {"received": isinstance(body, dict)}}), media_type="application/json")


app = Starlette(routes=[Route("/api/v1/track/sale", parse_only, methods=["POST"])])


# -- the bare ASGI limit ---------------------------------------------------------------------------
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


class Sale(msgspec.Struct, forbid_unknown_fields=True):
    transaction_id: Id | None = None
    customer_external_id: Id | None = None
    amount: Annotated[int, msgspec.Meta(ge=1, le=10**12)] | None = None
    currency: Annotated[str, msgspec.Meta(pattern="^[A-Za-z]{3}$")] = "usd"
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=255)] | None = None
    click_id: Id | None = None


_DECODE = msgspec.json.Decoder(Sale).decode
_OK = b'{"data":{"received":true}}'
_BAD = b'{"error":{"code":"validation_error"}}'


def _head(status: int, body: bytes) -> dict[str, object]:
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    return {"type": "http.response.start", "status": status, "headers": headers}


async def bare(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        message = await receive()
        await send({"type": f"{message['type']}.complete"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    try:
        _DECODE(body)
        status, answer = 200, _OK
    except msgspec.DecodeError:  # (ValidationError is one)
        status, answer = 422, _BAD
    await send(_head(status, answer))
    await send({"type": "http.response.body", "body": answer})


# -- the signed webhook's ceiling -----------------------------------------------------------------
async def signed_parse_only(request: Request) -> Response:
    body = await request.body()
    try:
        verify_signature(
            body, request.headers.get("stripe-signature"), [WEBHOOK_SECRET], 300, datetime.now(UTC)
        )
    except TallyError:
        return Response(b'{"error":{"code":"invalid_signature"}}', 400, media_type="application/json")
    event = json.loads(body)
    answer = json.dumps({"data": {"received": isinstance(event, dict)}})
    return Response(answer, media_type="application/json")


webhook = Starlette(routes=[Route("/webhooks/stripe", signed_parse_only, methods=["POST"])])
