"""Reads as iterators: `Pager` (from `Tally.list_*`) and `AsyncPager` (from `AsyncTally.list_*`).

Iterating a pager yields every row, fetching the next page when the one in hand is used up
(nothing is sent before the first row is asked for); `pages()` yields the pages themselves, each
a `Page`: a `TrackResult` whose `data` is that page's rows, with its `offset` and `next_offset`.

    for line in tally.list_commissions("prog_...", period="2026-01"):
        print(line["partner_code"], line["amount"], line["status"])
    async for sale in async_tally.list_sales("prog_...", start=date(2026, 1, 1)):
        ...

A page shorter than the page size is the last; when a page is exactly full, one more request
finds the end. Pages are read one at a time: a reconcile run between two pages may add or move
rows (each page is one consistent read), so a listing taken while the reconciler runs can, at a
page boundary, repeat or skip a row that changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tally_sdk._core import Call, TrackResult
from tally_sdk._reads import Listing

ItemT = TypeVar("ItemT")


@dataclass(frozen=True)
class Page(TrackResult[list[ItemT]]):
    """One answer of a read: `data` holds its rows; `next_offset` is where the next page starts
    (None on the last page)."""

    offset: int = 0
    next_offset: int | None = None

    @property
    def has_more(self) -> bool:
        return self.next_offset is not None


def _page(listing: Listing, offset: int, result: TrackResult[Any]) -> Page[Any]:
    rows: list[Any] = result.data
    full = listing.page_size is not None and len(rows) >= listing.page_size
    return Page(
        rows,
        result.warnings,
        result.rotation_deadline,
        result.rotation_flagged,
        result.request_id,
        result.status,
        result.attempts,
        result.raw_response,
        offset=offset,
        next_offset=offset + len(rows) if full else None,
    )


class Pager(Generic[ItemT]):
    """Every row of a read, page after page (sync)."""

    def __init__(self, listing: Listing, send: Callable[[Call], TrackResult[Any]]) -> None:
        self._listing = listing
        self._send = send

    def pages(self) -> Iterator[Page[ItemT]]:
        """The pages, fetched one at a time as they are asked for."""
        offset: int | None = 0
        while offset is not None:
            page: Page[ItemT] = _page(self._listing, offset, self._send(self._listing.call(offset)))
            yield page
            offset = page.next_offset

    def __iter__(self) -> Iterator[ItemT]:
        for page in self.pages():
            yield from page.data

    def __repr__(self) -> str:
        return f"Pager({self._listing.path!r})"


class AsyncPager(Generic[ItemT]):
    """Every row of a read, page after page (`async for`)."""

    def __init__(self, listing: Listing, send: Callable[[Call], Awaitable[TrackResult[Any]]]) -> None:
        self._listing = listing
        self._send = send

    async def pages(self) -> AsyncIterator[Page[ItemT]]:
        """The pages, fetched one at a time as they are asked for."""
        offset: int | None = 0
        while offset is not None:
            page: Page[ItemT] = _page(self._listing, offset, await self._send(self._listing.call(offset)))
            yield page
            offset = page.next_offset

    async def __aiter__(self) -> AsyncIterator[ItemT]:
        async for page in self.pages():
            for row in page.data:
                yield row

    def __repr__(self) -> str:
        return f"AsyncPager({self._listing.path!r})"
