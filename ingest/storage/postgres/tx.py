"""One group commit on PostgreSQL (`Tx` of ingest/storage/contract.py, on the writer's own
connection).

A group commit is two round trips in pipeline mode. The first (`prefetch`) begins the
transaction, reads the program keys its operations were let in with, claims their idempotency
keys ahead and reads what they will look up, one statement per table. The operations then run in
Python against that. Writes nobody reads the result of wait, and go out with the next read that
must see them (a lookup the prefetch could not answer) or at commit; a claim or lookup not read
ahead goes out at once (ingest/storage/postgres/keys.py). The second round trip (`commit`) sends the
remaining writes, takes the group's block of sequence numbers from `log_head`, inserts the
raw-log, tracking-log and claim rows (as JSON documents, a statement per table) and commits, so
numbers follow commit order (ingest/storage/postgres/store.py says why). Each statement and each wait
hands the interpreter lock to the event loop and back: a group that took eleven round trips and
a statement per write per operation spent most of its time there.

Why one module of about 600 lines: every statement of a group (prefetch, lookups, claims, queued
writes, the log rows inserted at commit) is numbered in one sequence that `mark` and `release`
rely on; the parts cannot be read or changed apart.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
import psycopg

from ingest.domain import keys as rule
from ingest.domain.errors import DatabaseUnavailable, ValidationFailed
from ingest.domain.keys import effects
from ingest.domain.records import (
    Binding,
    Credential,
    Partner,
    Program,
    Role,
    SaleLedger,
    credential_values,
    partner_values,
    program_values,
)
from ingest.storage.contract import KeyRead, Needs, ProgramKey, gather, sale_partner
from ingest.storage.postgres import keys
from ingest.storage.postgres.conn import resource_fault
from ingest.storage.postgres.control import (
    BY_ACCOUNT,
    CREDENTIALS_AND_PROGRAMS,
    PROGRAM,
    credential_row,
    program_row,
)
from ingest.storage.schema import RAW_EVENT_FIELDS, storable

if TYPE_CHECKING:
    from ingest.storage.postgres.store import PgStore

Connection = psycopg.Connection[Any]

_KIND, _OUTCOME, _SEQ, _BODY, _HEADERS = (
    RAW_EVENT_FIELDS.index(n) for n in ("kind", "outcome", "seq", "body", "headers")
)
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


# The log rows of a group, as JSON documents (a row per object, by column name): `%s` the group's
# raw rows (n), then for tracking-log lines their count (m), then the document. The block's start
# is `log_head` as this transaction just moved it, less n (or m).
_HEAD = "(SELECT seq - %(n)s AS seq0, log_id AS log1 FROM log_head WHERE id = 1) AS h"
_RAW_SEQ = "CASE WHEN j.raw_seq < 0 THEN h.seq0 - j.raw_seq ELSE j.raw_seq END"
_INSERT_RAW = (
    f"INSERT INTO raw_events ({', '.join(RAW_EVENT_FIELDS)}) SELECT "
    + ", ".join("h.seq0 + j.seq" if n == "seq" else f"j.{n}" for n in RAW_EVENT_FIELDS)
    + f" FROM {_HEAD}, json_populate_recordset(NULL::raw_events, %(doc)s::json) AS j"
).encode()
_INSERT_LOGS = (
    f"INSERT INTO tracking_log ({', '.join(LOG_COLUMNS)}) SELECT "
    + ", ".join(
        "h.log1 - %(m)s + j.log_id" if n == "log_id" else _RAW_SEQ if n == "raw_seq" else f"j.{n}"
        for n in LOG_COLUMNS
    )
    + f" FROM {_HEAD}, json_populate_recordset(NULL::tracking_log, %(doc)s::json) AS j"
).encode()
_INSERT_CLAIMS = (
    f"INSERT INTO idempotency_keys (program_id, key, raw_seq) SELECT j.program_id, j.key, {_RAW_SEQ}"
    f" FROM {_HEAD}, json_populate_recordset(NULL::idempotency_keys, %(doc)s::json) AS j"
).encode()
CHUNK_BYTES = 8 << 20  # at most this much JSON in one statement (bodies reach 1 MiB each)


def _chunks(rows: list[list[Any]]) -> Iterator[tuple[int, list[list[Any]]]]:
    """Raw rows in runs of about `CHUNK_BYTES` of body and headers (the columns that grow),
    with each run's offset."""
    start, size = 0, 0
    for i, row in enumerate(rows):
        size += len(row[_BODY] or "") + len(row[_HEADERS] or "") + 512
        if size > CHUNK_BYTES and i > start:
            yield start, rows[start:i]
            start, size = i, 0
    if start < len(rows):
        yield start, rows[start:]


