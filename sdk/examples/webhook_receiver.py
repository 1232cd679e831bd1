"""A brand's server receiving tally's webhooks: the standard library and `tally_sdk.webhooks`.

Run it with the endpoint's signing secret (printed once by `tally webhooks create`), then point
an endpoint at it (`http://` and a local address need `TALLY_WEBHOOKS_ALLOW_PRIVATE=1` on the
tally server; in production use an `https://` URL):

    TALLY_WEBHOOK_SECRET=whsec_... python sdk/examples/webhook_receiver.py 8787
    tally webhooks create --program prog_... --url http://127.0.0.1:8787/tally --event sale.created

It checks each delivery's signature, skips an event it has handled already (a retry has the same
`webhook-id`), handles the event and answers 204 at once: tally retries anything but a 2xx within
10 seconds, so do slow work after answering (a queue), never before.
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tally_sdk.webhooks import WebhookVerificationError, verify

SECRETS = [s for s in os.environ.get("TALLY_WEBHOOK_SECRET", "").split(",") if s]  # new,old while rotating
handled: set[str] = set()  # use your database in production: event ids survive a restart there


def handle(event: dict[str, Any]) -> None:
    data = event["data"]
    if event["type"] == "sale.created":
        print(f"sale {data['transaction_id']}: {data['amount']} {data['currency']} by {data['partner_code']}")
    elif event["type"] == "commission.approved":
        print(f"commission approved: {data['amount']} {data['currency']} for {data['partner_code']}")
    else:
        print(f"{event['type']}: {event['id']}")


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            event = verify(body, dict(self.headers.items()), SECRETS)
        except WebhookVerificationError as exc:
            self.send_error(400, str(exc))
            return
        if event["id"] not in handled:
            handle(event)
            handled.add(event["id"])
        self.send_response(204)
        self.end_headers()


def main() -> None:
    if not SECRETS:
        sys.exit("set TALLY_WEBHOOK_SECRET to the endpoint's signing secret (whsec_...)")
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8787
    ThreadingHTTPServer(("127.0.0.1", port), Receiver).serve_forever()


if __name__ == "__main__":
    main()
