"""The storage contract: what the services, the API and the reconciler need from a backend.

Two backends satisfy it, picked from `TALLY_DATABASE` by `ingest.storage.factory.open_store`, the only
place that names one: the embedded DuckDB file (`ingest/storage/duckdb/store.py`, one process) and
PostgreSQL (`ingest/storage/postgres/store.py`, several replicas). `tests/ingest/test_store_contract.py`
is the specification both pass.

The seams:

- `Store`: hot-path lookups, the control plane, dashboard sessions, leases (the reconcile run
  lock), the watermark, readiness, `begin()` for the writer; and, as a `Portal`, the partners'
  sign-in links, sessions and payout details.
- `Tx`: the write side, one group commit: appends, claims that report what they claimed,
  lookups that see the transaction's own writes, control-plane writes.
- `Reader`: reports, reads and the dashboard: the materialised tables, the latest run, period
  closes, and the raw log for books as of a close.
- `LogDatabase` (`Store.log_database()`): the DuckDB database the reconciler runs in for one
  run, and where its results are published besides. The embedded database is its own; a shared
  database feeds a working copy through a `LogSource` (chunks of the log by sequence range
  below a watermark, the control plane) and receives the results through a `ResultSink`
  (tables replaced or patched, and the run recorded, in one transaction). The reconciler's
  engine on it is reconcile/run/engine.py's: nothing here knows the reconciler.

Reads may be called from any thread; `begin()` and everything on `Tx` only from the writer thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # Polars loads only after the `tally` command has tuned its allocator
    import duckdb
    import polars as pl
    import pyarrow as pa


from ingest.domain.errors import ValidationFailed
from ingest.domain.records import (
    Binding,
    Credential,
    LogLine,
    Partner,
    PartnerSession,
    PayoutDetails,
    PortalLink,
    Program,
    Role,
    SaleLedger,
    StoredSession,
)
from ingest.progress import Progress
from ingest.storage.partitions import Scope
from ingest.storage.sql import Executor


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
        run replaces meanwhile. Blocks nest: an inner one reads the outer one's state."""

    def latest_run(self) -> tuple[str, datetime] | None:
        """(run id, finished at) of the newest reconcile run, or None before the first."""

    def raw_rows(self, seqs: Sequence[int]) -> list[dict[str, Any]]:
        """Whole raw-log rows (every column, the verbatim body included), by seq, in seq order."""

    def period_close(self, program_id: str, period: str) -> tuple[int, datetime] | None:
        """(seq, time) of the first accepted close of `period` (YYYY-MM) in the program's raw
        log, or None while the month is open."""

    def log_database(
        self, program_id: str | None, before_seq: int | None, later_kinds: Sequence[str] = ()
    ) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """A DuckDB connection over the raw log (at least that of `program_id` before
        `before_seq`, when given, and the rows of `later_kinds` after it) and the control plane,
        on one snapshot: what the books as of a period close are read from (reconcile/run/engine.py
        `books`). The embedded database's own cursor; on a shared database, those rows copied
        into an in-memory database."""


ProgramKey = tuple[str, str]  # (program id, key)
KeyRead = tuple[Credential, Program | None]  # a program key and its program, as they were read


@dataclass(frozen=True)
class Needs:
    """What one operation will claim and look up in the tables ingest decides from, handed to
    the writer with it (`Writer.run(op, needs=...)`) so a group commit can read them for every
    operation of the group at once (`Tx.prefetch`) instead of a statement each. A hint, never a
    promise: an operation may look up more (at a statement each) or less."""

    claims: tuple[ProgramKey, ...] = ()  # idempotency keys it will claim
    sales: tuple[ProgramKey, ...] = ()  # sale ids whose ledger it will read
    clicks: tuple[ProgramKey, ...] = ()
    bindings: tuple[ProgramKey, ...] = ()  # customers whose binding it will read
    provisional: tuple[ProgramKey, ...] = ()  # customers whose provisional lead it will read
    refunds: tuple[ProgramKey, ...] = ()
    events: tuple[str, ...] = ()  # processor event ids
    # The program key the operation was let in with, and its program, as they were read (a
    # backend whose lookups may answer from a cache checks them again in the group commit).
    key: KeyRead | None = None


LOOKED_UP = ("claims", "sales", "clicks", "bindings", "provisional", "refunds", "events")


