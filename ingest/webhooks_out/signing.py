"""Standard Webhooks signatures (https://www.standardwebhooks.com): what a brand's server checks.

A secret is `whsec_` + the base64 of 32 random bytes; the HMAC key is those bytes. A delivery
carries `webhook-id` (the event id, the same on every attempt), `webhook-timestamp` (unix
seconds of the attempt) and `webhook-signature`: `v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">`, one per secret that signs, separated by spaces (during a rotation
the new secret and the previous one both sign for 24 hours).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from datetime import timedelta

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
SECRET_BYTES = 32
ROTATION_OVERLAP = timedelta(hours=24)  # the previous secret signs beside the new one this long
_MASK = "••••••••"


def new_secret() -> str:
    """A new signing secret, from the OS CSPRNG."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def key_of(secret: str) -> bytes:
    """The HMAC key a `whsec_` secret stands for."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">`."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(msg_id: str, timestamp: int, body: bytes, signing: Sequence[str]) -> dict[str, str]:
    """The three Standard Webhooks headers, signed by every secret in `signing`."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(secret, msg_id, timestamp, body) for secret in signing),
    }


def mask(secret: str) -> str:
    """`whsec_••••••••` + the last 4 characters: what reads show of a secret."""
    return f"{SECRET_PREFIX}{_MASK}{secret[-4:]}"
