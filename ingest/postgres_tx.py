"""One group commit on PostgreSQL (`ingest.store.Tx`, on the writer's own connection).

Writes nobody reads the result of wait and go out with the next read that must see them (pipeline
mode); claims and the reads that decide go out at once and come back with the database's answer
(ingest/postgres_keys.py). The raw-log, tracking-log and claim rows are written at commit with
COPY, after the group takes its block of sequence numbers from `log_head` as its last statement,
so numbers follow commit order (ingest/postgres_store.py says why).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from ingest import postgres_keys as keys
from ingest.errors import DatabaseUnavailable, ValidationFailed
from ingest.postgres_conn import resource_fault
from ingest.postgres_control import BY_ACCOUNT, PROGRAM, program_row
from ingest.records import Binding, Credential, Partner, Program, Role, SaleLedger, credential_values
from ingest.schema import RAW_EVENT_FIELDS, storable
from ingest.store import Needs

if TYPE_CHECKING:
    from ingest.postgres_store import PgStore

Connection = psycopg.Connection[Any]

_KIND, _OUTCOME, _SEQ = (RAW_EVENT_FIELDS.index(n) for n in ("kind", "outcome", "seq"))
LOG_COLUMNS = (
    "log_id",
    "program_id",
    "logged_at",
    "endpoint",
    "status",
    "outcome",
    "detail",
    "request_id",
    "raw_seq",
)


class PgTx:
    """One group commit on the writer's connection (see `ingest.store.Tx`)."""

    def __init__(self, store: PgStore, con: Connection) -> None:
        self._store = store
        self._con = con
        self._cur = con.cursor()
        self._raw: list[list[Any]] = []
        self._logs: list[list[Any]] = []
        self._claims: list[list[Any]] = []  # (program_id, key, raw seq or stand-in): idempotency_keys
        self._checks: dict[tuple[str, str], datetime] = {}
        # Writes nobody reads the result of (key updates of appended rows, control-plane
        # changes) wait in `_pending` and go out with the next read, which must see them, in
        # one round trip (pipeline mode; COPY cannot run in it: `commit` leaves it first). An
        # operation whose writes have not gone out yet is dropped by forgetting them, with no
        # savepoint: every write is numbered, and `release` works while none of the operation's
        # has been sent.
        self._pending: list[tuple[int, bytes, Any]] = []
        self._numbered = 0  # writes numbered so far
        self._marked = 0  # the number at the latest mark: the operation running now wrote after it
        self._sent = 0  # the highest number sent to the database
        self._pipe: AbstractContextManager[psycopg.Pipeline] | None = con.pipeline()
        self._pipe.__enter__()

    def _leave_pipeline(self) -> None:
        """Send what is queued and leave pipeline mode (raising any error it met)."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.__exit__(None, None, None)

    # -- statements ------------------------------------------------------------------------
    def _write(self, sql: bytes, params: Any) -> None:
        self._numbered += 1
        self._pending.append((self._numbered, sql, params))

    def _read(self, upto: int | None = None) -> keys.Cursor:
        """The cursor, once the pending writes (those numbered up to `upto`, if given) are on
        their way (the read sees them)."""
        if self._pending:
            kept = []
            for number, sql, params in self._pending:
                if upto is not None and number > upto:
                    kept.append((number, sql, params))
                    continue
                self._cur.execute(sql, params)
                self._sent = number
            self._pending = kept
        return self._cur

    def prefetch(self, needs: Sequence[Needs]) -> None:
        """Nothing read ahead yet: each claim and lookup is its own statement."""

    def mark(self) -> tuple[int, int, int, int, dict[tuple[str, str], datetime]]:
        self._marked = self._numbered
        return (self._numbered, len(self._raw), len(self._logs), len(self._claims), dict(self._checks))

    def release(self, mark: tuple[int, int, int, int, dict[tuple[str, str], datetime]]) -> bool:
        """Drop the operation's writes since `mark`; False once one of them went out (the
        writer then replays the group one operation at a time)."""
        number, raw, logs, claims, checks = mark
        if self._sent > number:
            return False
        self._pending = [p for p in self._pending if p[0] <= number]
        del self._raw[raw:], self._logs[logs:], self._claims[claims:]
        self._checks = checks
        return True

    # -- lookups inside the transaction (they see its own writes) -----------------------------
    def sale(self, program_id: str, keys_: Sequence[str]) -> SaleLedger | None:
        return keys.sale(self._read(), program_id, keys_, lock=True)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        return keys.refund_seen(self._read(), program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        return keys.event_seen(self._read(), event_id)

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        return keys.click_partner(self._read(), program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        return keys.binding(self._read(), program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        return keys.provisional_click(self._read(), program_id, customer_key)

    def programs_for_stripe_account(self, account: str) -> list[Program]:
        cur = self._read()
        cur.execute(b"SELECT pg_advisory_xact_lock(hashtext('stripe_account:' || %s))", (account,))
        rows = cur.execute((PROGRAM + BY_ACCOUNT).encode(), (account,)).fetchall()
        return [program_row(r) for r in rows]

    def credential_used(self, token_hash: str) -> bool:
        sql = b"SELECT 1 FROM credentials WHERE token_hash = %s"
        return self._read().execute(sql, (token_hash,)).fetchone() is not None

    # -- the log -------------------------------------------------------------------------------
    def append(self, row: Mapping[str, Any]) -> int:
        """Buffer one raw row; its `seq` is handed out at commit, so this returns a stand-in
        (negative, unique in the transaction) that `log` and `claim_keys` accept."""
        full = dict(row)
        full.setdefault("test_mode", False)
        full["seq"] = 0
        problems = storable(full)
        if problems:
            raise ValidationFailed("the event holds values tally cannot store", fields=problems)
        stand_in = -(len(self._raw) + 1)
        values = [full.get(name) for name in RAW_EVENT_FIELDS]
        values[_SEQ] = stand_in
        self._raw.append(values)
        keys.observe(self._write, full)
        return stand_in

    def claim_keys(self, program_id: str, keys_: Sequence[str], raw_seq: int) -> list[str]:
        """Sent at once, ahead of pending writes (no one of them touches claims): a claim that
        takes nothing leaves the operation free to be dropped."""
        claimed = keys.claim(self._cur, program_id, list(dict.fromkeys(keys_)))
        if claimed:
            self._numbered += 1
            self._sent = self._numbered
        self._claims += [[program_id, key, raw_seq] for key in claimed]
        return claimed

    def claim_sale(
        self, program_id: str, transaction_id: str, raw_seq: int, click_id: str | None, customer_key: str
    ) -> str | None:
        """One statement: the claim and the partner lookup. Pending writes of earlier operations
        go out with it (a click or lead of this group is seen); this operation's own (its sale's
        ledger, which the lookup does not read) wait, so a refused claim leaves nothing sent."""
        partner = keys.claim_sale(
            self._read(upto=self._marked), program_id, transaction_id, click_id, customer_key
        )
        if partner is not None:
            self._numbered += 1
            self._sent = self._numbered
            self._claims.append([program_id, transaction_id, raw_seq])
        return partner

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
        self._logs.append([0, program_id, at, endpoint, status, outcome, detail, request_id, raw_seq])

    def check(self, program_id: str, step: str, at: datetime) -> None:
        self._checks.setdefault((program_id, step), at)

    # -- the control plane ----------------------------------------------------------------------
    def add_account(self, account_id: str, email: str, at: datetime) -> None:
        self._write(b"INSERT INTO accounts VALUES (%s, %s, %s)", (account_id, email, at))

    def add_workspace(self, workspace_id: str, name: str, at: datetime) -> None:
        self._write(b"INSERT INTO workspaces VALUES (%s, %s, %s)", (workspace_id, name, at))

    def add_member(self, workspace_id: str, account_id: str, role: Role, at: datetime) -> None:
        self._write(b"INSERT INTO memberships VALUES (%s, %s, %s, %s)", (workspace_id, account_id, role, at))

    def put_program(self, program: Program) -> None:
        self._write(
            b"INSERT INTO programs VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (program_id) DO UPDATE SET"
            b" workspace_id = EXCLUDED.workspace_id, name = EXCLUDED.name, settings = EXCLUDED.settings,"
            b" created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at",
            (
                program.program_id,
                program.workspace_id,
                program.name,
                program.settings.model_dump_json(),
                program.created_at,
                program.updated_at,
            ),
        )

    def add_partner(self, partner: Partner) -> None:
        self._write(
            b"INSERT INTO partners VALUES (%s, %s, %s, %s, %s, %s)",
            (
                partner.program_id,
                partner.code,
                partner.partner_id,
                partner.name,
                partner.email,
                partner.created_at,
            ),
        )

    def add_credential(self, cred: Credential) -> None:
        self._write(
            b"INSERT INTO credentials VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            credential_values(cred),
        )

    def revoke_credentials(self, kind: str, subject_id: str, at: datetime) -> None:
        self._write(
            b"UPDATE credentials SET revoked_at = %s"
            b" WHERE kind = %s AND subject_id = %s AND revoked_at IS NULL",
            (at, kind, subject_id),
        )

    def flag_credential(self, token_hash: str, flagged_at: datetime, deadline: datetime) -> None:
        self._write(
            b"UPDATE credentials SET flagged_at = %s, rotation_deadline = %s WHERE token_hash = %s",
            (flagged_at, deadline, token_hash),
        )

    # -- commit ----------------------------------------------------------------------------------
    def commit(self) -> None:
        """Write the buffered rows and commit: the group's seqs and log ids are taken from
        `log_head` last, so its lock is held only for the COPY and the commit itself."""
        cur = self._cur
        try:
            self._read()
            self._leave_pipeline()
            if self._checks:
                rows = [(p, s, at) for (p, s), at in self._checks.items()]
                cur.executemany(b"INSERT INTO checklist VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", rows)
            if self._raw or self._logs or self._claims:
                self._write_log(cur)
            self._con.commit()
        except Exception as exc:
            self._store._failed(self._con, exc)
            if resource_fault(exc):
                raise DatabaseUnavailable(
                    "tally cannot write to its database right now; nothing of this request was stored"
                ) from exc
            raise
        counts = self._store.ingested
        for row in self._raw:
            key = (row[_KIND], row[_OUTCOME])
            counts[key] = counts.get(key, 0) + 1

    def _write_log(self, cur: keys.Cursor) -> None:
        row = cur.execute(
            b"UPDATE log_head SET seq = seq + %s, log_id = log_id + %s WHERE id = 1 RETURNING seq, log_id",
            (len(self._raw), len(self._logs)),
        ).fetchone()
        assert row is not None, "log_head lost its row"
        first_seq = int(row[0]) - len(self._raw) + 1
        first_log = int(row[1]) - len(self._logs) + 1

        def real(seq: int | None) -> int | None:  # stand-in -k is the k-th raw row
            return first_seq - seq - 1 if seq is not None and seq < 0 else seq

        if self._raw:
            with cur.copy(f"COPY raw_events ({', '.join(RAW_EVENT_FIELDS)}) FROM STDIN".encode()) as copy:
                for values in self._raw:
                    values[_SEQ] = real(values[_SEQ])
                    copy.write_row(values)
        if self._logs:
            with cur.copy(f"COPY tracking_log ({', '.join(LOG_COLUMNS)}) FROM STDIN".encode()) as copy:
                for number, values in enumerate(self._logs):
                    values[0] = first_log + number
                    values[-1] = real(values[-1])
                    copy.write_row(values)
        if self._claims:
            with cur.copy(b"COPY idempotency_keys (program_id, key, raw_seq) FROM STDIN") as copy:
                for values in self._claims:
                    values[-1] = real(values[-1])
                    copy.write_row(values)

    def rollback(self) -> None:
        try:
            with contextlib.suppress(psycopg.Error):  # what it met is the reason for the rollback
                self._leave_pipeline()
            self._con.rollback()
        except psycopg.Error as exc:  # the connection broke: the next group opens another
            self._store._failed(self._con, exc)
