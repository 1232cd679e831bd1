"""Verify tally's webhooks on your server (Standard Webhooks, https://www.standardwebhooks.com).

Each delivery is a `POST` of a JSON event, `{"id", "type", "timestamp", "program_id", "data"}`,
with three headers: `webhook-id` (the event's id: the same on every retry, so keep the ids you
have handled and skip a repeat), `webhook-timestamp` (unix seconds of this attempt) and
`webhook-signature` (`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, several separated by
spaces while a secret is being rotated: one matching is enough).

    from tally_sdk.webhooks import verify, WebhookVerificationError

    try:
        event = verify(raw_body, request_headers, os.environ["TALLY_WEBHOOK_SECRET"])
    except WebhookVerificationError:
        return 400
    if event["type"] == "commission.approved": ...

Pass the body exactly as received (bytes), before any JSON parsing. During a rotation you may
pass both secrets (`[new, old]`). Answer 2xx within 10 seconds; anything else is retried.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
TOLERANCE_SECONDS = 300  # a delivery signed more than this long ago (or ahead) is refused

__all__ = ["TOLERANCE_SECONDS", "WebhookVerificationError", "sign", "verify"]


class WebhookVerificationError(ValueError):
    """Raised by `verify` when a delivery is not tally's: a header missing or malformed, a
    timestamp out of tolerance, or no signature matching the secret."""


def _key(secret: str) -> bytes:
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookVerificationError(
            "the secret is not a whsec_ secret (base64 after the prefix)"
        ) from None
    if not key:
        raise WebhookVerificationError("the secret is empty")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `v1,<base64>` signature `secret` gives a delivery (what tally sends)."""
    digest = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str | Sequence[str],
    *,
    tolerance: int = TOLERANCE_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """The event, once the delivery's signature checks out with `secret` (or one of several
    secrets) and its timestamp is within `tolerance` seconds of `now` (default: this machine's
    clock); `WebhookVerificationError` otherwise. `headers` may be any mapping (names are
    matched case-insensitively)."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    found = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = (
        found.get(n) for n in ("webhook-id", "webhook-timestamp", "webhook-signature")
    )
    if not (msg_id and stamp and signatures):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not unix seconds") from None
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too far from now (a replay, or a clock off)")
    secrets = [secret] if isinstance(secret, str) else list(secret)
    expected = [sign(s, msg_id, timestamp, raw).encode() for s in secrets]
    for candidate in signatures.split(" "):
        if any(hmac.compare_digest(candidate.encode(), e) for e in expected):
            event: dict[str, Any] = json.loads(raw)
            return event
    raise WebhookVerificationError("no signature matches the secret")
