"""One group commit on the embedded database (`Tx` of ingest/storage/contract.py), on the
writer's cursor.

Raw-log, tracking-log, idempotency and checklist rows are buffered per transaction and, at
commit, journaled as one batch (ingest/storage/duckdb/copier.py) or, with control-plane changes,
inserted in bulk (Arrow) in one DuckDB commit: what makes group commit cheap. Every raw row is
checked against the column types before it is buffered (a value DuckDB cannot hold is refused
there, as a 422, never acknowledged). What the log decides on the hot path is the key index's
(ingest/storage/duckdb/keys.py), committed with each batch; the control plane's in-memory copy
(ingest/storage/duckdb/control.py) changes with the database and is undone with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import duckdb

from ingest.domain.errors import DatabaseUnavailable, ValidationFailed
from ingest.domain.records import (
    Credential,
    Partner,
    Program,
    Role,
    credential_values,
    partner_values,
    program_values,
)
from ingest.storage.contract import Needs, sale_partner
from ingest.storage.duckdb.control import ControlCache, Undo
from ingest.storage.duckdb.copier import Batch
from ingest.storage.duckdb.faults import UNAVAILABLE, keys_faults, not_the_data
from ingest.storage.duckdb.keys import KeyLookups
from ingest.storage.schema import RAW_EVENT_FIELDS, storable

if TYPE_CHECKING:
    from ingest.storage.duckdb.store import DuckStore

KIND, OUTCOME = RAW_EVENT_FIELDS.index("kind"), RAW_EVENT_FIELDS.index("outcome")


class DuckTx(KeyLookups):
    """A write transaction on the writer's cursor (see `Tx`)."""

    def __init__(self, store: DuckStore) -> None:
        self._store = store
        self._cur = store._writer_cursor()
        self._in_db_tx = False
        self.undo: Undo = []
        self._raw: list[tuple[Any, ...]] = []
        self._logs: list[tuple[Any, ...]] = []
        self._claims: list[tuple[Any, ...]] = []
        self._checks: list[tuple[Any, ...]] = []
        self._next_seq = store._seq + 1
        self._next_log = store._log_id + 1
        self.keys = store.keys
        self.keys.begin()
        self._last: tuple[int, object] | None = None  # the newest raw row: (seq, received_at)

    @property
    def index(self) -> ControlCache:
        return self._store.index

    def _sql(self) -> duckdb.DuckDBPyConnection:
        """The writer's cursor inside a database transaction, begun on first use: batches of
        track calls never open one (they go to the journal); control-plane changes do."""
        if not self._in_db_tx:
            self._cur.execute("BEGIN TRANSACTION")
            self._in_db_tx = True
        return self._cur

    def mark(self) -> tuple[Any, ...]:
        """Where this transaction stands, for `release` (one operation's writes in a group)."""
        return (
            len(self._raw),
            len(self._logs),
            len(self._claims),
            len(self._checks),
            len(self.undo),
            self._next_seq,
            self._next_log,
            int(self._in_db_tx),
            self.keys.mark(),
            self._last,
        )

    def prefetch(self, needs: Sequence[Needs]) -> None:
        with keys_faults():
            self.keys.prefetch(needs)

    def outdated(self, needs: Needs) -> bool:
        """Never: the endpoints read keys from the control plane this writer keeps itself."""
        return False

    def release(self, mark: tuple[Any, ...]) -> bool:
        """Drop what was written since `mark`; False when that cannot be done (statements ran
        in the database since), and then only rolling back the whole transaction can."""
        raw, logs, keys, checks, undo, next_seq, next_log, in_db, savepoint, last = mark
        if self._in_db_tx and not in_db:
            return False
        self.keys.release(savepoint)
        self._last = last
        del self._raw[raw:], self._logs[logs:], self._claims[keys:], self._checks[checks:]
        while len(self.undo) > undo:
            self.undo.pop()()
        self._next_seq, self._next_log = next_seq, next_log
        return True

    def append(self, row: Mapping[str, Any]) -> int:
        seq = self._next_seq
        full = dict(row)
        full["seq"] = seq
        full.setdefault("test_mode", False)
        problems = storable(full)
        if problems:
            raise ValidationFailed("the event holds values tally cannot store", fields=problems)
        self._next_seq += 1
        self._raw.append(tuple(map(full.get, RAW_EVENT_FIELDS)))
        with keys_faults():
            self.keys.observe(full)
        self._last = (seq, full.get("received_at"))
        return seq

    def claim_keys(self, program_id: str, keys: Sequence[str], raw_seq: int) -> list[str]:
        claimed = []
        for key in keys:
            with keys_faults():
                fresh = self.keys.claim(program_id, key)
            if fresh:
                self._claims.append((program_id, key, raw_seq))
                claimed.append(key)
        return claimed

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
    ) -> None:
        log_id = self._next_log
        self._next_log += 1
        self._logs.append((log_id, program_id, at, endpoint, status, outcome, detail, request_id, raw_seq))

    def check(self, program_id: str, step: str, at: datetime) -> None:
        if self.index.put_checklist(program_id, step, at, self.undo):
            self._checks.append((program_id, step, at))

    def add_account(self, account_id: str, email: str, at: datetime) -> None:
        self._sql().execute("INSERT INTO accounts VALUES (?, ?, ?)", [account_id, email, at])

    def add_workspace(self, workspace_id: str, name: str, at: datetime) -> None:
        self._sql().execute("INSERT INTO workspaces VALUES (?, ?, ?)", [workspace_id, name, at])

    def add_member(self, workspace_id: str, account_id: str, role: Role, at: datetime) -> None:
        self._sql().execute(
            "INSERT INTO memberships VALUES (?, ?, ?, ?)", [workspace_id, account_id, role, at]
        )
        self.index.put_role(workspace_id, account_id, role, self.undo)

    def put_program(self, program: Program) -> None:
        self._sql().execute(
            "INSERT OR REPLACE INTO programs VALUES (?, ?, ?, ?, ?, ?)", list(program_values(program))
        )
        self.index.put_program(program, self.undo)

    def add_partner(self, partner: Partner) -> None:
        self._sql().execute("INSERT INTO partners VALUES (?, ?, ?, ?, ?, ?)", list(partner_values(partner)))
        self.index.put_partner(partner, self.undo)

    def add_credential(self, cred: Credential) -> None:
        self._sql().execute(
            "INSERT INTO credentials VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", list(credential_values(cred))
        )
        self.index.put_credential(cred, self.undo)

    def revoke_credentials(self, kind: str, subject_id: str, at: datetime) -> None:
        self._sql().execute(
            "UPDATE credentials SET revoked_at = ? WHERE kind = ? AND subject_id = ? AND revoked_at IS NULL",
            [at, kind, subject_id],
        )
        for cred in list(self.index.credentials.values()):
            if cred.kind == kind and cred.subject_id == subject_id:
                self.index.put_credential(replace(cred, revoked_at=at), self.undo)

    def flag_credential(self, token_hash: str, flagged_at: datetime, deadline: datetime) -> None:
        self._sql().execute(
            "UPDATE credentials SET flagged_at = ?, rotation_deadline = ? WHERE token_hash = ?",
            [flagged_at, deadline, token_hash],
        )
        cred = self.index.credentials[token_hash]
        self.index.put_credential(replace(cred, flagged_at=flagged_at, rotation_deadline=deadline), self.undo)

    def claim_sale(
        self, program_id: str, key: str, raw_seq: int, click_id: str | None, customer_key: str
    ) -> str | None:
        if not self.claim_keys(program_id, [key], raw_seq):
            return None
        return sale_partner(self, program_id, click_id, customer_key)

    # (sale, refund_seen, ... : `KeyLookups`; the index's writer sees this batch's rows)
    def programs_for_stripe_account(self, account: str) -> list[Program]:
        return self._store.programs_for_stripe_account(account)  # the index holds this batch's changes

    def credential_used(self, token_hash: str) -> bool:
        row = self._cur.execute("SELECT 1 FROM credentials WHERE token_hash = ?", [token_hash]).fetchone()
        return row is not None

    def commit(self) -> None:
        """Make the batch durable: its rows in the journal, or, when control-plane changes are
        part of it (or there is no journal), its rows and those changes in one DuckDB commit,
        so a failure stores none of it. Raises `DatabaseUnavailable` on a resource fault."""
        batch = Batch(self._raw, self._logs, self._claims, self._checks)
        store = self._store
        try:
            if self._in_db_tx or store.copier.journal is None:
                store.copier.commit_with(self._sql(), batch)
                self._in_db_tx = False
            elif not batch.empty:
                store.copier.journal_batch(batch)
        except Exception as exc:
            if not not_the_data(exc):
                raise
            store._fault("write", exc)
            raise DatabaseUnavailable(UNAVAILABLE) from exc
        store._fault("write", None)
        store._commit_keys(self.keys, self._last)
        counts = store.ingested
        for row in batch.raw:
            key = (row[KIND], row[OUTCOME])
            counts[key] = counts.get(key, 0) + 1
        store._seq = self._next_seq - 1
        store._log_id = self._next_log - 1
        self.undo.clear()

    def rollback(self) -> None:
        self.keys.rollback()
        try:
            if self._in_db_tx:
                self._in_db_tx = False
                # (a failed COMMIT has already rolled the transaction back)
                with contextlib.suppress(duckdb.TransactionException):
                    self._cur.execute("ROLLBACK")
        finally:
            for step in reversed(self.undo):
                step()
            self.undo.clear()
