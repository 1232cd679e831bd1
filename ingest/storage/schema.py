"""The database schema: the append-only raw event log and the control-plane tables.

The raw log (`raw_events`) is the single source of truth for everything the reconciler
computes. Rows are only ever inserted (see `tests/ingest/test_append_only.py`). Each row keeps
the verbatim request body plus the typed fields later stages need, extracted once at ingest.

Column meanings of `raw_events` (all typed columns are NULL when they do not apply):

- ``seq``: monotonic sequence assigned by the single writer (1, 2, 3, ... in commit order).
- ``received_at``: when tally accepted the request (UTC).
- ``source``: ``track`` (brand server or browser), ``stripe`` (connect webhook),
  ``backfill`` (engineer and owner actions: metadata fixes, backfill applications, period
  closes, payout batches and payments, changes of a program's money terms, promo-code
  assignments).
- ``kind``: ``click`` | ``lead`` | ``sale`` | ``refund`` (track calls), ``stripe`` (every
  processor delivery), ``metadata_fix`` | ``backfill`` | ``period_close`` | ``payout_batch`` |
  ``payout_paid`` | ``program_terms`` | ``promo_code`` (actions), ``booking`` |
  ``close_booking`` | ``close_booked`` (what the reconciler showed, booked: reconcile/bookings.py,
  reconcile/periods.py).
- ``program_id``: the program the event belongs to (NULL for unroutable processor events).
- ``outcome``: ``accepted`` | ``duplicate`` (a refused duplicate track call, or a repeated
  processor event id) | ``unroutable`` (processor event matching no program) | ``unusable``
  (processor event with an amount or time out of bounds: those fields NULL, never reconciled).
- ``event_id``: our id for track calls (``clk_``/``lead_``/``sale_``/``rfd_``), the processor's
  event id (``evt_...``) for deliveries, a generated id for engineer actions.
- ``event_type``: the processor's event type (``checkout.session.completed``...) or
  ``track.click`` / ``track.lead`` / ``track.sale`` / ``track.refund`` / the action's kind.
- ``object_id``: the processor object id in ``data.object.id`` (cs_/in_/ch_/sub_...).
- ``livemode``: processor ``livemode``; NULL for track calls.
- ``test_mode``: true for ``livemode: false`` deliveries and for track sales with
  ``additional_data.test_mode``; such events are never commissioned.
- ``occurred_at``: business time. Processor invoices: ``status_transitions.paid_at`` or else
  the event's ``created``; other processor events: the event's ``created``; track calls: the
  body's ``occurred_at`` or else ``received_at``.
- ``transaction_id``: track sale/refund: the body's transaction id. Processor sale-ish objects:
  invoice id if any, else payment intent id, else checkout session id.
- ``invoice_id``, ``payment_intent_id``, ``checkout_session_id``, ``charge_id``,
  ``subscription_id``: processor object ids found on the object (strings, or ``id`` of an
  expanded object). ``subscription_id`` for invoices reads ``parent.subscription_details.
  subscription`` first, then top-level ``subscription``. Track sales may carry
  ``subscription_id`` too. ``invoice_payment.paid`` (an ``InvoicePayment``): its ``invoice``
  (also its ``transaction_id``) and its ``payment.payment_intent`` (type ``payment_intent``) or
  ``payment.charge`` (type ``charge``): the link a basil ``charge.refunded`` finds its invoice by.
- ``billing_reason``: invoice ``billing_reason``.
- ``checkout_mode``: checkout session ``mode`` (payment | subscription | setup).
- ``customer_key``: ``svc_customer_key`` (processor metadata) or ``customer_external_id``
  (track calls, and metadata fixes).
- ``processor_customer_id``: the processor customer id (``cus_...``).
- ``email``: customer email (lead email, checkout ``customer_details.email`` /
  ``customer_email``, invoice ``customer_email``, track sale ``email``).
- ``click_id``: ``svc_click_id`` (processor metadata), body ``click_id`` (track), or the new
  click's id (kind ``click``).
- ``partner_code``: clicks: the partner code the click was recorded for; promo-code
  assignments (kind ``promo_code``): the partner the code is assigned to.
- ``meta_program_id``: ``program_id`` found in the processor metadata.
- ``sub_metadata_present``: invoices: whether the subscription metadata (new or legacy
  layout) carried any of ``svc_click_id`` / ``svc_customer_key`` / ``program_id``.
  Checkout sessions: whether ``metadata`` carried any of them.
- ``amount``: sales: gross amount in minor units (invoice ``amount_paid``, session
  ``amount_total``, track ``amount``). Refunds: track refund ``amount``; ``charge.refunded``:
  the charge's cumulative ``amount_refunded``.
- ``tax``: tax in minor units where the processor reports it (invoice ``tax`` or sum of
  ``total_taxes``; session ``total_details.amount_tax``), else NULL.
- ``currency``: lower-case ISO code.
- ``is_recurring``, ``sale_type``: track sales only.
- ``refund_id``: track refund id; ``charge.refunded``: id of the newest refund when listed.
- ``lead_status``: leads: ``settled`` | ``provisional``.
- ``stripe_account``: Connect ``account`` of the delivery.
- ``actor``: who made an engineer action (account id or ``operator``).
- ``promo_code``: checkout sessions: the id of the promotion code in ``discounts[].promotion_code``
  (or, in older layouts, ``total_details.breakdown.discounts[].discount.promotion_code``); track
  sales: the body's ``promo_code``; promo-code assignments: the code customers type (its
  processor id ``promo_...``, when given, in ``object_id``).
- ``body``: the verbatim request body (text). ``headers``: JSON object of the headers that
  matter (content-type, user-agent, stripe-signature, x-request-id...), never credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

RAW_EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("seq", "BIGINT NOT NULL"),
    ("received_at", "TIMESTAMPTZ NOT NULL"),
    ("source", "VARCHAR NOT NULL"),
    ("kind", "VARCHAR NOT NULL"),
    ("program_id", "VARCHAR"),
    ("outcome", "VARCHAR NOT NULL"),
    ("event_id", "VARCHAR"),
    ("event_type", "VARCHAR"),
    ("object_id", "VARCHAR"),
    ("livemode", "BOOLEAN"),
    ("test_mode", "BOOLEAN NOT NULL"),
    ("occurred_at", "TIMESTAMPTZ"),
    ("transaction_id", "VARCHAR"),
    ("invoice_id", "VARCHAR"),
    ("payment_intent_id", "VARCHAR"),
    ("checkout_session_id", "VARCHAR"),
    ("charge_id", "VARCHAR"),
    ("subscription_id", "VARCHAR"),
    ("billing_reason", "VARCHAR"),
    ("checkout_mode", "VARCHAR"),
    ("customer_key", "VARCHAR"),
    ("processor_customer_id", "VARCHAR"),
    ("email", "VARCHAR"),
    ("click_id", "VARCHAR"),
    ("partner_code", "VARCHAR"),
    ("meta_program_id", "VARCHAR"),
    ("sub_metadata_present", "BOOLEAN"),
    ("amount", "BIGINT"),
    ("tax", "BIGINT"),
    ("currency", "VARCHAR"),
    ("is_recurring", "BOOLEAN"),
    ("sale_type", "VARCHAR"),
    ("refund_id", "VARCHAR"),
    ("lead_status", "VARCHAR"),
    ("stripe_account", "VARCHAR"),
    ("actor", "VARCHAR"),
    ("body", "VARCHAR NOT NULL"),
    ("headers", "VARCHAR NOT NULL"),
    ("promo_code", "VARCHAR"),  # last: migration 8 added it to databases made before
)

RAW_EVENT_FIELDS: tuple[str, ...] = tuple(name for name, _ in RAW_EVENT_COLUMNS)
# The columns of the 0.1 schema (migration 1's baseline); later migrations add the rest.
BASELINE_RAW_COLUMNS = RAW_EVENT_COLUMNS[: RAW_EVENT_FIELDS.index("headers") + 1]

CONTROL_PLANE_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS accounts (
        account_id VARCHAR PRIMARY KEY,
        email VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS workspaces (
        workspace_id VARCHAR PRIMARY KEY,
        name VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS memberships (
        workspace_id VARCHAR NOT NULL,
        account_id VARCHAR NOT NULL,
        role VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (workspace_id, account_id))""",
    """CREATE TABLE IF NOT EXISTS programs (
        program_id VARCHAR PRIMARY KEY,
        workspace_id VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        settings VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        updated_at TIMESTAMPTZ NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS partners (
        program_id VARCHAR NOT NULL,
        code VARCHAR NOT NULL,
        partner_id VARCHAR NOT NULL,
        name VARCHAR NOT NULL,
        email VARCHAR,
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (program_id, code))""",
    # One row per credential ever issued; `revoked_at` set when replaced. Only the hash is kept.
    """CREATE TABLE IF NOT EXISTS credentials (
        token_hash VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL,
        subject_id VARCHAR NOT NULL,
        masked VARCHAR NOT NULL,
        scopes VARCHAR NOT NULL,
        workspace_ids VARCHAR NOT NULL,
        name VARCHAR,
        created_at TIMESTAMPTZ NOT NULL,
        revoked_at TIMESTAMPTZ,
        flagged_at TIMESTAMPTZ,
        rotation_deadline TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS tracking_log (
        log_id BIGINT NOT NULL,
        program_id VARCHAR NOT NULL,
        logged_at TIMESTAMPTZ NOT NULL,
        endpoint VARCHAR NOT NULL,
        status INTEGER NOT NULL,
        outcome VARCHAR NOT NULL,
        detail VARCHAR NOT NULL,
        request_id VARCHAR,
        raw_seq BIGINT)""",
    """CREATE TABLE IF NOT EXISTS checklist (
        program_id VARCHAR NOT NULL,
        step VARCHAR NOT NULL,
        done_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (program_id, step))""",
    # Idempotency keys of recorded sales: every id a sale is known by (transaction id, invoice,
    # payment intent, checkout session, charge) and processor event ids, per program.
    """CREATE TABLE IF NOT EXISTS idempotency_keys (
        program_id VARCHAR NOT NULL,
        key VARCHAR NOT NULL,
        raw_seq BIGINT NOT NULL,
        PRIMARY KEY (program_id, key))""",
)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# (field, storage kind, nullable) of every raw-log column, checked before a row is buffered.
_RAW_CHECKS: tuple[tuple[str, str, bool], ...] = tuple(
    (name, typ.split()[0], "NOT NULL" not in typ) for name, typ in RAW_EVENT_COLUMNS
)


