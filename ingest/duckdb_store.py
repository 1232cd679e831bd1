"""The embedded backend: one DuckDB file, owned by one process.

Writes happen only on the writer thread through `DuckTx`; raw-log, tracking-log, idempotency and
checklist rows are buffered per transaction and inserted in bulk (Arrow) at commit, which is what
makes group commit cheap. Hot-path lookups are answered from `Index`, kept exact because this
process is the only writer (see ingest/index.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ingest.index import Index, Undo
from ingest.journal import Journal
from ingest.records import (
    Binding,
    Credential,
    LogLine,
    Partner,
    Program,
    ProgramSettings,
    Role,
    SaleLedger,
)
from ingest.schema import CONTROL_PLANE_DDL, RAW_EVENT_COLUMNS, RAW_EVENT_FIELDS, raw_events_ddl

_ARROW_TYPES: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
}


def _schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    return pa.schema(
        [pa.field(name, _ARROW_TYPES[typ.split()[0]], "NOT NULL" not in typ) for name, typ in columns]
    )


RAW_SCHEMA = _schema(RAW_EVENT_COLUMNS)
LOG_SCHEMA = _schema(
    (
        ("log_id", "BIGINT NOT NULL"),
        ("program_id", "VARCHAR NOT NULL"),
        ("logged_at", "TIMESTAMPTZ NOT NULL"),
        ("endpoint", "VARCHAR NOT NULL"),
        ("status", "INTEGER NOT NULL"),
        ("outcome", "VARCHAR NOT NULL"),
        ("detail", "VARCHAR NOT NULL"),
        ("request_id", "VARCHAR"),
        ("raw_seq", "BIGINT"),
    )
)
KEY_SCHEMA = _schema(
    (
        ("program_id", "VARCHAR NOT NULL"),
        ("key", "VARCHAR NOT NULL"),
        ("raw_seq", "BIGINT NOT NULL"),
    )
)
CHECK_SCHEMA = _schema(
    (
        ("program_id", "VARCHAR NOT NULL"),
        ("step", "VARCHAR NOT NULL"),
        ("done_at", "TIMESTAMPTZ NOT NULL"),
    )
)

EVENT_KEY_SPACE = "*"  # program id under which processor event ids are kept


def _bulk_insert(
    cur: duckdb.DuckDBPyConnection, table: str, rows: list[tuple[Any, ...]], schema: pa.Schema
) -> None:
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    batch = pa.table(
        [pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
        schema=schema,
    )
    cur.register("_tally_batch", batch)
    try:
        cur.execute(f"INSERT INTO {table} SELECT * FROM _tally_batch")
    finally:
        cur.unregister("_tally_batch")


def _revive_rows(rows: list[list[Any]], schema: pa.Schema) -> list[tuple[Any, ...]]:
    """Journaled rows back to what was journaled: ISO strings in timestamp columns to datetimes."""
    stamps = [i for i, f in enumerate(schema) if pa.types.is_timestamp(f.type)]
    out = []
    for row in rows:
        for i in stamps:
            if isinstance(row[i], str):
                row[i] = datetime.fromisoformat(row[i])
        out.append(tuple(row))
    return out


def _json_set(raw: str) -> frozenset[str]:
    value = json.loads(raw)
    return frozenset(str(v) for v in value) if isinstance(value, list) else frozenset()


@dataclass
class _Batch:
    raw: list[tuple[Any, ...]]
    logs: list[tuple[Any, ...]]
    keys: list[tuple[Any, ...]]
    checks: list[tuple[Any, ...]]

    @property
    def empty(self) -> bool:
        return not (self.raw or self.logs or self.keys or self.checks)

    @property
    def rows(self) -> int:
        return len(self.raw) + len(self.logs) + len(self.keys) + len(self.checks)


class DuckTx:
    """A write transaction on the writer's cursor (see `ingest.store.Tx`)."""

    def __init__(self, store: DuckStore) -> None:
        self._store = store
        self._cur = store._writer_cursor()
        self._in_db_tx = False
        self.undo: Undo = []
        self._raw: list[tuple[Any, ...]] = []
        self._logs: list[tuple[Any, ...]] = []
        self._keys: list[tuple[Any, ...]] = []
        self._checks: list[tuple[Any, ...]] = []
        self._next_seq = store._seq + 1
        self._next_log = store._log_id + 1

    @property
    def index(self) -> Index:
        return self._store.index

    def _sql(self) -> duckdb.DuckDBPyConnection:
        """The writer's cursor inside a database transaction, begun on first use: batches of
        track calls never open one (they go to the journal); control-plane changes do."""
        if not self._in_db_tx:
            self._cur.execute("BEGIN TRANSACTION")
            self._in_db_tx = True
        return self._cur

    def append(self, row: Mapping[str, Any]) -> int:
        seq = self._next_seq
        self._next_seq += 1
        full = dict(row)
        full["seq"] = seq
        full.setdefault("test_mode", False)
        self._raw.append(tuple(map(full.get, RAW_EVENT_FIELDS)))
        self.index.observe(full, self.undo)
        return seq

    def claim_keys(self, program_id: str, keys: Sequence[str], raw_seq: int) -> None:
        for key in keys:
            if self.index.claim(program_id, key, self.undo):
                self._keys.append((program_id, key, raw_seq))

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
            "INSERT OR REPLACE INTO programs VALUES (?, ?, ?, ?, ?, ?)",
            [
                program.program_id,
                program.workspace_id,
                program.name,
                program.settings.model_dump_json(),
                program.created_at,
                program.updated_at,
            ],
        )
        self.index.put_program(program, self.undo)

    def add_partner(self, partner: Partner) -> None:
        self._sql().execute(
            "INSERT INTO partners VALUES (?, ?, ?, ?, ?, ?)",
            [
                partner.program_id,
                partner.code,
                partner.partner_id,
                partner.name,
                partner.email,
                partner.created_at,
            ],
        )
        self.index.put_partner(partner, self.undo)

    def add_credential(self, cred: Credential) -> None:
        self._sql().execute(
            "INSERT INTO credentials VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                cred.token_hash,
                cred.kind,
                cred.subject_id,
                cred.masked,
                json.dumps(sorted(cred.scopes)),
                json.dumps(sorted(cred.workspace_ids)),
                cred.name,
                cred.created_at,
                cred.revoked_at,
                cred.flagged_at,
                cred.rotation_deadline,
            ],
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

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._sql().execute(sql, list(params))

    @property
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """The writer's cursor in this transaction (for bulk writes such as materialised tables)."""
        return self._sql()

    def commit(self) -> None:
        """Commit control-plane changes (if any) to DuckDB, then make the batch's rows durable in
        the journal (or, without one, in DuckDB directly)."""
        batch = _Batch(self._raw, self._logs, self._keys, self._checks)
        store = self._store
        if store._journal is None:
            store._pending.append(batch)
            store._copy_pending(self._sql(), store._pending)
            store._pending.clear()
        if self._in_db_tx:
            self._cur.execute("COMMIT")
            self._in_db_tx = False
        if store._journal is not None and not batch.empty:
            store._journal_batch(batch)
        store._seq = self._next_seq - 1
        store._log_id = self._next_log - 1
        self.undo.clear()

    def rollback(self) -> None:
        try:
            if self._in_db_tx:
                self._cur.execute("ROLLBACK")
                self._in_db_tx = False
        finally:
            for step in reversed(self.undo):
                step()
            self.undo.clear()