def gather(needs: Sequence[Needs]) -> dict[str, list[tuple[str, ...]]]:
    """The keys a group's operations need, by `Needs` field (`LOOKED_UP`), in their order, each
    a tuple (a processor event id alone in one)."""
    wanted: dict[str, list[tuple[str, ...]]] = {name: [] for name in LOOKED_UP}
    for need in needs:
        for name in LOOKED_UP[:-1]:
            wanted[name] += getattr(need, name)
        wanted["events"] += [(event_id,) for event_id in need.events]
    return wanted


class _Attributing(Protocol):
    def click_partner(self, program_id: str, click_id: str) -> str | None: ...

    def binding(self, program_id: str, customer_key: str) -> Binding | None: ...


def sale_partner(tx: _Attributing, program_id: str, click_id: str | None, customer_key: str) -> str:
    """What `Tx.claim_sale` answers for a sale it claimed: the partner its click names, else its
    customer's binding, '' for none."""
    partner = tx.click_partner(program_id, click_id) if click_id is not None else None
    if partner is None:
        binding = tx.binding(program_id, customer_key)
        partner = binding.partner_code if binding else None
    return partner or ""


class Tx(Protocol):
    """One write transaction, owned by the writer thread. Domain checks happen before writes."""

    def prefetch(self, needs: Sequence[Needs]) -> None:
        """Read ahead what the group's operations will claim and look up (`Needs`), in as few
        statements as the backend can; their lookups and claims then answer from it. Decides
        nothing: what a claim took is still the claim's own result."""

    def outdated(self, needs: Needs) -> bool:
        """After `prefetch`: whether the program key `needs.key` names was revoked, flagged or
        changed (or its program's settings) since the operation read it; the writer then hands
        the operation back (`KeyChanged`) to be decided again with the key as it is now."""

    def mark(self) -> Any:
        """Where the transaction stands now, for `release`."""

    def release(self, mark: Any) -> bool:
        """Drop every write since `mark` (an operation that failed in a group); False when
        that cannot be done short of rolling back the whole transaction."""

    def append(self, row: Mapping[str, Any]) -> int:
        """Append one raw-log row (missing typed fields are NULL); returns its sequence number,
        or a stand-in for it that `log` and `claim_keys` take (where numbers are handed out at
        commit). Raises `ValidationFailed` when a value does not fit its column's type."""

    def claim_keys(self, program_id: str, keys: Sequence[str], raw_seq: int) -> list[str]:
        """Claim idempotency keys (sale ids, processor event ids); returns those this write
        claimed. A key already taken is left out: the conflict is the write's result, decided
        by the backend's unique key, not by a read before it (another process's claim of the
        same key, still in flight, is waited for)."""

    def claim_sale(
        self, program_id: str, key: str, raw_seq: int, click_id: str | None, customer_key: str
    ) -> str | None:
        """Claim a track sale's key (`sale_claim` of its transaction id, as `claim_keys`). When
        this write claimed it:
        the partner its click names, else its customer's binding, '' for none (what the answer
        says at once; attribution proper is the reconciler's). None when the id was taken."""

    # Lookups inside the transaction: they see its own appends (and, on a shared database,
    # lock what a decision depends on: a sale's ledger until the transaction ends).
    def sale(self, program_id: str, keys: Sequence[str]) -> SaleLedger | None: ...

    def refund_seen(self, program_id: str, refund_id: str) -> bool: ...

    def event_seen(self, event_id: str) -> bool: ...

    def click_partner(self, program_id: str, click_id: str) -> str | None: ...

    def binding(self, program_id: str, customer_key: str) -> Binding | None: ...

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]: ...

    def credential_used(self, token_hash: str) -> bool:
        """Whether a credential with this hash was ever issued (revoked ones included)."""

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        """The programs connected to processor account `account`, this transaction's changes
        included (on a shared database the account is held until the transaction ends, so two
        workspaces claiming it at once are decided one after the other)."""

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

    def commit(self) -> None:
        """Make the transaction durable; raises `DatabaseUnavailable` on a resource fault
        (disk full, database unreachable), having stored nothing of it."""

    def rollback(self) -> None: ...


@dataclass
class BackupSummary:
    """What `Store.backup` copied: where, its size, its tables and rows, how far the log and
    the journal reach in it, journal batches set aside (not in the copy), how long it took."""

    path: str
    bytes: int
    tables: int
    rows: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    last_batch: int = 0
    set_aside: int = 0
    duration_ms: int = 0


