"""The storage contract: what the services and the API need from a backend.

One backend exists today (`ingest/duckdb_store.py`, the embedded default), picked from
`TALLY_DATABASE` by `ingest.backend.open_store`, the only place that names a backend. A
PostgreSQL backend for several API replicas must satisfy the same protocols and pass
`tests/ingest/test_store_contract.py`.

The seams: `Store` (hot-path lookups, the control plane, sessions, leases, `begin()` for the
writer), `Tx` (the write side: appends, claims, control-plane writes), `Reader` (reports and
reads), and `snapshot()`, the reconciler's handle (reconcile/ keeps DuckDB as its engine).
Reads may be called from any thread; `begin()` and everything on `Tx` only from the writer thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # Polars loads only after the `tally` command has tuned its allocator
    import polars as pl

from ingest.records import (
    Binding,
    Credential,
    LogLine,
    Partner,
    Program,
    Role,
    SaleLedger,
    StoredSession,
)


class Reader(Protocol):
    """Reads for reports, the JSON reads and the dashboard: the materialised tables and the raw
    log, on one snapshot of the database, off the event loop (see `api.state.read_tables`).
    SQL is the materialised tables' own (the `rc_*` schema of reconcile/schema.py) with `?`
    parameters; each backend speaks it through its own driver."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

    def dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows as {column: value}."""

    def frame(self, sql: str, params: Sequence[Any] = ()) -> pl.DataFrame: ...

    def table_exists(self, name: str) -> bool:
        """Whether a table exists (the materialised ones appear with the first reconcile run)."""

    def consistent(self) -> AbstractContextManager[None]:
        """Several reads inside this block see one state of the tables, whatever a reconcile
        run replaces meanwhile."""

    def period_close(self, program_id: str, period: str) -> tuple[int, datetime] | None:
        """(seq, time) of the first accepted close of `period` (YYYY-MM) in the program's raw
        log, or None while the month is open."""

    def log(
        self, program_id: str | None = None, before_seq: int | None = None
    ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """The raw log (of one program and/or before a sequence number), the programs and the
        partners, on one snapshot: the reconciler's input for books as of a period close."""


