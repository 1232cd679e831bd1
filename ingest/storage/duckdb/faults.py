"""What failed, when the embedded database fails: its data, or its resources.

The database's refusals of the data itself (a value a column cannot take) are the data's: a
journal batch they refuse is set aside (ingest/storage/duckdb/copier.py). Anything else while
writing (I/O, a full disk, memory) is a resource fault: 503 `database_unavailable`, nothing of
the write stored, every journaled batch kept for the next attempt.
"""

from __future__ import annotations

import sqlite3
from types import TracebackType

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


class _KeysFaults:
    """A key-index write that fails for want of disk (or an I/O error) is the database being
    unavailable, like a journal write that fails: 503, nothing of the batch stored. (A class, not
    a generator: the writer enters it for every row and claim.)"""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        if exc is not None and isinstance(exc, sqlite3.OperationalError):
            raise DatabaseUnavailable(UNAVAILABLE) from exc


_KEYS_FAULTS = _KeysFaults()


def keys_faults() -> _KeysFaults:
    """The context in which key-index writes run (see `_KeysFaults`)."""
    return _KEYS_FAULTS