def _text(value: str) -> bool:
    """Text both backends store: UTF-8 without NUL (PostgreSQL's text cannot hold U+0000)."""
    if value.isascii():
        return "\x00" not in value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, from a JSON `\ud800` escape
        return False
    return "\x00" not in value


_KINDS: dict[str, str] = {name: kind for name, kind, _ in _RAW_CHECKS}
_REQUIRED: tuple[str, ...] = tuple(name for name, _, nullable in _RAW_CHECKS if not nullable)


def _all_fit(row: Mapping[str, Any]) -> bool:
    """Whether `storable(row)` is empty, looking only at the values the row holds (a track call's
    row sets a dozen of the forty columns): the writer checks every row it appends."""
    for name in _REQUIRED:
        if row.get(name) is None:
            return False
    kinds = _KINDS
    for name, value in row.items():
        if value is None or (kind := kinds.get(name)) is None:
            continue
        if kind == "VARCHAR":
            if type(value) is not str or not ((value.isascii() and "\x00" not in value) or _text(value)):
                return False
        elif kind == "BIGINT":
            if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
                return False
        elif kind == "BOOLEAN":
            if type(value) is not bool:
                return False
        elif not isinstance(value, datetime) or value.tzinfo is None:  # TIMESTAMPTZ
            return False
    return True


