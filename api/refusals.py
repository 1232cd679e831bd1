"""The refusal rate limit: how often one client address may be refused an unverified call.

A refused call that names a program leaves a line in that program's tracking log (a bounded
note, `ingest/refusals.py`), and anyone can send such calls: a webhook delivery with a bad
signature, a track call without a valid program key, a public click the program does not take.
Each such refusal takes a token from its client's bucket (`TALLY_REFUSAL_RATE_PER_SECOND`,
`TALLY_REFUSAL_RATE_BURST`; the client as `TALLY_TRUSTED_PROXIES` says, api/proxies.py); with
none left, the call is answered 429 `rate_limited` with `Retry-After` instead, and nothing is
written. Calls that are accepted never take a token and are never limited by it, nor are
refusals of a call made with a valid program key (the tenant's own, e.g. a duplicate sale).

The buckets live in each process, like the public rate limit's: they decide nothing about money
(an accepted call is never turned away), so a client may be refused up to N times the rate
behind N replicas, which still bounds what it can write.
"""

from __future__ import annotations

from starlette.requests import Request

from api.auth import state
from api.http import recall
from api.proxies import client_address
from ingest.domain.errors import RateLimited, TallyError


def counts(error: TallyError) -> bool:
    """Whether `error` is a refusal of the client's call (4xx), not a limit or a server fault."""
    return 400 <= error.status < 500 and not isinstance(error, RateLimited)


def check(request: Request, error: TallyError) -> None:
    """Count the refusal of an unverified call; raise `RateLimited` (from `error`) when its
    client is over the refusal rate. A call let in by a valid program key is not counted."""
    if not counts(error) or recall(request, "authenticated"):
        return
    st = state(request)
    try:
        st.refusals.check(client_address(request.scope, st.settings.trusted_proxies))
    except RateLimited as limited:
        limited.logged = True  # nothing is written for a refusal over the limit
        raise limited from error