class Tx(Protocol):
    """One write transaction, owned by the writer thread. Domain checks happen before writes."""

    def mark(self) -> Any:
        """Where the transaction stands now, for `release`."""

    def release(self, mark: Any) -> bool:
        """Drop every write since `mark` (an operation that failed in a group); False when
        that cannot be done short of rolling back the whole transaction."""

    def append(self, row: Mapping[str, Any]) -> int:
        """Append one raw-log row (missing typed fields are NULL); returns its sequence number.
        Raises `ValidationFailed` when a value does not fit its column's type."""

    def claim_keys(self, program_id: str, keys: Sequence[str], raw_seq: int) -> list[str]:
        """Claim idempotency keys (sale ids, processor event ids); returns those this write
        claimed. A key already taken is left out: the conflict is the write's result, decided
        by the backend's unique key, not by a read before it."""

    def log(
        self,
        program_id: str,
        at: datetime,
        endpoint: str,
        status: int,
        outcome: str,
        detail: str,
        request_id: str | None,
        raw_seq: int | None,
    ) -> None: ...

    def check(self, program_id: str, step: str, at: datetime) -> None:
        """Mark an integration-checklist step done (first time only)."""

    def add_account(self, account_id: str, email: str, at: datetime) -> None: ...

    def add_workspace(self, workspace_id: str, name: str, at: datetime) -> None: ...

    def add_member(self, workspace_id: str, account_id: str, role: Role, at: datetime) -> None: ...

    def put_program(self, program: Program) -> None: ...

    def add_partner(self, partner: Partner) -> None: ...

    def add_credential(self, cred: Credential) -> None: ...

    def revoke_credentials(self, kind: str, subject_id: str, at: datetime) -> None: ...

    def flag_credential(self, token_hash: str, flagged_at: datetime, deadline: datetime) -> None: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run a statement inside the transaction (materialised tables, reconcile runs)."""

    def commit(self) -> None:
        """Make the transaction durable; raises `DatabaseUnavailable` on a resource fault
        (disk full, database unreachable), having stored nothing of it."""

    def rollback(self) -> None: ...


class Store(Protocol):
    """Reads of the control plane and hot-path lookups, plus `begin()` for the writer."""

    def begin(self) -> Tx: ...

    def flush(self) -> None:
        """Make everything committed visible to `query` (writer thread only); a no-op where
        commits go straight to the database."""

    schema_version: int  # the database's schema version (ingest/migrations.py)
    set_aside: int  # journal batches the database refused since start (0 where there is no journal)
    ingested: dict[tuple[str, str], int]  # raw rows appended by this process, by (kind, outcome)

    def reader(self) -> AbstractContextManager[Reader]:
        """A `Reader` on a fresh snapshot, for one thread, closed when the block ends."""

    def snapshot(self) -> AbstractContextManager[Any]:
        """The reconciler's handle on the database (reconcile/job.py runs on it), closed when
        the block ends. Opaque outside reconcile/ and ingest/: nothing in api/ looks into it."""

    def resource_fault(self, exc: BaseException) -> bool:
        """Whether `exc` (or what it wraps) is the database failing rather than its data."""

    def journal_backlog(self) -> tuple[int, int, float]:
        """Rows and batches committed but not yet visible to reads, and the oldest one's wait in
        seconds (zeros where commits go straight to the database)."""

    def watermark(self) -> int:
        """The log source's promise: every raw row with `seq` at or below this number is visible
        to reads (reconcile, reports) now, and no row with a lower `seq` can appear later. Rows
        above it may still be on their way (committed, not yet visible)."""

    def backlog(self) -> tuple[int, float]:
        """Committed rows not yet visible to `query`, and the age in seconds of the oldest."""

    def readiness(self) -> str | None:
        """Why writes cannot be taken right now (a resource fault), or None when they can."""

    def save_session(self, session: StoredSession) -> None:
        """Store a new dashboard session (and drop expired ones); committed when it returns."""

    def load_session(self, session_hash: str, now: datetime) -> StoredSession | None:
        """The dashboard session with this id hash, unless it ended or expired by `now`."""

    def end_session(self, session_hash: str) -> None:
        """End a dashboard session (logout): no instance answers it any more."""

    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the named lease (the reconcile run's lock) for `holder` until
        `now + ttl`; False while another holder's lease is unexpired. Decided in the database,
        so it binds every process sharing it, and a holder that dies frees it at expiry."""

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up if `holder` still holds it."""

    def close(self) -> None: ...

    def credential(self, token_hash: str) -> Credential | None: ...

    def program_credential(self, program_id: str) -> Credential | None: ...

    def program(self, program_id: str) -> Program | None: ...

    def programs_in(self, workspace_ids: Sequence[str]) -> list[Program]: ...

    def programs_for_stripe_account(self, account: str) -> list[Program]: ...

    def role(self, workspace_id: str, account_id: str) -> Role | None: ...

    def workspaces_of(self, account_id: str) -> dict[str, Role]: ...

    def workspace_exists(self, workspace_id: str) -> bool: ...

    def partner(self, program_id: str, code: str) -> Partner | None: ...

    def partners(self, program_id: str) -> list[Partner]: ...

    def click_partner(self, program_id: str, click_id: str) -> str | None: ...

    def binding(self, program_id: str, customer_key: str) -> Binding | None: ...

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]: ...

    def sale(self, program_id: str, keys: Sequence[str]) -> SaleLedger | None: ...

    def refund_seen(self, program_id: str, refund_id: str) -> bool: ...

    def event_seen(self, event_id: str) -> bool: ...

    def checklist(self, program_id: str) -> dict[str, datetime]: ...

    def tracking_log(self, program_id: str, limit: int, before: int | None = None) -> list[LogLine]: ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A read-only query on a snapshot (reports and reads of materialised tables)."""
