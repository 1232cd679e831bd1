"""Credential values: generation, hashing (only hashes are stored) and masking."""

from __future__ import annotations

import hashlib
import random
import secrets
import string

PROGRAM_KEY_PREFIX = "aff_"
AGENT_KEY_PREFIX = "agt_"
ACCOUNT_TOKEN_PREFIX = "acct_"  # noqa: S105 (a prefix, not a secret)

_BASE62 = string.digits + string.ascii_letters
_MASK = "••••••••"


def random_base62(length: int) -> str:
    """`length` uniformly random base62 characters from the OS CSPRNG. Drawing 8 bits per
    character and reducing the whole number keeps the bias below 2**-(2 * length)."""
    number = int.from_bytes(secrets.token_bytes(length), "big")
    chars = []
    for _ in range(length):
        number, digit = divmod(number, 62)
        chars.append(_BASE62[digit])
    return "".join(chars)


def new_token(prefix: str, length: int = 40) -> str:
    return prefix + random_base62(length)


_fast = random.Random(secrets.randbits(128))  # noqa: S311 - identifiers, not secrets


def new_id(prefix: str) -> str:
    """An opaque identifier such as `prog_...`, `clk_...`: unique (96 random bits), not a secret,
    so it comes from a fast generator seeded once from the OS; credentials never do."""
    return f"{prefix}_{_fast.getrandbits(96):024x}"


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
