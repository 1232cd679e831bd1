"""The webhook outbox in the database, the same SQL on both backends (`ingest.storage.sql.Executor`,
`?` parameters; `Store.outbox()` gives one): nothing about a delivery is kept in a process, so
a restart, a second replica or a SIGKILL loses none and sends none twice at once.

Tables (migration 7, `DDL`):

- `webhook_endpoints`: a program's endpoints: URL, event types (a JSON array), enabled, the
  signing secret and, for 24 hours after a rotation, the previous one; when it began failing and
  why it was disabled.
- `webhook_events`: one row per event id (the id is derived from what the event says:
  ingest/webhooks_out/events.py), with the exact body every attempt sends and its place in the
  order events were made (`event_order`, a sequence).
- `webhook_deliveries`: one row per (event, endpoint): `pending` | `succeeded` | `failed`, the
  attempts made, when the next is due, every attempt (`attempt_log`, one JSON line each: when,
  the answer's status, how long it took, the first 4 KiB of its body, the error), and a lease
  (`lease_holder`, `lease_until`): a worker claims due deliveries by setting the lease in one
  conditional UPDATE (on PostgreSQL with `FOR UPDATE SKIP LOCKED`), so two replicas never send
  one delivery at once; a lease whose holder died is freed (`free_leases`) or runs out. Attempts
  are recorded a group at a time (`record`: one UPDATE for the group), the lease ending with it.
- `webhook_marks`: what the deriver last saw of each sale, commission line and payout batch
  of the programs that have an endpoint (ingest/webhooks_out/marks.py), so a change is an event
  once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ingest.domain.clock import rfc3339
from ingest.storage.sql import Executor

DDL = (
    "CREATE SEQUENCE IF NOT EXISTS webhook_event_order",
    """CREATE TABLE IF NOT EXISTS webhook_endpoints (
    endpoint_id VARCHAR PRIMARY KEY,
    program_id VARCHAR NOT NULL,
    url VARCHAR NOT NULL,
    description VARCHAR,
    events VARCHAR NOT NULL,
    enabled BOOLEAN NOT NULL,
    secret VARCHAR NOT NULL,
    previous_secret VARCHAR,
    previous_until TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    failing_since TIMESTAMPTZ,
    disabled_at TIMESTAMPTZ,
    disabled_reason VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS webhook_events (
    event_id VARCHAR PRIMARY KEY,
    event_order BIGINT NOT NULL DEFAULT nextval('webhook_event_order'),
    program_id VARCHAR NOT NULL,
    type VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    body VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS webhook_deliveries (
    delivery_id VARCHAR PRIMARY KEY,
    endpoint_id VARCHAR NOT NULL,
    event_id VARCHAR NOT NULL,
    program_id VARCHAR NOT NULL,
    type VARCHAR NOT NULL,
    event_order BIGINT NOT NULL,
    status VARCHAR NOT NULL,
    attempts INTEGER NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    first_attempt_at TIMESTAMPTZ,
    next_attempt_at TIMESTAMPTZ,
    last_attempt_at TIMESTAMPTZ,
    response_status INTEGER,
    duration_ms INTEGER,
    error VARCHAR,
    attempt_log VARCHAR,
    lease_holder VARCHAR,
    lease_until TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS webhook_marks (
    program_id VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    object_key VARCHAR NOT NULL,
    state VARCHAR,
    amount BIGINT,
    version INTEGER NOT NULL,
    PRIMARY KEY (program_id, kind, object_key))""",
)
# PostgreSQL only: the lookups a replica makes often (DuckDB scans these small tables faster
# than it keeps an index up to date on columns that change with every attempt).
PG_INDEXES = (
    "CREATE INDEX IF NOT EXISTS webhook_endpoints_program ON webhook_endpoints (program_id)",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at)",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, event_order)",
)


def migrate(db: Executor) -> None:
    """Migration 7: the outbox's tables (ingest/storage/migrations.py)."""
    for ddl in DDL:
        db.execute(ddl)
    if db.dialect == "postgresql":
        for ddl in PG_INDEXES:
            db.execute(ddl)


@contextlib.contextmanager
def transaction(db: Executor) -> Iterator[Executor]:
    """BEGIN ... COMMIT on `db` (ROLLBACK when the block raises)."""
    db.execute("BEGIN TRANSACTION")
    try:
        yield db
    except BaseException:
        with contextlib.suppress(Exception):
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _dicts(db: Executor, names: Sequence[str], sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    return [dict(zip(names, row, strict=True)) for row in db.rows(sql, params)]


def _marks(count: int) -> str:
    return ", ".join("?" * count)


# -- endpoints ----------------------------------------------------------------------------------
ENDPOINT_COLUMNS = (
    "endpoint_id",
    "program_id",
    "url",
    "description",
    "events",
    "enabled",
    "secret",
    "previous_secret",
    "previous_until",
    "created_at",
    "updated_at",
    "failing_since",
    "disabled_at",
    "disabled_reason",
)
_ENDPOINT_SELECT = f"SELECT {', '.join(ENDPOINT_COLUMNS)} FROM webhook_endpoints"


def _endpoint(row: dict[str, Any]) -> dict[str, Any]:
    row["events"] = json.loads(row["events"])
    return row


def add_endpoint(db: Executor, row: dict[str, Any]) -> None:
    values = {**row, "events": json.dumps(row["events"])}
    db.execute(
        f"INSERT INTO webhook_endpoints ({', '.join(ENDPOINT_COLUMNS)})"
        f" VALUES ({_marks(len(ENDPOINT_COLUMNS))})",
        [values[name] for name in ENDPOINT_COLUMNS],
    )


def endpoints(db: Executor, program_id: str) -> list[dict[str, Any]]:
    """A program's endpoints, oldest first (their secrets included: callers mask them)."""
    rows = _dicts(
        db,
        ENDPOINT_COLUMNS,
        _ENDPOINT_SELECT + " WHERE program_id = ? ORDER BY created_at, endpoint_id",
        [program_id],
    )
    return [_endpoint(r) for r in rows]


def endpoint(db: Executor, program_id: str, endpoint_id: str) -> dict[str, Any] | None:
    rows = _dicts(
        db,
        ENDPOINT_COLUMNS,
        _ENDPOINT_SELECT + " WHERE program_id = ? AND endpoint_id = ?",
        [program_id, endpoint_id],
    )
    return _endpoint(rows[0]) if rows else None


def enabled_endpoints(db: Executor) -> dict[str, list[dict[str, Any]]]:
    """Every enabled endpoint, by program: where events go."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in _dicts(
        db, ENDPOINT_COLUMNS, _ENDPOINT_SELECT + " WHERE enabled ORDER BY created_at, endpoint_id"
    ):
        found.setdefault(row["program_id"], []).append(_endpoint(row))
    return found


def update_endpoint(db: Executor, endpoint_id: str, changes: dict[str, Any]) -> None:
    """Set the given columns of one endpoint."""
    if not changes:
        return
    values = {k: json.dumps(v) if k == "events" else v for k, v in changes.items()}
    assignments = ", ".join(f"{name} = ?" for name in values)
    db.execute(
        f"UPDATE webhook_endpoints SET {assignments} WHERE endpoint_id = ?", [*values.values(), endpoint_id]
    )


def delete_endpoint(db: Executor, endpoint_id: str) -> None:
    """An endpoint and its deliveries (the events stay); inside the caller's transaction."""
    db.execute("DELETE FROM webhook_deliveries WHERE endpoint_id = ?", [endpoint_id])
    db.execute("DELETE FROM webhook_endpoints WHERE endpoint_id = ?", [endpoint_id])


# -- events and their deliveries -------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    """An event to put in the outbox: its id, type, program, when it was made and its body."""

    event_id: str
    type: str
    program_id: str
    created_at: datetime
    body: bytes


def delivery_id(event_id: str, endpoint_id: str) -> str:
    """One delivery per event and endpoint: its id follows from theirs."""
    return f"whd_{event_id.removeprefix('evt_')[:20]}_{endpoint_id.removeprefix('we_')}"


def _takers(endpoints_by_program: dict[str, list[dict[str, Any]]], event: Event) -> list[dict[str, Any]]:
    return [e for e in endpoints_by_program.get(event.program_id, []) if event.type in e["events"]]


EMIT_CHUNK = 500  # events put in the outbox by one statement (PostgreSQL takes 65,535 parameters)


def _orders(db: Executor, count: int) -> list[int]:
    """`count` new numbers of the events' order, ascending."""
    series = "range(?)" if db.dialect == "duckdb" else "generate_series(1, ?)"
    return sorted(int(r[0]) for r in db.rows(f"SELECT nextval('webhook_event_order') FROM {series}", [count]))


def emit(
    db: Executor,
    events: Sequence[Event],
    endpoints_by_program: dict[str, list[dict[str, Any]]],
    now: datetime,
) -> int:
    """Put each event in the outbox and, for each one that is new, a delivery to every enabled
    endpoint of its program subscribed to its type, due now; how many deliveries were made. An
    event no endpoint takes is not kept (nothing would ever send it). Events are numbered in the
    order given (`event_order`, each endpoint's sending order); an event whose id is there
    already is left as it is (the conflict is the insert's own result: one wins, whatever races
    it). A few statements per `EMIT_CHUNK` events, inside the caller's transaction."""
    taken = [(event, takers) for event in events if (takers := _takers(endpoints_by_program, event))]
    made = 0
    for start in range(0, len(taken), EMIT_CHUNK):
        chunk = taken[start : start + EMIT_CHUNK]
        values: list[Any] = []
        for (event, _), order in zip(chunk, _orders(db, len(chunk)), strict=True):
            values += [event.event_id, order, event.program_id, event.type, event.created_at]
            values.append(event.body.decode())
        rows = db.rows(
            "INSERT INTO webhook_events (event_id, event_order, program_id, type, created_at, body) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
            + " ON CONFLICT (event_id) DO NOTHING RETURNING event_id, event_order",
            values,
        )
        new: dict[str, int | None] = {str(r[0]): int(r[1]) for r in rows}
        deliveries: list[Any] = []
        for event, takers in chunk:
            numbered = new.pop(event.event_id, None)  # None: there already (or given twice: once)
            if numbered is None:
                continue
            for taker in takers:
                deliveries += [delivery_id(event.event_id, taker["endpoint_id"]), taker["endpoint_id"]]
                deliveries += [event.event_id, event.program_id, event.type, numbered, now, now]
        if deliveries:
            count = len(deliveries) // 8
            db.execute(
                "INSERT INTO webhook_deliveries (delivery_id, endpoint_id, event_id, program_id, type,"
                " event_order, status, attempts, created_at, next_attempt_at) VALUES "
                + ", ".join(["(?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?)"] * count)
                + " ON CONFLICT (delivery_id) DO NOTHING",
                deliveries,
            )
            made += count
    return made


# -- claiming and recording attempts ---------------------------------------------------------------
@dataclass(frozen=True)
class Claimed:
    """A delivery leased to this worker, with what sending it needs."""

    delivery_id: str
    endpoint_id: str
    event_id: str
    type: str
    event_order: int
    attempts: int
    first_attempt_at: datetime | None
    body: bytes
    url: str
    secret: str
    previous_secret: str | None
    previous_until: datetime | None
    failing: bool = False  # the endpoint had a failing streak when the delivery was claimed


_CLAIMED = (
    "SELECT d.delivery_id, d.endpoint_id, d.event_id, d.type, d.event_order, d.attempts, d.first_attempt_at,"
    " ev.body, e.url, e.secret, e.previous_secret, e.previous_until, e.failing_since IS NOT NULL"
    " FROM webhook_deliveries d"
    " JOIN webhook_events ev ON ev.event_id = d.event_id"
    " JOIN webhook_endpoints e ON e.endpoint_id = d.endpoint_id"
)


def claim(
    db: Executor,
    holder: str,
    now: datetime,
    until: datetime,
    per_endpoint: int,
    limit: int,
    busy: Sequence[str] = (),
) -> list[Claimed]:
    """Lease the due deliveries (pending, due by `now`, not leased or their lease run out) of
    enabled endpoints (a ping goes to a disabled one too) until `until`: the first
    `per_endpoint` of each endpoint in event order, at most `limit` in all, none of the
    endpoints in `busy`. The lease is taken by one conditional UPDATE: a delivery another
    worker leased first is not taken, nor one of an endpoint another worker is sending to (one
    sender per endpoint keeps its events in order). On PostgreSQL, where replicas claim at the
    same time, the claim first locks the rows of the endpoints it claims for (`FOR UPDATE SKIP
    LOCKED`, in one transaction with the UPDATE): a worker claiming at the same instant skips
    those endpoints, and one that claims after the commit sees their leases."""
    in_transaction = transaction(db) if db.dialect == "postgresql" else contextlib.nullcontext()
    with in_transaction:
        skip = f" AND d.endpoint_id NOT IN ({_marks(len(busy))})" if busy else ""
        mine: list[str] = []  # PostgreSQL: the endpoints this claim holds the rows of
        if db.dialect == "postgresql":
            not_busy = f" AND endpoint_id NOT IN ({_marks(len(busy))})" if busy else ""
            mine = [
                str(r[0])
                for r in db.rows(
                    "SELECT endpoint_id FROM webhook_endpoints WHERE endpoint_id IN (SELECT endpoint_id FROM"
                    f" webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= ?){not_busy}"
                    " ORDER BY endpoint_id FOR UPDATE SKIP LOCKED",
                    [now, *busy],
                )
            ]
            if not mine:
                return []
            skip += f" AND d.endpoint_id IN ({_marks(len(mine))})"
        ranked = (
            "SELECT delivery_id FROM (SELECT d.delivery_id, d.event_order, row_number() OVER"
            " (PARTITION BY d.endpoint_id ORDER BY d.event_order, d.delivery_id) AS n"
            " FROM webhook_deliveries d JOIN webhook_endpoints e ON e.endpoint_id = d.endpoint_id"
            " WHERE d.status = 'pending' AND d.next_attempt_at <= ?"
            " AND (d.lease_until IS NULL OR d.lease_until <= ?)"
            f" AND (e.enabled OR d.type = 'ping'){skip} AND NOT EXISTS (SELECT 1 FROM webhook_deliveries x"
            " WHERE x.endpoint_id = d.endpoint_id AND x.status = 'pending' AND x.lease_until > ?)) ranked"
            " WHERE n <= ? ORDER BY event_order, delivery_id LIMIT ?"
        )
        params: list[Any] = [now, now, *busy, *mine, now, per_endpoint, limit]
        if db.dialect == "postgresql":
            ranked = (
                f"SELECT delivery_id FROM webhook_deliveries WHERE delivery_id IN ({ranked})"
                " FOR UPDATE SKIP LOCKED"
            )
        rows = db.rows(
            "UPDATE webhook_deliveries SET lease_holder = ?, lease_until = ?"
            f" WHERE delivery_id IN ({ranked}) AND status = 'pending'"
            " AND (lease_until IS NULL OR lease_until <= ?)"
            " RETURNING delivery_id",
            [holder, until, *params, now],
        )
        ids = [str(r[0]) for r in rows]
        if not ids:
            return []
        found = db.rows(
            _CLAIMED + f" WHERE d.delivery_id IN ({_marks(len(ids))}) AND d.lease_holder = ?"
            " ORDER BY d.event_order, d.delivery_id",
            [*ids, holder],
        )
        return [
            Claimed(
                str(r[0]),
                str(r[1]),
                str(r[2]),
                str(r[3]),
                int(r[4]),
                int(r[5]),
                r[6],
                str(r[7]).encode(),
                str(r[8]),
                str(r[9]),
                r[10],
                r[11],
                bool(r[12]),
            )
            for r in found
        ]


def release(db: Executor, delivery_ids: Sequence[str], holder: str) -> None:
    """Give leases back unsent (the worker is stopping)."""
    if delivery_ids:
        db.execute(
            "UPDATE webhook_deliveries SET lease_holder = NULL, lease_until = NULL"
            f" WHERE lease_holder = ? AND delivery_id IN ({_marks(len(delivery_ids))})",
            [holder, *delivery_ids],
        )


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to."""

    succeeded: bool
    response_status: int | None
    duration_ms: int
    response_body: str | None
    error: str | None


@dataclass(frozen=True)
class Attempt:
    """An attempt to record: the delivery (its id, endpoint, the attempts made before this one,
    and whether the endpoint had a failing streak when it was claimed), what it came to, when,
    and when to try again (None: no more attempts after a failure)."""

    delivery_id: str
    endpoint_id: str
    prior_attempts: int
    failing: bool
    outcome: Outcome
    at: datetime
    next_at: datetime | None

    @classmethod
    def of(cls, claimed: Claimed, outcome: Outcome, at: datetime, next_at: datetime | None) -> Attempt:
        c = claimed
        return cls(c.delivery_id, c.endpoint_id, c.attempts, c.failing, outcome, at, next_at)

    @property
    def status(self) -> str:
        if self.outcome.succeeded:
            return "succeeded"
        return "pending" if self.next_at is not None else "failed"

    def line(self) -> str:
        """The attempt as a line of the delivery's `attempt_log`."""
        entry = {
            "attempted_at": rfc3339(self.at),
            "status": "succeeded" if self.outcome.succeeded else "failed",
            "response_status": self.outcome.response_status,
            "duration_ms": self.outcome.duration_ms,
            "response_body": self.outcome.response_body,
            "error": self.outcome.error,
            "next_attempt_at": rfc3339(self.next_at) if self.status == "pending" and self.next_at else None,
        }
        return json.dumps(entry, ensure_ascii=False) + "\n"


_ROW = (
    "(CAST(? AS VARCHAR), CAST(? AS INTEGER), CAST(? AS VARCHAR), CAST(? AS TIMESTAMPTZ),"
    " CAST(? AS TIMESTAMPTZ), CAST(? AS INTEGER), CAST(? AS INTEGER), CAST(? AS VARCHAR), CAST(? AS VARCHAR))"
)


def record(db: Executor, attempts: Sequence[Attempt], disable_before: datetime) -> dict[str, str]:
    """Record a group of attempts in one transaction: each delivery's status (`succeeded`;
    `pending` again until its next attempt; `failed` when there is none), its attempt log, its
    lease given up; and each endpoint's failing streak (ended by a success; an endpoint failing
    since before `disable_before` is disabled). The endpoints disabled, with the reason.

    Recording an attempt again is a no-op for the delivery (it is recorded only while the
    delivery has the attempts it had before: `prior_attempts`), so attempts kept in a file
    before they reach the database (ingest/webhooks_out/journal.py) may be recorded twice when a
    crash comes between the two."""
    if not attempts:
        return {}
    values: list[Any] = []
    for a in attempts:
        o = a.outcome
        next_at = a.next_at if a.status == "pending" else None
        values += [a.delivery_id, a.prior_attempts, a.status, next_at, a.at]
        values += [o.response_status, o.duration_ms, o.error, a.line()]
    last: dict[str, Attempt] = {}
    for a in attempts:
        last[a.endpoint_id] = a
    well = sorted(e for e, a in last.items() if a.outcome.succeeded and a.failing)
    failing = {e: a for e, a in last.items() if not a.outcome.succeeded}
    disabled: dict[str, str] = {}
    with transaction(db):
        db.execute(
            "UPDATE webhook_deliveries SET attempts = webhook_deliveries.attempts + 1, status = v.v_status,"
            " next_attempt_at = v.v_next,"
            " first_attempt_at = coalesce(webhook_deliveries.first_attempt_at, v.v_at),"
            " last_attempt_at = v.v_at, response_status = v.v_code, duration_ms = v.v_ms, error = v.v_error,"
            " attempt_log = coalesce(webhook_deliveries.attempt_log, '') || v.v_line,"
            " lease_holder = NULL, lease_until = NULL"
            f" FROM (VALUES {', '.join([_ROW] * len(attempts))})"
            " AS v(v_id, v_prior, v_status, v_next, v_at, v_code, v_ms, v_error, v_line)"
            " WHERE webhook_deliveries.delivery_id = v.v_id AND webhook_deliveries.attempts = v.v_prior",
            values,
        )
        if well:
            db.execute(
                "UPDATE webhook_endpoints SET failing_since = NULL"
                f" WHERE endpoint_id IN ({_marks(len(well))}) AND failing_since IS NOT NULL",
                well,
            )
        for endpoint_id, a in sorted(failing.items()):
            first = min(x.at for x in attempts if x.endpoint_id == endpoint_id)
            rows = db.rows(
                "UPDATE webhook_endpoints SET failing_since = coalesce(failing_since, ?)"
                " WHERE endpoint_id = ? AND enabled RETURNING failing_since",
                [first, endpoint_id],
            )
            if not rows or rows[0][0] is None or rows[0][0] > disable_before:
                continue
            why = a.outcome.error or f"HTTP {a.outcome.response_status}"
            reason = f"every delivery failed for 5 days (since {rfc3339(rows[0][0])}); the last: {why}"[:500]
            db.execute(
                "UPDATE webhook_endpoints SET enabled = false, disabled_at = ?, disabled_reason = ?,"
                " updated_at = ? WHERE endpoint_id = ?",
                [a.at, reason, a.at, endpoint_id],
            )
            disabled[endpoint_id] = reason
    return disabled


def lease_holders(db: Executor) -> list[str]:
    return [
        str(r[0])
        for r in db.rows(
            "SELECT DISTINCT lease_holder FROM webhook_deliveries WHERE lease_holder IS NOT NULL"
        )
    ]


def free_leases(db: Executor, holder: str) -> None:
    """Free every lease of `holder` (a process that died: what it had not recorded is due again)."""
    db.execute(
        "UPDATE webhook_deliveries SET lease_holder = NULL, lease_until = NULL WHERE lease_holder = ?",
        [holder],
    )


def next_due(db: Executor) -> datetime | None:
    """When the next pending delivery is due (None: none is)."""
    rows = db.rows("SELECT min(next_attempt_at) FROM webhook_deliveries WHERE status = 'pending'")
    value: datetime | None = rows[0][0] if rows else None
    return value


# -- the delivery log -----------------------------------------------------------------------------
DELIVERY_COLUMNS = (
    "delivery_id",
    "endpoint_id",
    "event_id",
    "type",
    "status",
    "response_status",
    "duration_ms",
    "attempts",
    "next_attempt_at",
    "created_at",
    "last_attempt_at",
    "error",
    "attempt_log",
)


def attempt_log(text: str | None) -> list[dict[str, Any]]:
    """A delivery's attempts, oldest first, numbered from 1, times as datetimes."""
    found = []
    for n, line in enumerate((text or "").splitlines(), start=1):
        entry = json.loads(line)
        for name in ("attempted_at", "next_attempt_at"):
            if entry[name] is not None:
                entry[name] = datetime.fromisoformat(entry[name])
        found.append({"attempt": n, **entry})
    return found


def deliveries(
    db: Executor, endpoint_id: str, status: str | None, limit: int, delivery: str | None = None
) -> list[dict[str, Any]]:
    """An endpoint's deliveries, newest event first (of one status, or one delivery), each with
    its attempts (oldest first) under `attempt_log`."""
    where, params = ["endpoint_id = ?"], [endpoint_id]
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if delivery is not None:
        where.append("delivery_id = ?")
        params.append(delivery)
    rows = _dicts(
        db,
        DELIVERY_COLUMNS,
        f"SELECT {', '.join(DELIVERY_COLUMNS)} FROM webhook_deliveries WHERE {' AND '.join(where)}"
        " ORDER BY event_order DESC, delivery_id LIMIT ?",
        [*params, limit],
    )
    for row in rows:
        row["attempt_log"] = attempt_log(row["attempt_log"])
    return rows


def resend(db: Executor, endpoint_id: str, delivery_id: str, now: datetime) -> bool:
    """Make a delivery due again now, with a new retry window (the same event, the same
    `webhook-id`); False when the endpoint has no such delivery."""
    rows = db.rows(
        "UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = ?, first_attempt_at = NULL"
        " WHERE endpoint_id = ? AND delivery_id = ? RETURNING delivery_id",
        [now, endpoint_id, delivery_id],
    )
    return bool(rows)
