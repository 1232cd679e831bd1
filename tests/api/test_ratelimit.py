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


def test_zero_rate_disables() -> None:
    limiter = RateLimiter(rate=0, burst=1)
    for _ in range(100):
        limiter.check("a", now=0.0)