def _json(columns: Sequence[str], rows: list[list[Any]]) -> str:
    return orjson.dumps([dict(zip(columns, row, strict=True)) for row in rows]).decode()


Mark = tuple[int, int, int, int, dict[tuple[str, str], datetime], int]
_UNKNOWN: Any = object()  # not read ahead (or touched since): the database answers

# What `prefetch` reads ahead, one statement per table: the keys as parallel arrays, the rows
# back as (key columns..., value columns...), and how a value becomes the lookup's answer.
# Each key is looked up on its own (LATERAL ... LIMIT 1: the planner cannot turn the lookups into a
# join, so a plan made while a table was small, which a prepared statement keeps, still uses its
# primary key when the table has grown; a hash join over a sequential scan took 4 ms at 10k rows).
_LOOKUP_SQL: dict[str, bytes] = {
    "clicks": b"SELECT w.p, w.k, x.partner_code FROM unnest(%s::varchar[], %s::varchar[]) AS w(p, k)"
    b" CROSS JOIN LATERAL (SELECT partner_code FROM key_clicks"
    b" WHERE program_id = w.p AND click_id = w.k LIMIT 1) x",
    "bindings": b"SELECT w.p, w.k, x.lead_event_id, x.click_id, x.partner_code"
    b" FROM unnest(%s::varchar[], %s::varchar[]) AS w(p, k)"
    b" CROSS JOIN LATERAL (SELECT lead_event_id, click_id, partner_code FROM key_bindings"
    b" WHERE program_id = w.p AND customer = w.k LIMIT 1) x",
    "provisional": b"SELECT w.p, w.k, x.click_id FROM unnest(%s::varchar[], %s::varchar[]) AS w(p, k)"
    b" CROSS JOIN LATERAL (SELECT click_id FROM key_provisional"
    b" WHERE program_id = w.p AND customer = w.k LIMIT 1) x",
    "refunds": b"SELECT w.p, w.k FROM unnest(%s::varchar[], %s::varchar[]) AS w(p, k)"
    b" CROSS JOIN LATERAL (SELECT 1 FROM key_refunds"
    b" WHERE program_id = w.p AND refund_id = w.k LIMIT 1) x",
    "events": b"SELECT w.k FROM unnest(%s::varchar[]) AS w(k)"
    b" CROSS JOIN LATERAL (SELECT 1 FROM key_events WHERE event_id = w.k LIMIT 1) x",
    "sales": b"SELECT w.p, w.k, x.amount, x.currency, x.refunded"
    b" FROM unnest(%s::varchar[], %s::varchar[]) AS w(p, k)"
    b" CROSS JOIN LATERAL (SELECT l.amount, l.currency, l.refunded FROM key_sales s"
    b" JOIN key_ledgers l ON l.id = s.ledger WHERE s.program_id = w.p AND s.key = w.k"
    b" LIMIT 1 FOR UPDATE OF l) x",
}
_LOOKED_UP = tuple(_LOOKUP_SQL)
_LOOKUP_ROW: dict[str, Callable[[Sequence[Any]], Any]] = {
    "clicks": lambda v: str(v[0]),
    "bindings": lambda v: Binding(v[0], v[1], v[2]),
    "provisional": lambda v: v[0],
    "refunds": lambda v: True,
    "events": lambda v: True,
    "sales": lambda v: SaleLedger(v[0], v[1], int(v[2])),
}