class BackupTargetUnusable(ValidationFailed):
    """Raised by `Store.check_backup` and `Store.backup` when the output path cannot take the
    copy, or the backend is backed up by its own tools (422 `validation_error` naming `path`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, fields=[{"field": "path", "message": message}])


RunRecord = Mapping[str, Any]  # one `rc_runs` row: {column: value}


@dataclass
class Changes:
    """What an incremental reconcile run changes in the published tables: rows deleted by key
    (`deletes`: table -> (key column, keys)), tables replaced whole, rows inserted, scratch
    tables for the statements (temporary, by name), then `statements` run in order (in the
    sink's dialect, `$1`-style parameters)."""

    deletes: dict[str, tuple[str, pa.Array]] = field(default_factory=dict)
    replaces: dict[str, pa.Table] = field(default_factory=dict)
    inserts: dict[str, pa.Table] = field(default_factory=dict)
    scratch: dict[str, pa.Table] = field(default_factory=dict)
    statements: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)


class LogSource(Protocol):
    """The shared log, as the reconciler's working copy reads it."""

    def identity(self) -> str:
        """Which database this is (a working copy of another one is thrown away)."""

    def watermark(self) -> int:
        """Every raw row with `seq` at or below this number is readable now, and no row with a
        lower `seq` can appear later."""

    def control(self) -> tuple[pa.Table, pa.Table]:
        """The `programs` and `partners` tables, whole."""

    def raw(
        self,
        after_seq: int,
        upto_seq: int,
        program_id: str | None = None,
        kinds: Sequence[str] | None = None,
        scope: Scope | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Raw rows with `after_seq < seq <= upto_seq` (of one program, of some kinds, of one
        reconcile partition, if given), in seq order."""

    def count(self, after_seq: int, upto_seq: int, scope: Scope) -> int:
        """How many raw rows of partition `scope` have `after_seq < seq <= upto_seq`."""


class ResultSink(Protocol):
    """Where the reconciler publishes its tables for every process to read (of the programs of
    one reconcile partition, `scope`, or all)."""

    dialect: str
    scope: Scope | None

    def latest_run(self) -> str | None:
        """The id of the run the published tables are of (None before the first)."""

    def builds_on(self, run_id: str | None) -> bool:
        """Whether the published rows this sink writes are still those run `run_id` published:
        it is the latest run (of the sink's partition: no run published since wrote any of the
        partition's programs)."""

    def replace(
        self,
        tables: Iterable[tuple[str, pa.RecordBatchReader]],
        views: Mapping[str, str],
        indexes: Mapping[str, Sequence[Sequence[str]]],
        run: RunRecord,
    ) -> None:
        """Replace every table (name, rows: each read whole before the next is asked for), with
        its indexes (table -> column lists, where the database keeps indexes), and view (name,
        SELECT), and record the run, in one transaction."""

    def patch(self, changes: Changes, run: RunRecord) -> None:
        """Apply an incremental run's changes and record the run, in one transaction."""


@dataclass(frozen=True)
class LogDatabase:
    """The DuckDB database the reconciler runs in, for one run (`Store.log_database`): `cursor`
    over the raw log and the control plane, where the reconciler keeps its tables, and `sink`,
    where it publishes them for every process, or None where `cursor` is on the store's own
    database (the embedded file: its tables are the ones every read sees)."""

    cursor: duckdb.DuckDBPyConnection
    sink: ResultSink | None


class Portal(Protocol):
    """The partners' portal (api/portal.py): one-time sign-in links, partner sessions and
    payout details, in the database, so every replica answers alike. Each call is committed when
    it returns; `DatabaseUnavailable` while the database cannot be reached."""

    def add_portal_link(self, link: PortalLink) -> None:
        """Keep a new sign-in link (by the hash of its token), dropping expired ones."""

    def use_portal_link(self, token_hash: str, now: datetime) -> PortalLink | None:
        """The link with this hash, removed in the same step, so of any number of concurrent
        uses (on any replica) exactly one gets it; None when unknown, used or expired by `now`."""

    def save_partner_session(self, session: PartnerSession) -> None:
        """Store a new partner session (and drop expired ones)."""

    def load_partner_session(self, session_hash: str, now: datetime) -> PartnerSession | None:
        """The partner session with this id hash, unless it ended or expired by `now`."""

    def end_partner_session(self, session_hash: str) -> None:
        """End a partner session (sign out): no replica answers it any more."""

    def payout_details(self, program_id: str) -> dict[str, PayoutDetails]:
        """The payout details of the program's partners that set them, by partner code."""

    def set_payout_details(self, details: PayoutDetails) -> None:
        """Set (or replace) a partner's payout details."""


class Store(Portal, Protocol):
    """Reads of the control plane and hot-path lookups, plus `begin()` for the writer."""

    def begin(self) -> Tx: ...

    def flush(self) -> None:
        """Make everything committed visible to reads (writer thread only); a no-op where
        commits go straight to the database."""

    schema_version: int  # the database's schema version (ingest/storage/migrations.py)

    @property
    def set_aside(self) -> int:
        """Journal batches the database refused since start (0 where there is no journal)."""

    ingested: dict[tuple[str, str], int]  # raw rows appended by this process, by (kind, outcome)

    def reader(self) -> AbstractContextManager[Reader]:
        """A `Reader` on a fresh snapshot, for one thread, closed when the block ends."""

    partitions: int  # reconcile partitions (ingest/storage/partitions.py): 1 but on a shared database

    def reconcile_partitions(self) -> int:
        """How many partitions the database is reconciled in now (on a shared database, the
        setting of the replica started last): a replica whose `partitions` differ must not run."""

    def log_database(self, scope: Scope | None = None) -> AbstractContextManager[LogDatabase]:
        """The reconciler's database, brought up to the watermark, for the block (one at a time
        per scope: callers hold the scope's reconcile lease): the embedded file itself, on a fresh
        cursor; for a shared database, its working copy on this machine of the log or of
        partition `scope` of it (ingest/storage/postgres/copy.py), fed by its `LogSource`, with
        its `ResultSink` (publishing that partition's programs only). reconcile/run/engine.py
        opens the reconciler's engine on it."""

    def check_backup(self, path: str) -> None:
        """Raises `ValidationFailed` when a backup cannot be written to `path` (before any work)."""

    def backup(self, path: str, sync: Callable[[], None], progress: Progress) -> BackupSummary:
        """A consistent copy of the database at `path` on this machine, while it serves
        (`sync` makes every acknowledged write visible first). Raises `ValidationFailed` when
        the path cannot take it, or when the backend is backed up by its own tools."""

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
        """Committed rows not yet visible to reads, and the age in seconds of the oldest."""

    def readiness(self) -> str | None:
        """Why writes cannot be taken right now (a resource fault), or None when they can."""

    def save_session(self, session: StoredSession) -> None:
        """Store a new dashboard session (and drop expired ones); committed when it returns."""

    def load_session(self, session_hash: str, now: datetime) -> StoredSession | None:
        """The dashboard session with this id hash, unless it ended or expired by `now`."""

    def end_session(self, session_hash: str) -> None:
        """End a dashboard session (logout): no instance answers it any more (nor its values
        kept to be shown once)."""

    def keep_once(
        self, session_hash: str, name: str, sealed: str, now: datetime, expires_at: datetime
    ) -> None:
        """Keep a sealed value for the session's next page that takes `name` (replacing one
        kept before; those expired by `now` are swept)."""

    def take_once(self, session_hash: str, name: str, now: datetime) -> str | None:
        """The sealed value kept under `name`, removed in the same step, so exactly one page (on
        any instance) gets it; None when none is kept or it expired by `now`."""

    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the named lease (the reconcile run's lock) for `holder` until
        `now + ttl`; False while another holder's lease is unexpired. Decided in the database,
        so it binds every process sharing it; never waits. A holder that dies frees it at once:
        on PostgreSQL the lock is its connection's (an advisory lock), on the embedded file a
        holder named by its process (`ingest.storage.lockfile.identity()`) that no longer runs holds
        nothing (tests/ingest/test_store_contract.py)."""

    def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up if `holder` still holds it."""

    def outbox(self) -> AbstractContextManager[Executor]:
        """A connection for the webhook outbox's statements (ingest/webhooks_out/outbox.py), this
        thread's own, in autocommit: a caller delimits a transaction with BEGIN and COMMIT
        (`outbox.transaction`). `DatabaseUnavailable` while the database cannot be reached."""

    def attempt_journal(self) -> Path | None:
        """Where the webhook delivery worker keeps attempts before they reach the database
        (ingest/webhooks_out/journal.py): a file beside the embedded database; None on
        PostgreSQL, where they are recorded in the database at once."""

    def close(self) -> None: ...

    def credential(self, token_hash: str) -> Credential | None: ...

    def credential_and_program(self, token_hash: str) -> KeyRead | None:
        """The live credential with this hash and, when it is a program key, its program: the
        track endpoints' one lookup per request."""

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

    def tracking_log(self, program_id: str, limit: int, before: int | None = None) -> list[LogLine]:
        """A page of a program's tracking log, newest first: the lines below `before` (a
        `log_id`), at most `limit` (and `LOG_PAGE_MAX`), each detail cut to `LOG_DETAIL_SHOWN`
        characters, in memory bounded by the page whatever the log holds. Blocking: the API
        and the dashboard call it off the event loop (`api/state.py::read_store`)."""
        ...
