"""A brand's server using the Tally SDK (example; the payment processor side is faked).

- `POST /signup` reports a server-mode lead with the visitor's `svc_click_id` cookie.
- `POST /checkout/payment` and `POST /checkout/subscription` return the checkout-session
  parameters the brand would send to Stripe (`stripe.checkout.Session.create(**params)`):
  attribution metadata on the session, and for subscriptions also in
  `subscription_data.metadata`, or renewals cannot be attributed.
- `POST /stripe/webhook` hands `invoice.paid` events to the renewal helper (self-hosted
  tracking; do not combine with Tally's connect webhook). A real handler verifies the
  `Stripe-Signature` first (`stripe.Webhook.construct_event`); this fake skips it.

The signed-in user is faked by the `X-User-Id` header. Run: `python sdk/examples/brand_server.py`
with `SERVICE_API_KEY`, `TALLY_BASE_URL` and `TALLY_PROGRAM_ID` set.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tally_sdk.client import AsyncTally
from tally_sdk.renewals import handle_invoice_paid_async

CLICK_COOKIE = "svc_click_id"
CheckoutMode = Literal["payment", "subscription"]


def checkout_session_params(
    mode: CheckoutMode,
    *,
    price_id: str,
    customer_key: str,
    program_id: str,
    click_id: str | None,
    success_url: str,
    cancel_url: str,
    quantity: int = 1,
) -> dict[str, Any]:
    """Stripe checkout-session parameters carrying Tally's attribution metadata (SEED 2.3)."""
    metadata = {"svc_customer_key": customer_key, "program_id": program_id}
    if click_id:  # from the cookie; Stripe treats an empty value as "unset", so omit it
        metadata["svc_click_id"] = click_id
    params: dict[str, Any] = {
        "mode": mode,
        "line_items": [{"price": price_id, "quantity": quantity}],
        "success_url": success_url,
        "cancel_url": cancel_url,
        "client_reference_id": customer_key,
        "metadata": dict(metadata),
    }
    if mode == "subscription":
        params["subscription_data"] = {"metadata": dict(metadata)}
    return params


def create_app(
    tally: AsyncTally,
    *,
    program_id: str,
    prices: dict[str, str] | None = None,
    site_url: str = "http://localhost:3000",
) -> Starlette:
    """The brand server's app, tracking through `tally`."""
    price_ids = prices or {"payment": "price_one_time", "subscription": "price_monthly"}

    async def signup(request: Request) -> JSONResponse:
        user_id = request.headers.get("x-user-id")
        if not user_id:
            return JSONResponse({"error": "sign in first"}, status_code=401)
        body = await _json_body(request)
        email = body.get("email") if isinstance(body.get("email"), str) else None
        result = await tally.track_lead(
            customer_external_id=user_id, email=email, click_id=request.cookies.get(CLICK_COOKIE)
        )
        return JSONResponse({"lead": dict(result.data)})

    async def checkout(request: Request) -> JSONResponse:
        mode = request.path_params["mode"]
        user_id = request.headers.get("x-user-id")
        if mode not in ("payment", "subscription"):
            return JSONResponse({"error": f"unknown checkout mode {mode!r}"}, status_code=404)
        if not user_id:
            return JSONResponse({"error": "sign in first"}, status_code=401)
        params = checkout_session_params(
            mode,
            price_id=price_ids[mode],
            customer_key=user_id,
            program_id=program_id,
            click_id=request.cookies.get(CLICK_COOKIE),
            success_url=f"{site_url}/thanks?session_id={{CHECKOUT_SESSION_ID}}",
            cancel_url=f"{site_url}/pricing",
        )
        return JSONResponse({"processor": "stripe (faked)", "session_params": params})

    async def stripe_webhook(request: Request) -> JSONResponse:
        event = await _json_body(request)
        if event.get("type") != "invoice.paid":
            return JSONResponse({"received": True, "action": "ignored"})
        decision = await handle_invoice_paid_async(event, tally)
        outcome = {"action": decision.action, "code": decision.code, "reason": decision.reason}
        return JSONResponse({"received": True, **outcome})

    routes = [
        Route("/signup", signup, methods=["POST"]),
        Route("/checkout/{mode}", checkout, methods=["POST"]),
        Route("/stripe/webhook", stripe_webhook, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await tally.aclose()

    return Starlette(routes=routes, lifespan=lifespan)


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def main() -> None:  # pragma: no cover - manual run
    """Serve the example on port 3000 against the Tally instance in the environment."""
    import uvicorn

    app = create_app(AsyncTally(), program_id=os.environ["TALLY_PROGRAM_ID"])
    uvicorn.run(app, host="127.0.0.1", port=3000)


if __name__ == "__main__":  # pragma: no cover
    main()
