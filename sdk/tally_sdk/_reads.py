"""The reads (account token): which endpoint, which query, and how its pages follow each other.

Each function checks its arguments before anything is sent (`ValidationError`, `status is None`)
and returns a `Listing` (`Listing.call(offset)` is the call for the page starting at `offset`),
or, for a read of one object (a partner, a statement, a sale explained), its `Call`; so does
`sale_action`, an owner's hold, release or void of a sale (a `POST` with the same token).
Every id in a path is one segment, encoded with `quote(value, safe="")` (`_segment`).
Sales and commissions are paged by the API (`limit`, at most 1000, and `offset`, in a fixed
order: sales by `occurred_at` then `sale_id`, commission lines by period, date and key); the
programs, partners and payout batches of a program come in one answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from urllib.parse import quote

from tally_sdk._bodies import _invalid, _text
from tally_sdk._core import Call

MAX_PAGE_SIZE = 1000  # the API's largest `limit`
DEFAULT_PAGE_SIZE = 100

DateLike = date | datetime | str


@dataclass(frozen=True)
class Listing:
    """A read: its path and query; `page_size` when the API pages it (limit/offset), else None."""

    path: str
    params: dict[str, str] = field(default_factory=dict)
    page_size: int | None = None

    def call(self, offset: int = 0) -> Call:
        """The call for the page starting at row `offset` (the whole list when not paged)."""
        params = dict(self.params)
        if self.page_size is not None:
            params.update(limit=str(self.page_size), offset=str(offset))
        return Call(
            self.path,
            None,
            idempotent=True,
            method="GET",
            params=params,
            credential="account",
            expects="list",
        )


def programs() -> Listing:
    """`GET /api/v1/programs`: the programs of every workspace the account belongs to."""
    return Listing("/api/v1/programs")


def partners(program_id: str) -> Listing:
    """`GET /api/v1/programs/{id}/partners`."""
    return Listing(f"{_program(program_id)}/partners")


def partner(program_id: str, code: str) -> Call:
    """`GET /api/v1/programs/{id}/partners/{code}`: one partner, with its balances."""
    return _read(f"{_program(program_id)}/partners/{_segment('code', code)}")


def statement(
    program_id: str,
    code: str,
    *,
    currency: str | None = None,
    start: DateLike | None = None,
    end: DateLike | None = None,
) -> Call:
    """`GET /api/v1/programs/{id}/partners/{code}/statement`: the partner's account in
    `currency` (needed when they have money in several); `start` / `end` are the API's `from` /
    `to` (a date is its whole day, `end`'s included), what comes before `start` being the
    opening balance."""
    params: dict[str, str] = {}
    if currency is not None:
        text = _text("currency", currency)
        if not (len(text) == 3 and text.isascii() and text.isalpha()):
            raise _invalid("currency", f"must be a three-letter currency code, got {currency!r}")
        params["currency"] = text.lower()
    if start is not None:
        params["from"] = _moment("start", start)
    if end is not None:
        params["to"] = _moment("end", end)
    return _read(f"{_program(program_id)}/partners/{_segment('code', code)}/statement", params)


def payouts(program_id: str) -> Listing:
    """`GET /api/v1/programs/{id}/payouts` (an owner's): every batch, newest first."""
    return Listing(f"{_program(program_id)}/payouts")


def sales(
    program_id: str,
    *,
    transaction_id: str | None = None,
    start: DateLike | None = None,
    end: DateLike | None = None,
    attributed: bool | None = None,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> Listing:
    """`GET /api/v1/programs/{id}/sales`: `start` / `end` are the API's `from` / `to` (a date is
    its whole day, `end`'s included; an aware datetime is that instant)."""
    params: dict[str, str] = {}
    if transaction_id is not None:
        params["transaction_id"] = _text("transaction_id", transaction_id)
    if start is not None:
        params["from"] = _moment("start", start)
    if end is not None:
        params["to"] = _moment("end", end)
    if attributed is not None:
        if not isinstance(attributed, bool):
            raise _invalid("attributed", "must be a boolean")
        params["attributed"] = "true" if attributed else "false"
    return Listing(f"{_program(program_id)}/sales", params, _page_size(page_size))


def commissions(
    program_id: str, *, period: str | date | None = None, page_size: int = DEFAULT_PAGE_SIZE
) -> Listing:
    """`GET /api/v1/programs/{id}/commissions`: every line, or those of one month `period`
    (`YYYY-MM`, or any date in it)."""
    params: dict[str, str] = {}
    if isinstance(period, date):
        params["period"] = f"{period.year:04d}-{period.month:02d}"
    elif period is not None:
        params["period"] = _text("period", period)
    return Listing(f"{_program(program_id)}/commissions", params, _page_size(page_size))


def explain(program_id: str, transaction_id: str) -> Call:
    """`GET /api/v1/programs/{id}/sales/{transaction_id}/explain`: one reconciled sale, its
    attribution step by step and its lines. The id is one encoded path segment (`/`, `%`, `?`,
    `#`, spaces and any character travel as themselves, never as path syntax)."""
    return _read(f"{_program(program_id)}/sales/{_segment('transaction_id', transaction_id)}/explain")


SALE_ACTIONS = ("hold", "release", "void")


def sale_action(program_id: str, transaction_id: str, action: str, reason: str) -> Call:
    """`POST /api/v1/programs/{id}/commissions/{transaction_id}/{action}` (a workspace owner's):
    hold, release or void the sale's unpaid lines, with `reason` (kept in the log and shown in
    explain). Not idempotent (holding a held sale is 409 `invalid_transition`), so it is retried
    only when the server surely did not take it."""
    if action not in SALE_ACTIONS:
        raise _invalid("action", f"must be one of {', '.join(SALE_ACTIONS)}, got {action!r}")
    path = f"{_program(program_id)}/commissions/{_segment('transaction_id', transaction_id)}/{action}"
    body = {"reason": _text("reason", reason)}
    return Call(path, body, idempotent=False, method="POST", credential="account", expects="object")


def _read(path: str, params: dict[str, str] | None = None) -> Call:
    """The call reading one object at `path` (a `GET`, so retried like any read)."""
    return Call(
        path, None, idempotent=True, method="GET", params=params or {}, credential="account", expects="object"
    )


def _program(program_id: str) -> str:
    return f"/api/v1/programs/{_segment('program_id', program_id)}"


def _segment(name: str, value: str) -> str:
    return quote(_text(name, value), safe="")


def _page_size(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PAGE_SIZE:
        raise _invalid("page_size", f"must be an integer from 1 to {MAX_PAGE_SIZE}, got {value!r}")
    return value


def _moment(name: str, value: DateLike) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise _invalid(name, "must be an aware datetime, a date or a string")
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    return _text(name, value)
