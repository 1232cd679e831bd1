"""What failed, when the embedded database fails: its data, or its resources.

The database's refusals of the data itself (a value a column cannot take) are the data's: a
journal batch they refuse is set aside (ingest/storage/duckdb/copier.py). Anything else while
writing (I/O, a full disk, memory) is a resource fault: 503 `database_unavailable`, nothing of
the write stored, every journaled batch kept for the next attempt.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa

from ingest.domain.errors import DatabaseUnavailable

DATA_FAULTS: tuple[type[BaseException], ...] = (
    duckdb.ConversionException,
    duckdb.ConstraintException,
    duckdb.InvalidInputException,
    duckdb.OutOfRangeException,
    duckdb.TypeMismatchException,
    duckdb.InvalidTypeException,
    pa.ArrowException,
    OverflowError,
    TypeError,
    ValueError,
    UnicodeError,
)
RESOURCE_FAULTS = (OSError, duckdb.IOException, duckdb.OutOfMemoryException, sqlite3.OperationalError)
UNAVAILABLE = "tally cannot write to its database right now; nothing of this request was stored"


def not_the_data(exc: BaseException) -> bool:
    """Whether a failed write failed for another reason than its data."""
    return not isinstance(exc, DATA_FAULTS)


def resource_fault(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) is the database failing rather than its data."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, RESOURCE_FAULTS):
            return True
        if isinstance(cause, duckdb.TransactionException) and "Failed to commit" in str(cause):
            return True
        cause = cause.__cause__
    return False


@contextmanager
def keys_faults() -> Iterator[None]:
    """A key-index write that fails for want of disk (or an I/O error) is the database being
    unavailable, like a journal write that fails: 503, nothing of the batch stored."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        raise DatabaseUnavailable(UNAVAILABLE) from exc
