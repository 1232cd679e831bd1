"""The database schema: the append-only raw event log and the control-plane tables.

The raw log (`raw_events`) is the single source of truth for everything the reconciler
computes. Rows are only ever inserted (see `tests/ingest/test_append_only.py`). Each row keeps
the verbatim request body plus the typed fields later stages need, extracted once at ingest.

Column meanings of `raw_events` (all typed columns are NULL when they do not apply):

- ``seq``: monotonic sequence assigned by the single writer (1, 2, 3, ... in commit order).
- ``received_at``: when tally accepted the request (UTC).
- ``source``: ``track`` (brand server or browser), ``stripe`` (connect webhook),
  ``backfill`` (metadata fixes and backfill applications by engineers).
- ``kind``: ``click`` | ``lead`` | ``sale`` | ``refund`` (track calls), ``stripe`` (every
  processor delivery), ``metadata_fix`` | ``backfill`` | ``period_close`` (engineer actions).
- ``program_id``: the program the event belongs to (NULL for unroutable processor events).
- ``outcome``: ``accepted`` | ``duplicate`` (a refused duplicate track call, or a repeated
  processor event id) | ``unroutable`` (processor event matching no program) | ``unusable``
  (processor event with an amount or time out of bounds: those fields NULL, never reconciled).
- ``event_id``: our id for track calls (``clk_``/``lead_``/``sale_``/``rfd_``), the processor's
  event id (``evt_...``) for deliveries, a generated id for engineer actions.
- ``event_type``: the processor's event type (``checkout.session.completed``...) or
  ``track.click`` / ``track.lead`` / ``track.sale`` / ``track.refund`` / ``metadata_fix`` /
  ``backfill`` / ``period_close``.
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
  ``subscription_id`` too.
- ``billing_reason``: invoice ``billing_reason``.
- ``checkout_mode``: checkout session ``mode`` (payment | subscription | setup).
- ``customer_key``: ``svc_customer_key`` (processor metadata) or ``customer_external_id``
  (track calls, and metadata fixes).
- ``processor_customer_id``: the processor customer id (``cus_...``).
- ``email``: customer email (lead email, checkout ``customer_details.email`` /
  ``customer_email``, invoice ``customer_email``, track sale ``email``).
- ``click_id``: ``svc_click_id`` (processor metadata), body ``click_id`` (track), or the new
  click's id (kind ``click``).
- ``partner_code``: clicks only: the partner code the click was recorded for.
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
- ``body``: the verbatim request body (text). ``headers``: JSON object of the headers that
  matter (content-type, user-agent, stripe-signature, x-request-id...), never credentials.
"""

from __future__ import annotations

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
)

RAW_EVENT_FIELDS: tuple[str, ...] = tuple(name for name, _ in RAW_EVENT_COLUMNS)

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


def raw_events_ddl() -> str:
    cols = ",\n    ".join(f"{name} {typ}" for name, typ in RAW_EVENT_COLUMNS)
    return f"CREATE TABLE IF NOT EXISTS raw_events (\n    {cols})"
