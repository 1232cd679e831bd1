"""Credential values: generation, hashing (only hashes are stored) and masking."""

from __future__ import annotations

import hashlib
import secrets
import string

PROGRAM_KEY_PREFIX = "aff_"
AGENT_KEY_PREFIX = "agt_"
ACCOUNT_TOKEN_PREFIX = "acct_"  # noqa: S105 (a prefix, not a secret)

_BASE62 = string.digits + string.ascii_letters
_MASK = "••••••••"


def random_base62(length: int) -> str:
    return "".join(secrets.choice(_BASE62) for _ in range(length))


def new_token(prefix: str, length: int = 40) -> str:
    return prefix + random_base62(length)


def new_id(prefix: str, length: int = 20) -> str:
    """An opaque identifier such as `prog_...`, `clk_...`; not a secret."""
    return f"{prefix}_{random_base62(length)}"


def token_hash(value: str) -> str:
    """SHA-256 of the whole credential. Credentials are high-entropy random values, so a fast
    hash is enough to make the stored form useless to a reader of the database."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def mask(value: str) -> str:
    """`aff_••••••••3f9a`: the known prefix kept, bullets, then the last 4 characters."""
    prefix = ""
    for known in (PROGRAM_KEY_PREFIX, AGENT_KEY_PREFIX, ACCOUNT_TOKEN_PREFIX):
        if value.startswith(known):
            prefix = known
            break
    return f"{prefix}{_MASK}{value[-4:]}"