def storable(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """What in a raw-log row its column types cannot hold, on either backend (empty when all of
    it fits): checked before a row is accepted, so nothing acknowledged is refused later."""
    if _all_fit(row):
        return []
    problems = []
    for name, kind, nullable in _RAW_CHECKS:
        value = row.get(name)
        if value is None:
            fits = nullable
        elif kind == "BIGINT":
            fits = type(value) is int and _INT64_MIN <= value <= _INT64_MAX
        elif kind == "VARCHAR":
            fits = type(value) is str and _text(value)
        elif kind == "BOOLEAN":
            fits = type(value) is bool
        else:  # TIMESTAMPTZ
            fits = isinstance(value, datetime) and value.tzinfo is not None
        if not fits:
            problems.append({"field": name, "message": f"cannot be stored as {kind}"})
    return problems


def raw_events_ddl(columns: tuple[tuple[str, str], ...] = RAW_EVENT_COLUMNS) -> str:
    cols = ",\n    ".join(f"{name} {typ}" for name, typ in columns)
    return f"CREATE TABLE IF NOT EXISTS raw_events (\n    {cols})"


# PostgreSQL only (migration 5): what several replicas sharing one log need from the database.
# - `log_head`: the last raw `seq` and tracking-log id handed out. A group commit takes its
#   numbers by updating this one row as its last step, so the row's lock orders commits: seqs
#   become visible in order, and no lower seq can appear after a higher one was read (the
#   reconciler's watermark, ingest/storage/postgres/store.py).
# - `key_*`: what ingest decides from, kept by the database's own unique keys (the embedded
#   backend keeps the same tables in its key index file, ingest/storage/duckdb/keys.py).
# - `tally_meta`: the database's identity, which the reconciler's working copy is tied to;
#   `rc_runs.run_no`: the order runs were published in.
# - triggers that refuse UPDATE, DELETE and TRUNCATE on `raw_events`: the log is append-only in
#   the database itself, whatever a client tries.
POSTGRES_LOG_DDL: tuple[str, ...] = (
    "CREATE UNIQUE INDEX raw_events_seq ON raw_events (seq)",
    "CREATE INDEX raw_events_program_seq ON raw_events (program_id, seq)",
    "CREATE UNIQUE INDEX tracking_log_id ON tracking_log (log_id)",
    "CREATE INDEX tracking_log_program ON tracking_log (program_id, log_id)",
    "CREATE INDEX credentials_subject ON credentials (kind, subject_id) WHERE revoked_at IS NULL",
    "CREATE INDEX memberships_account ON memberships (account_id)",
    """CREATE TABLE log_head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        log_id BIGINT NOT NULL)""",
    """INSERT INTO log_head SELECT 1, coalesce((SELECT max(seq) FROM raw_events), 0),
        coalesce((SELECT max(log_id) FROM tracking_log), 0)""",
    """CREATE TABLE tally_meta (name VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)""",
    # The order runs were published in (the embedded database has its rowid).
    "ALTER TABLE rc_runs ADD COLUMN run_no BIGSERIAL",
    "INSERT INTO tally_meta VALUES ('identity', md5(random()::text || clock_timestamp()::text))",
    """CREATE TABLE key_clicks (program_id VARCHAR NOT NULL, click_id VARCHAR NOT NULL,
        partner_code VARCHAR NOT NULL, PRIMARY KEY (program_id, click_id))""",
    """CREATE TABLE key_bindings (program_id VARCHAR NOT NULL, customer VARCHAR NOT NULL,
        lead_event_id VARCHAR NOT NULL, click_id VARCHAR, partner_code VARCHAR,
        PRIMARY KEY (program_id, customer))""",
    """CREATE TABLE key_provisional (program_id VARCHAR NOT NULL, customer VARCHAR NOT NULL,
        click_id VARCHAR, PRIMARY KEY (program_id, customer))""",
    """CREATE TABLE key_ledgers (id BIGSERIAL PRIMARY KEY, amount BIGINT, currency VARCHAR,
        refunded BIGINT NOT NULL DEFAULT 0)""",
    """CREATE TABLE key_sales (program_id VARCHAR NOT NULL, key VARCHAR NOT NULL,
        ledger BIGINT NOT NULL REFERENCES key_ledgers (id), PRIMARY KEY (program_id, key))""",
    """CREATE TABLE key_refunds (program_id VARCHAR NOT NULL, refund_id VARCHAR NOT NULL,
        PRIMARY KEY (program_id, refund_id))""",
    "CREATE TABLE key_events (event_id VARCHAR PRIMARY KEY)",
    """CREATE TABLE key_claims (program_id VARCHAR NOT NULL, key VARCHAR NOT NULL,
        PRIMARY KEY (program_id, key))""",
    """CREATE FUNCTION tally_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'raw_events is append-only: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END $$""",
    """CREATE TRIGGER raw_events_append_only BEFORE UPDATE OR DELETE ON raw_events
        FOR EACH ROW EXECUTE FUNCTION tally_append_only()""",
    """CREATE TRIGGER raw_events_no_truncate BEFORE TRUNCATE ON raw_events
        FOR EACH STATEMENT EXECUTE FUNCTION tally_append_only()""",
)
