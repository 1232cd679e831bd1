"""A per-client token bucket: for the public (credential-less) endpoints, and for refusals of
unverified calls (api/refusals.py). Kept in each process: it decides nothing about money, only
how often one address is answered, so several replicas each allowing the rate is safe (README)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ingest.domain.errors import RateLimited


@dataclass
class RateLimiter:
    """`rate` requests per second per client, bursts up to `burst`; 0 disables limiting."""

    rate: float
    burst: int
    what: str = "requests"  # what is counted, as the 429's message says
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def check(self, client: str, now: float | None = None) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens < 1.0:
            retry = max(1, math.ceil((1.0 - tokens) / self.rate))
            self._buckets[client] = (tokens, now)
            raise RateLimited(f"too many {self.what} from {client}; retry in {retry} s", retry_after=retry)
        self._buckets[client] = (tokens - 1.0, now)
        if len(self._buckets) > 100_000:  # forget idle clients (full buckets)
            cutoff = now - self.burst / self.rate
            self._buckets = {k: v for k, v in self._buckets.items() if v[1] >= cutoff}