class DuckStore:
    """The embedded DuckDB backend of `ingest.store.Store`."""

    def __init__(self, path: str | Path) -> None:
        target = Path(path)
        if str(path) != ":memory:":
            target.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(path))
        # TIMESTAMPTZ values come back as aware datetimes in UTC, whatever the machine's zone.
        self._con.execute("SET GLOBAL TimeZone = 'UTC'")
        self._local = threading.local()
        self._wcur: duckdb.DuckDBPyConnection | None = None
        self._con.execute(raw_events_ddl())
        for ddl in CONTROL_PLANE_DDL:
            self._con.execute(ddl)
        self._con.execute("CREATE TABLE IF NOT EXISTS journal_state (last_batch BIGINT NOT NULL)")
        if self._con.execute("SELECT count(*) FROM journal_state").fetchone() == (0,):
            self._con.execute("INSERT INTO journal_state VALUES (0)")
        self.index = Index()
        self._seq = 0
        self._log_id = 0
        self._pending: list[_Batch] = []
        self._pending_rows = 0
        self._pending_since = 0.0
        self._journal: Journal | None = None
        self._lock = threading.Lock()  # pending batches and the journal's current segment
        self._copy_lock = threading.Lock()  # one copy into DuckDB at a time
        self._ccur: duckdb.DuckDBPyConnection | None = None
        row = self._con.execute("SELECT last_batch FROM journal_state").fetchone()
        self._batch_no = int(row[0]) if row else 0
        if str(path) != ":memory:":
            self._journal = Journal(Path(f"{path}.journal"))
            self._recover()
        self._load()

    # -- the journal: durable group commits, copied into DuckDB in bulk ------------------------
    def _recover(self) -> None:
        assert self._journal is not None
        done = self._batch_no
        for record in self._journal.records():
            number = int(record["batch"])
            self._batch_no = max(self._batch_no, number)
            if number > done:
                parts = (
                    _revive_rows(record[part], schema)
                    for part, schema in (
                        ("raw", RAW_SCHEMA),
                        ("logs", LOG_SCHEMA),
                        ("keys", KEY_SCHEMA),
                        ("checks", CHECK_SCHEMA),
                    )
                )
                self._pending.append(_Batch(*parts))
        self.flush()

    def _journal_batch(self, batch: _Batch) -> None:
        assert self._journal is not None
        with self._lock:
            self._batch_no += 1
            self._journal.append(
                {
                    "batch": self._batch_no,
                    "raw": batch.raw,
                    "logs": batch.logs,
                    "keys": batch.keys,
                    "checks": batch.checks,
                }
            )
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(batch)
            self._pending_rows += batch.rows

    def _copy_pending(self, cur: duckdb.DuckDBPyConnection, batches: list[_Batch]) -> None:
        """Insert `batches` inside the caller's open transaction."""
        for table, part, schema in (
            ("raw_events", "raw", RAW_SCHEMA),
            ("tracking_log", "logs", LOG_SCHEMA),
            ("idempotency_keys", "keys", KEY_SCHEMA),
            ("checklist", "checks", CHECK_SCHEMA),
        ):
            rows = [row for batch in batches for row in getattr(batch, part)]
            _bulk_insert(cur, table, rows, schema)

    def flush(self) -> None:
        """Copy every journaled batch into DuckDB, then drop the journal segments that held them.
        Safe from any thread; the writer keeps journaling new batches meanwhile."""
        with self._copy_lock:
            with self._lock:
                if not self._pending:
                    return
                batches, self._pending = self._pending, []
                self._pending_rows = 0
                last = self._batch_no
                closed = self._journal.rotate() if self._journal is not None else []
            cur = self._copier_cursor()
            try:
                cur.execute("BEGIN TRANSACTION")
                self._copy_pending(cur, batches)
                cur.execute("UPDATE journal_state SET last_batch = ?", [last])
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                with self._lock:  # keep them for the next attempt, oldest first
                    self._pending[:0] = batches
                    self._pending_rows += sum(b.rows for b in batches)
                raise
            if self._journal is not None:
                self._journal.remove(closed)

    def backlog(self) -> tuple[int, float]:
        """Rows journaled but not yet in DuckDB, and for how many seconds the oldest has waited."""
        with self._lock:
            if not self._pending:
                return 0, 0.0
            return self._pending_rows, time.monotonic() - self._pending_since

    # -- connections -------------------------------------------------------------------------
    def _reader(self) -> duckdb.DuckDBPyConnection:
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cur = cur
        return cur

    def _writer_cursor(self) -> duckdb.DuckDBPyConnection:
        if self._wcur is None:
            self._wcur = self._con.cursor()
        return self._wcur

    def _copier_cursor(self) -> duckdb.DuckDBPyConnection:
        if self._ccur is None:
            self._ccur = self._con.cursor()
        return self._ccur

    @contextmanager
    def snapshot(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh cursor for a long read (reconcile, reports); closed afterwards."""
        cur = self._con.cursor()
        try:
            yield cur
        finally:
            cur.close()

    def begin(self) -> DuckTx:
        return DuckTx(self)

    def close(self) -> None:
        self.flush()
        if self._journal is not None:
            self._journal.close()
        self._con.close()

    # -- start-up: rebuild the index from the database --------------------------------------
    def _load(self) -> None:
        con = self._con
        row = con.execute("SELECT coalesce(max(seq), 0) FROM raw_events").fetchone()
        self._seq = int(row[0]) if row else 0
        row = con.execute("SELECT coalesce(max(log_id), 0) FROM tracking_log").fetchone()
        self._log_id = int(row[0]) if row else 0
        undo: Undo = []
        idx = self.index
        for r in con.execute(
            "SELECT token_hash, kind, subject_id, masked, scopes, workspace_ids, name, created_at,"
            " flagged_at, rotation_deadline FROM credentials WHERE revoked_at IS NULL"
        ).fetchall():
            idx.put_credential(
                Credential(
                    token_hash=r[0],
                    kind=r[1],
                    subject_id=r[2],
                    masked=r[3],
                    scopes=_json_set(r[4]),
                    workspace_ids=_json_set(r[5]),
                    name=r[6],
                    created_at=r[7],
                    flagged_at=r[8],
                    rotation_deadline=r[9],
                ),
                undo,
            )
        for r in con.execute("SELECT * FROM programs").fetchall():
            idx.put_program(
                Program(r[0], r[1], r[2], ProgramSettings.model_validate_json(r[3]), r[4], r[5]),
                undo,
            )
        for r in con.execute(
            "SELECT program_id, code, partner_id, name, email, created_at FROM partners"
        ).fetchall():
            idx.put_partner(Partner(r[2], r[0], r[1], r[3], r[4], r[5]), undo)
        for r in con.execute("SELECT workspace_id, account_id, role FROM memberships").fetchall():
            idx.put_role(r[0], r[1], r[2], undo)
        for r in con.execute("SELECT program_id, step, done_at FROM checklist").fetchall():
            idx.put_checklist(r[0], r[1], r[2], undo)
        cur = con.execute("SELECT program_id, key FROM idempotency_keys")
        while keys := cur.fetchmany(100_000):
            idx.keys.update(keys)
        wanted = (
            "kind",
            "program_id",
            "outcome",
            "event_id",
            "event_type",
            "test_mode",
            "transaction_id",
            "invoice_id",
            "payment_intent_id",
            "checkout_session_id",
            "charge_id",
            "customer_key",
            "click_id",
            "partner_code",
            "amount",
            "currency",
            "refund_id",
            "lead_status",
        )
        cur = con.execute(
            f"SELECT {', '.join(wanted)} FROM raw_events WHERE outcome <> 'duplicate' AND kind IN"
            " ('click', 'lead', 'sale', 'refund', 'stripe') ORDER BY seq"
        )
        while chunk := cur.fetchmany(50_000):
            for values in chunk:
                idx.observe(dict(zip(wanted, values, strict=True)), undo)

    # -- reads ---------------------------------------------------------------------------------
    def credential(self, token_hash: str) -> Credential | None:
        return self.index.credentials.get(token_hash)

    def program_credential(self, program_id: str) -> Credential | None:
        for cred in self.index.credentials.values():
            if cred.kind == "program" and cred.subject_id == program_id:
                return cred
        return None

    def program(self, program_id: str) -> Program | None:
        return self.index.programs.get(program_id)

    def programs_in(self, workspace_ids: Sequence[str]) -> list[Program]:
        wanted = set(workspace_ids)
        return sorted(
            (p for p in self.index.programs.values() if p.workspace_id in wanted),
            key=lambda p: (p.created_at, p.program_id),
        )

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        return sorted(
            (p for p in self.index.programs.values() if p.settings.stripe_account_id == account),
            key=lambda p: (p.created_at, p.program_id),
        )

    def role(self, workspace_id: str, account_id: str) -> Role | None:
        return self.index.roles.get((workspace_id, account_id))

    def workspaces_of(self, account_id: str) -> dict[str, Role]:
        return {ws: role for (ws, acct), role in self.index.roles.items() if acct == account_id}

    def workspace_exists(self, workspace_id: str) -> bool:
        return any(ws == workspace_id for ws, _ in self.index.roles)

    def partner(self, program_id: str, code: str) -> Partner | None:
        return self.index.partners.get((program_id, code))

    def partners(self, program_id: str) -> list[Partner]:
        return sorted(
            (p for (pid, _), p in self.index.partners.items() if pid == program_id),
            key=lambda p: p.code,
        )

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        return self.index.clicks.get((program_id, click_id))

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        return self.index.bindings.get((program_id, customer_key))

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        key = (program_id, customer_key)
        if key in self.index.provisional:
            return True, self.index.provisional[key]
        return False, None

    def sale(self, program_id: str, keys: Sequence[str]) -> SaleLedger | None:
        return self.index.sale_for(program_id, list(keys))

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return (program_id, refund_id) in self.index.refunds

    def event_seen(self, event_id: str) -> bool:
        return event_id in self.index.events

    def checklist(self, program_id: str) -> dict[str, datetime]:
        return {step: at for (pid, step), at in self.index.checklist.items() if pid == program_id}

    def tracking_log(self, program_id: str, limit: int, before: int | None = None) -> list[LogLine]:
        sql = "SELECT * FROM tracking_log WHERE program_id = ?"
        params: list[Any] = [program_id]
        if before is not None:
            sql += " AND log_id < ?"
            params.append(before)
        sql += " ORDER BY log_id DESC LIMIT ?"
        params.append(limit)
        return [LogLine(*r) for r in self._reader().execute(sql, params).fetchall()]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._reader().execute(sql, list(params)).fetchall()
