from __future__ import annotations

import pytest

from api.ratelimit import RateLimiter
from ingest.domain.errors import RateLimited


def test_bucket_refills_at_rate() -> None:
    limiter = RateLimiter(rate=2.0, burst=2)
    limiter.check("a", now=0.0)
    limiter.check("a", now=0.0)
    with pytest.raises(RateLimited) as info:
        limiter.check("a", now=0.1)
    assert info.value.extra["retry_after"] == 1
    limiter.check("b", now=0.1)  # other clients have their own bucket
    limiter.check("a", now=0.6)  # 0.5 s at 2/s refilled one token


def _taken(limiter: RateLimiter, calls: int) -> int:
    """How many of `calls` checks of one client at the same instant the limiter lets through."""
    taken = 0
    for _ in range(calls):
        try:
            limiter.check("a", now=0.0)
        except RateLimited:
            continue
        taken += 1
    return taken


def test_zero_rate_disables() -> None:
    assert _taken(RateLimiter(rate=0, burst=1), 100) == 100
    assert _taken(RateLimiter(rate=0.001, burst=1), 100) == 1  # any positive rate limits
