"""When a delivery is tried again, when it has failed, when an endpoint is disabled.

- An attempt succeeds when the endpoint answers 2xx within `TIMEOUT` (10 s, the whole exchange:
  connecting, sending, the answer's headers and the first 4 KiB of its body).
- After the n-th failed attempt the next one waits `min(BASE * 2**(n-1), CAP)`, each wait
  drawn at random between 80 % and 120 % of that (jitter, so that many deliveries failing at
  once do not all come back at once): about 30 s, 1 min, 2 min, 4 min, 8 min, 16 min, 32 min,
  1 h 4 min, 2 h 8 min, 4 h 16 min, then every 6 h, until `RETRY_WINDOW` (3 days) after the
  first attempt; an attempt that would come later is not made, and the delivery is `failed`.
  That is about 20 attempts in all.
- An endpoint whose attempts have all failed for `DISABLE_AFTER` (5 days, counted from the
  first failure after its last success) is disabled, with the reason; enabling it again (PATCH
  `enabled`) clears that.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

TIMEOUT_SECONDS = 10.0
BASE = timedelta(seconds=30)
CAP = timedelta(hours=6)
JITTER = 0.2
RETRY_WINDOW = timedelta(days=3)
DISABLE_AFTER = timedelta(days=5)
BODY_KEPT = 4096  # bytes of an answer's body kept in the delivery log


def backoff(failed_attempts: int, rng: random.Random) -> timedelta:
    """How long to wait after the `failed_attempts`-th failed attempt (1, 2, ...)."""
    exponent = max(0, failed_attempts - 1)
    wait = CAP if exponent >= 20 else min(BASE * 2**exponent, CAP)
    return wait * rng.uniform(1 - JITTER, 1 + JITTER)


def next_attempt(
    first_attempt_at: datetime, failed_attempts: int, now: datetime, rng: random.Random
) -> datetime | None:
    """When to try again after a failed attempt, or None when that would be past the retry
    window (the delivery has then failed)."""
    at = now + backoff(failed_attempts, rng)
    return at if at <= first_attempt_at + RETRY_WINDOW else None


def schedule_table() -> list[tuple[int, timedelta]]:
    """(attempt, nominal wait before it) for every retry in the window, without jitter: what
    the docs show."""
    rows: list[tuple[int, timedelta]] = []
    elapsed = timedelta(0)
    n = 1
    while True:
        exponent = n - 1
        wait = CAP if exponent >= 20 else min(BASE * 2**exponent, CAP)
        if elapsed + wait > RETRY_WINDOW:
            return rows
        elapsed += wait
        rows.append((n + 1, wait))
        n += 1