class PgTx:
    """One group commit on the writer's connection (see `ingest.storage.contract.Tx`)."""

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
        self._begun = False  # BEGIN sent (an autocommit connection: the transaction is ours to delimit)
        # What `prefetch` read for the group's operations: the program keys as they are now;
        # the keys it claimed ahead (True while no operation took it: released at commit) or
        # found taken; and lookups (name -> key -> row or None). A lookup of a key this group's
        # own writes touched (`_touched`) goes to the database instead, after those writes.
        self._fresh_keys: dict[str, KeyRead | None] = {}
        self._ahead: dict[ProgramKey, bool] = {}
        self._taken: list[ProgramKey] = []
        self._refused: set[ProgramKey] = set()
        self._known: dict[str, dict[Any, Any]] = {name: {} for name in _LOOKED_UP}
        self._touched: dict[str, set[Any]] = {name: set() for name in _LOOKED_UP}
        self._control = False  # a control-plane write: the replica's cached keys are dropped at commit

    def _leave_pipeline(self) -> None:
        """Send what is queued and leave pipeline mode (raising any error it met)."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.__exit__(None, None, None)

    # -- statements ------------------------------------------------------------------------
    def _write(self, sql: bytes, params: Any) -> None:
        self._numbered += 1
        self._pending.append((self._numbered, sql, params))

    def _begin(self) -> None:
        """Open the transaction before the first statement goes out (never in `__init__`: a
        database that went away fails the group's first statement, which the writer handles)."""
        if not self._begun:
            self._cur.execute(b"BEGIN")
            self._begun = True

    def _read(self, upto: int | None = None) -> keys.Cursor:
        """The cursor, once the pending writes (those numbered up to `upto`, if given) are on
        their way (the read sees them)."""
        self._begin()
        if self._pending:
            kept = []
            sales: list[Any] = []  # consecutive track sales' ledgers: one statement
            for number, sql, params in self._pending:
                if upto is not None and number > upto:
                    kept.append((number, sql, params))
                    continue
                if sql is keys.ONE_SALE:
                    sales.append(params)
                else:
                    if sales:
                        self._cur.execute(*keys.sales(sales))
                        sales = []
                    self._cur.execute(sql, params)
                self._sent = number
            if sales:
                self._cur.execute(*keys.sales(sales))
            self._pending = kept
        return self._cur

    def prefetch(self, needs: Sequence[Needs]) -> None:
        """One round trip for the group (pipeline mode): the program keys its operations were
        let in with, as they are now; its claims, taken ahead in one statement (in key order,
        so two replicas' groups never wait on each other in opposite orders); and its lookups,
        one statement per table. Sale ledgers are read `FOR UPDATE` (as `sale` reads them)."""
        con = self._con
        self._begin()
        hashes = list(dict.fromkeys(n.key[0].token_hash for n in needs if n.key is not None))
        wanted = gather(needs)
        claims = sorted(set(wanted["claims"]))
        pending: list[tuple[str, psycopg.Cursor[Any], list[Any]]] = []
        if hashes:
            cur = con.cursor()
            cur.execute(CREDENTIALS_AND_PROGRAMS.encode(), (hashes,))
            pending.append(("keys", cur, hashes))
        if claims:
            cur = con.cursor()
            cur.execute(
                b"INSERT INTO key_claims (program_id, key)"
                b" SELECT * FROM unnest(%s::varchar[], %s::varchar[]) ON CONFLICT DO NOTHING"
                b" RETURNING program_id, key",
                ([p for p, _ in claims], [k for _, k in claims]),
            )
            pending.append(("claims", cur, claims))
        for name, sql in _LOOKUP_SQL.items():
            todo = list(dict.fromkeys(wanted[name]))
            if todo:
                cur = con.cursor()
                cur.execute(sql, tuple(list(column) for column in zip(*todo, strict=True)))
                pending.append((name, cur, todo))
        for name, cur, asked in pending:
            rows = cur.fetchall()
            if name == "keys":
                self._fresh_keys = dict.fromkeys(asked)
                for r in rows:
                    program = program_row(r[11:]) if r[11] is not None else None
                    self._fresh_keys[r[0]] = (credential_row(r[:11]), program)
            elif name == "claims":
                won = {(str(r[0]), str(r[1])) for r in rows}
                self._ahead = {c: True for c in asked if c in won}
                self._refused = {c for c in asked if c not in won}
            else:
                known = self._known[name]
                known.update(dict.fromkeys(asked))
                width = 1 if name == "events" else 2
                for r in rows:
                    known[tuple(r[:width])] = _LOOKUP_ROW[name](r[width:])

    def outdated(self, needs: Needs) -> bool:
        if needs.key is None:
            return False
        cred, program = needs.key
        if cred.token_hash not in self._fresh_keys:
            return False
        fresh = self._fresh_keys[cred.token_hash]
        if fresh == (cred, program):
            return False
        self._store.key_changed(cred.token_hash, fresh)
        return True

    def _lookup(self, name: str, key: Any) -> Any:
        """A prefetched answer for `key`, or `_UNKNOWN` (then the database answers)."""
        if key in self._touched[name]:
            return _UNKNOWN
        return self._known[name].get(key, _UNKNOWN)

    def _touch(self, changes: Sequence[rule.Effect]) -> None:
        """The lookups an appended row's key writes may change: answered by the database from now
        on in this group (after those writes)."""
        touched = self._touched
        for effect in changes:
            match effect:
                case rule.SeeEvent(event_id):
                    touched["events"].add((event_id,))
                case rule.PutClick(program_id, click_id, _):
                    touched["clicks"].add((program_id, click_id))
                case rule.Bind(program_id, customer, _, _) | rule.Provisional(program_id, customer, _):
                    touched["bindings"].add((program_id, customer))
                    touched["provisional"].add((program_id, customer))
                case rule.SeeRefund(program_id, refund_id):
                    touched["refunds"].add((program_id, refund_id))
                case rule.AddRefunded(program_id, key, _):
                    touched["sales"].add((program_id, key))
                case rule.Sale(program_id, ids, _, _):
                    touched["sales"].update((program_id, k) for k in ids)
                case rule.ProcessorRefund() | rule.Link():
                    # a processor refund or a link may change the ledger of ids it does not name
                    self._known["sales"].clear()

    def mark(self) -> Mark:
        self._marked = self._numbered
        return (
            self._numbered,
            len(self._raw),
            len(self._logs),
            len(self._claims),
            dict(self._checks),
            len(self._taken),
        )

    def release(self, mark: Mark) -> bool:
        """Drop the operation's writes since `mark` (claims taken ahead go back to the group);
        False once one of them went out (the writer then replays the group one operation at a
        time)."""
        number, raw, logs, claims, checks, taken = mark
        if self._sent > number:
            return False
        self._pending = [p for p in self._pending if p[0] <= number]
        del self._raw[raw:], self._logs[logs:], self._claims[claims:]
        self._checks = checks
        while len(self._taken) > taken:
            self._ahead[self._taken.pop()] = True
        return True

    # -- lookups inside the transaction (they see its own writes) -----------------------------
    def sale(self, program_id: str, keys_: Sequence[str]) -> SaleLedger | None:
        if len(keys_) == 1 and (known := self._lookup("sales", (program_id, keys_[0]))) is not _UNKNOWN:
            return copy.copy(known)  # type: ignore[no-any-return]
        return keys.sale(self._read(), program_id, keys_, lock=True)

    def refund_seen(self, program_id: str, refund_id: str) -> bool:
        if (known := self._lookup("refunds", (program_id, refund_id))) is not _UNKNOWN:
            return known is not None
        return keys.refund_seen(self._read(), program_id, refund_id)

    def event_seen(self, event_id: str) -> bool:
        if (known := self._lookup("events", (event_id,))) is not _UNKNOWN:
            return known is not None
        return keys.event_seen(self._read(), event_id)

    def click_partner(self, program_id: str, click_id: str) -> str | None:
        if (known := self._lookup("clicks", (program_id, click_id))) is not _UNKNOWN:
            return known  # type: ignore[no-any-return]
        return keys.click_partner(self._read(), program_id, click_id)

    def binding(self, program_id: str, customer_key: str) -> Binding | None:
        if (known := self._lookup("bindings", (program_id, customer_key))) is not _UNKNOWN:
            return known  # type: ignore[no-any-return]
        return keys.binding(self._read(), program_id, customer_key)

    def provisional_click(self, program_id: str, customer_key: str) -> tuple[bool, str | None]:
        if (known := self._lookup("provisional", (program_id, customer_key))) is not _UNKNOWN:
            return (False, None) if known is None else (True, known)
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
        changes = effects(full)
        for effect in changes:
            keys.apply(self._write, effect)
        self._touch(changes)
        return stand_in

    def _take(self, key: ProgramKey) -> bool | None:
        """A claim decided by `prefetch`: True when it claimed `key` for the group and no
        operation took it yet (this one does now), False when taken, None when not claimed ahead."""
        if self._ahead.get(key):
            self._ahead[key] = False
            self._taken.append(key)
            return True
        if key in self._ahead or key in self._refused:
            return False
        return None

    def claim_keys(self, program_id: str, keys_: Sequence[str], raw_seq: int) -> list[str]:
        """Claims taken ahead by `prefetch` are handed out here; the others are sent at once,
        ahead of pending writes (no one of them touches claims): a claim that takes nothing
        leaves the operation free to be dropped."""
        wanted = list(dict.fromkeys(keys_))
        decided = {key: self._take((program_id, key)) for key in wanted}
        rest = [key for key in wanted if decided[key] is None]
        if rest:
            self._begin()
        won = set(keys.claim(self._cur, program_id, rest)) if rest else set()
        if won:
            self._numbered += 1
            self._sent = self._numbered
        claimed = [key for key in wanted if decided[key] or key in won]
        self._claims += [[program_id, key, raw_seq] for key in claimed]
        return claimed

    def claim_sale(
        self, program_id: str, key: str, raw_seq: int, click_id: str | None, customer_key: str
    ) -> str | None:
        """One statement: the claim and the partner lookup. Pending writes of earlier operations
        go out with it (a click or lead of this group is seen); this operation's own (its sale's
        ledger, which the lookup does not read) wait, so a refused claim leaves nothing sent."""
        taken = self._take((program_id, key))
        if taken is not None:  # claimed ahead: the partner from what the group read
            if not taken:
                return None
            self._claims.append([program_id, key, raw_seq])
            return sale_partner(self, program_id, click_id, customer_key)
        partner = keys.claim_sale(self._read(upto=self._marked), program_id, key, click_id, customer_key)
        if partner is not None:
            self._numbered += 1
            self._sent = self._numbered
            self._claims.append([program_id, key, raw_seq])
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
        self._control = True
        self._write(
            b"INSERT INTO programs VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (program_id) DO UPDATE SET"
            b" workspace_id = EXCLUDED.workspace_id, name = EXCLUDED.name, settings = EXCLUDED.settings,"
            b" created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at",
            program_values(program),
        )

    def add_partner(self, partner: Partner) -> None:
        self._write(b"INSERT INTO partners VALUES (%s, %s, %s, %s, %s, %s)", partner_values(partner))

    def add_credential(self, cred: Credential) -> None:
        self._control = True
        self._write(
            b"INSERT INTO credentials VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            credential_values(cred),
        )

    def revoke_credentials(self, kind: str, subject_id: str, at: datetime) -> None:
        self._control = True
        self._write(
            b"UPDATE credentials SET revoked_at = %s"
            b" WHERE kind = %s AND subject_id = %s AND revoked_at IS NULL",
            (at, kind, subject_id),
        )

    def flag_credential(self, token_hash: str, flagged_at: datetime, deadline: datetime) -> None:
        self._control = True
        self._write(
            b"UPDATE credentials SET flagged_at = %s, rotation_deadline = %s WHERE token_hash = %s",
            (flagged_at, deadline, token_hash),
        )

    # -- commit ----------------------------------------------------------------------------------
    def commit(self) -> None:
        """Send the remaining writes, the group's log rows and COMMIT in one round trip: the
        group's seqs and log ids are taken from `log_head` after every other write, so its lock
        is held only for the log rows and the commit itself."""
        unused = [key for key, free in self._ahead.items() if free]
        if unused:  # claimed ahead for operations that did not take them: free for others again
            self._write(
                b"DELETE FROM key_claims WHERE (program_id, key) IN"
                b" (SELECT * FROM unnest(%s::varchar[], %s::varchar[]))",
                ([p for p, _ in unused], [k for _, k in unused]),
            )
        if self._checks:
            rows = list(self._checks.items())
            self._write(
                b"INSERT INTO checklist SELECT * FROM unnest(%s::varchar[], %s::varchar[], %s::timestamptz[])"
                b" ON CONFLICT DO NOTHING",
                ([p for (p, _), _ in rows], [s for (_, s), _ in rows], [at for _, at in rows]),
            )
        if self._raw or self._logs or self._claims:
            self._write_log()
        if not self._begun and not self._pending:  # nothing was read or written: nothing to commit
            self._leave_pipeline()
            return
        self._write(b"COMMIT", None)
        try:
            self._read()
            self._leave_pipeline()
        except Exception as exc:
            if self._control:
                self._store.forget_keys()
            self._store._failed(self._con, exc)
            if resource_fault(exc):
                raise DatabaseUnavailable(
                    "tally cannot write to its database right now; nothing of this request was stored"
                ) from exc
            raise
        if self._control:
            self._store.forget_keys()
        counts = self._store.ingested
        for row in self._raw:
            key = (row[_KIND], row[_OUTCOME])
            counts[key] = counts.get(key, 0) + 1

    def _write_log(self) -> None:
        """The group's block of seqs and log ids (`log_head`), then its raw-log, tracking-log and
        claim rows. Rows carry their place in the group (seq and log id k: the k-th of the
        group; a raw seq -k: the k-th raw row), and each statement adds the block's start, read
        back from the `log_head` row this transaction just updated."""
        raws, logs = len(self._raw), len(self._logs)
        self._write(b"UPDATE log_head SET seq = seq + %s, log_id = log_id + %s WHERE id = 1", (raws, logs))
        for offset, chunk in _chunks(self._raw):
            for k, values in enumerate(chunk, start=offset + 1):
                values[_SEQ] = k
            self._write(_INSERT_RAW, {"n": raws, "doc": _json(RAW_EVENT_FIELDS, chunk)})
        if self._logs:  # (lines and claims are small: a group's fit in one statement each)
            for k, values in enumerate(self._logs, start=1):
                values[0] = k
            self._write(_INSERT_LOGS, {"n": raws, "m": logs, "doc": _json(LOG_COLUMNS, self._logs)})
        if self._claims:
            claims = _json(("program_id", "key", "raw_seq"), self._claims)
            self._write(_INSERT_CLAIMS, {"n": raws, "doc": claims})

    def rollback(self) -> None:
        try:
            with contextlib.suppress(psycopg.Error):  # what it met is the reason for the rollback
                self._leave_pipeline()
            if self._begun:
                self._con.execute(b"ROLLBACK")
        except psycopg.Error as exc:  # the connection broke: the next group opens another
            self._store._failed(self._con, exc)
