"""The `data` of JSON successes, as the OpenAPI document (`api/openapi.py`) describes them.

Where an endpoint returns a stored type as it is, the type itself is the schema (a partner is
`ingest.domain.records.Partner`, a reconcile run `reconcile.run.job.RunSummary`, and a program extends
`ProgramSettings`); the rest are written here from the views that build them.
tests/api/test_schemathesis.py checks every response the app gives against these schemas, so a
view that drifts from its schema fails there.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ingest.domain.bounds import PayoutMinimum
from ingest.domain.records import ProgramSettings


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Status(_Out):
    status: str


class Home(_Out):
    """`GET /` for an API client: where the human and machine entry points are."""

    service: Literal["tally"]
    dashboard: str
    api_reference: str
    openapi: str
    error_codes: str
    health: str


class Ready(_Out):
    status: Literal["ready"]
    journal_set_aside: int
    schema_version: int  # the database's schema version (ingest/storage/migrations.py)


class Click(_Out):
    click_id: str
    program_id: str
    partner_code: str


class Lead(_Out):
    lead_id: str
    customer_external_id: str
    status: Literal["settled", "provisional"]
    provisional: bool


class Sale(_Out):
    """A recorded sale; a test-mode sale carries only the first three fields."""

    sale_id: str
    transaction_id: str | None
    test_mode: bool
    attributed: bool | None = None
    partner_code: str | None = None
    customer_external_id: str | None = None
    amount: int | None = None
    currency: str | None = None


class Refund(_Out):
    refund_id: str
    transaction_id: str
    amount: int
    sale_found: bool


class Delivery(_Out):
    """A verified webhook delivery: stored (and routed when a program matches)."""

    received: bool
    duplicate: bool | None = None
    routed: bool | None = None
    event_id: str | None = None
    program_id: str | None = None
    test_mode: bool | None = None


class Account(_Out):
    account_id: str
    workspace_id: str
    token: str


class Member(_Out):
    account_id: str
    token: str
    workspace_id: str
    role: Literal["owner", "member"]


class Program(ProgramSettings):
    """A program as every read shows it: its settings and the masked key, never the key."""

    program_id: str
    workspace_id: str
    name: str
    api_token_masked: str | None
    api_key_rotation_deadline: datetime | None
    created_at: datetime
    updated_at: datetime


class Balance(_Out):
    """What a partner is owed in one currency (reports/statements.py), minor units."""

    currency: str
    approved_unpaid: int  # the statement's closing balance: what the next batch would pay
    pending: int  # not yet booked as approved (holding days)
    held: int


class PartnerOut(_Out):
    """A partner as the owner's reads show it, with its payout details (null until set) and
    its balances."""

    partner_id: str
    program_id: str
    code: str
    name: str
    email: str | None
    created_at: datetime
    payout_method: Literal["paypal", "wise"] | None
    payout_email: str | None
    payout_name: str | None
    payout_currency: str | None
    balances: list[Balance]  # per currency: approved unpaid, pending, held (CONTRACT 15)


class StatementEntry(_Out):
    """One entry of a partner's statement, with the balance after it."""

    booked_at: datetime
    kind: Literal["commission", "adjustment", "clawback", "manual", "payout", "payout_failed"]
    amount: int  # positive when owed to the partner, negative when paid to them
    transaction_id: str | None
    payout_id: str | None
    reason: str | None
    balance: int


class Statement(_Out):
    """A partner's account in one currency (CONTRACT 15)."""

    partner_code: str
    currency: str | None
    from_: datetime | None = Field(alias="from")
    to: datetime | None
    opening_balance: int
    entries: list[StatementEntry]
    closing_balance: int


class ManualEntry(_Out):
    """A manual entry's line (reconcile/manual.py), as booked."""

    entry_id: str
    sale_id: str
    transaction_id: str
    partner_code: str
    kind: Literal["manual"]
    currency: str
    amount: int
    status: str
    status_reason: str | None
    status_by: str | None
    created_at: datetime
    created_by: str


class PortalLink(_Out):
    """A partner's one-time portal sign-in link (CONTRACT 14)."""

    url: str
    expires_at: datetime
    sent: bool  # emailed to the partner


class PromoCode(_Out):
    program_id: str
    partner_code: str
    code: str
    promotion_code_id: str | None
    created_at: datetime


class ApiKey(_Out):
    api_key: str
    api_token_masked: str
    created_at: datetime


class LegacyKey(_Out):
    api_token_masked: str
    created_at: datetime


class Rotation(_Out):
    program_id: str
    api_token_masked: str
    flagged_at: datetime
    deadline: datetime


class AgentKey(_Out):
    agent_key: str
    agent_id: str
    scopes: list[str]
    workspace_ids: list[str]


class ChecklistStep(_Out):
    key: str
    done: bool
    done_at: datetime | None


class Checklist(_Out):
    steps: list[ChecklistStep]


class LogEntry(_Out):
    id: int
    at: datetime
    endpoint: str
    status: int
    outcome: str
    detail: str
    request_id: str | None


class TrackingLog(_Out):
    entries: list[LogEntry]
    next_before: int | None


class SaleRow(BaseModel):
    """A reconciled sale (CONTRACT section 7); further columns may follow."""

    sale_id: str
    transaction_id: str | None
    source: Literal["connect", "self_hosted"]
    amount: int
    currency: str | None
    is_recurring: bool | None
    test_mode: bool
    partner_code: str | None
    attribution_rule: Literal["click", "email", "processor_customer", "customer_key"] | None
    unattributed_reason: str | None
    commission: int
    platform_fee: int
    # the commission line's status (`paid` once in a paid payout batch); null: no commission due
    commission_status: Literal["pending", "approved", "held", "reversed", "void", "paid"] | None = None
    refunded: int
    occurred_at: datetime | None


LineStatus = Literal["pending", "approved", "held", "reversed", "void", "paid"]


class LedgerLine(BaseModel):
    """One of a sale's lines in explain, with its booking; further columns may follow."""

    partner_code: str | None
    kind: Literal["commission", "adjustment", "clawback"]
    cause: str | None  # the raw event id or action id that caused an adjustment or clawback
    period: str
    amount: int
    status: LineStatus
    status_reason: str | None  # why the sale's last finance action was taken
    status_by: str | None  # who took it
    payout_id: str | None
    booking_id: str | None  # the raw-log row that booked the line (null while pending)
    booked_at: datetime | None


class Explain(BaseModel):
    sale: SaleRow
    steps: list[dict[str, Any]]
    answer: str
    lines: list[LedgerLine]


class CommissionRow(BaseModel):
    """A commission line; further columns may follow."""

    transaction_id: str | None
    partner_code: str | None
    amount: int
    currency: str | None
    status: LineStatus
    period: str
    kind: Literal["commission", "adjustment", "clawback"]
    adjusts: str | None = None  # the transaction id a clawback or adjustment corrects
    cause: str | None = None  # the raw event id or action id that caused a non-commission line
    payout_id: str | None = None  # the payout batch that took the line
    booked: bool | None = None  # whether a booking holds the line (it never changes then)
    status_reason: str | None = None  # why the sale's last finance action was taken


class SaleLines(BaseModel):
    """A sale's lines after a finance action."""

    transaction_id: str
    lines: list[dict[str, Any]]


class Fix(BaseModel):
    fix_id: str
    recorded_at: datetime
    recorded_by: str


class Fixes(_Out):
    fixes: list[Fix]
    count: int


class PickedUp(_Out):
    """An unroutable processor event a backfill picks up (routes to its program)."""

    event_id: str
    type: str | None
    account: str | None
    occurred_at: datetime | None
    received_at: datetime


class Backfill(BaseModel):
    """The diff of a backfill: the sales whose attribution or commission would change, and the
    unroutable events it picks up."""

    program_id: str
    from_: date | None = Field(alias="from")
    to: date | None
    dry_run: bool
    changed_sales: list[dict[str, Any]]
    partner_totals: list[dict[str, Any]]
    adjustments: list[dict[str, Any]]
    changes: int
    picked_up: list[PickedUp]
    applied: bool | None = None
    applied_at: datetime | None = None
    applied_by: str | None = None
    backfill_id: str | None = None


class UnroutableEvent(_Out):
    """A processor event routed to no program, as of the last reconcile run (CONTRACT section 5;
    reasons in reconcile/unroutable.py)."""

    event_id: str | None
    type: str | None
    account: str | None
    reason: Literal["account_not_connected", "account_shared", "no_account", "awaiting_backfill"]
    received_at: datetime
    routes_to: str | None = Field(
        description="the program that has the account now: its next backfill covering the event picks it up"
    )
    metadata_program_id: str | None
    object_id: str | None
    amount: int | None
    currency: str | None
    test_mode: bool
    occurred_at: datetime | None


class Unroutable(_Out):
    events: list[UnroutableEvent]
    next_cursor: str | None


class DoubleCountKind(_Out):
    currency: str
    kind: Literal["connect_and_self_hosted", "self_hosted_repeat", "ingest_refused"]
    count: int = Field(description="lines of this kind")
    amount: int = Field(description="the money of the sales first seen twice this way, each sale once")
    partner_mismatches: int


class DoubleCountTotal(_Out):
    currency: str
    lines: int
    sales: int = Field(description="distinct sales seen twice")
    amount: int = Field(description="their money, each sale once (minor units)")
    partner_mismatches: int


class DoubleCountLine(_Out):
    kind: Literal["connect_and_self_hosted", "self_hosted_repeat", "ingest_refused"]
    transaction_id: str | None
    sale_id: str | None = Field(description="the sale that was counted")
    duplicate_id: str | None = Field(description="the record that was not counted")
    duplicate_transaction_id: str | None
    matched_on: str | None
    amount: int | None = Field(description="the record's own amount")
    distinct_amount: int = Field(description="the sale's amount on its first line, 0 on its others")
    currency: str
    partner_code: str | None = Field(description="the counted sale's partner")
    duplicate_partner_code: str | None = Field(description="the partner the record not counted named")
    partner_mismatch: bool
    occurred_at: datetime | None
    connect_record_ids: list[str] | None


class DoubleCounting(_Out):
    """The double-counting report (reports/double_counting.py)."""

    program_id: str
    period: str | None
    summary: list[DoubleCountKind]
    totals: list[DoubleCountTotal]
    double_counts: list[DoubleCountLine]


class Close(_Out):
    period: str
    closed_at: datetime
    closed_by: str
    close_id: str
    reconcile_run_id: str


class RowFailure(_Out):
    """Why and when a paid row's payment failed (its lines are owed again)."""

    reason: str
    failed_at: datetime
    failed_by: str | None


class PayoutRow(_Out):
    """What a payout batch pays one partner in one currency (reports/payouts.py), with the
    payee's details as the batch recorded them when it was made."""

    partner_code: str
    partner_name: str | None
    partner_email: str | None
    amount: int  # what the batch sends (minor units)
    amount_decimal: str  # the same in whole units, e.g. "147.00"
    currency: str
    lines: int
    net: int  # the sum of the lines the batch pays for this partner and currency
    carried_in: int  # 0 (batches made before snapshots: what earlier batches carried)
    carried_forward: int  # what stays owed: the service's rounding (before snapshots: carried)
    payout_method: Literal["paypal", "wise"] | None
    payout_email: str | None
    payout_name: str | None
    payout_currency: str | None
    outcome: Literal["open", "paid", "failed", "cancelled"] | None
    failure: RowFailure | None


class NotPaid(_Out):
    """A partner (and currency) the batch does not pay, and why (reports/payouts.py)."""

    partner_code: str
    partner_name: str | None
    currency: str
    balance: int  # what stays owed to them (approved, unpaid)
    lines: int | None = None
    reason: Literal[
        "below_minimum",
        "no_payout_details",
        "currency_not_supported",
        "negative_balance",
        "nothing_due",
    ]


class PayoutTotal(_Out):
    currency: str
    amount: int
    amount_decimal: str
    lines: int


class Payout(_Out):
    """A payout batch; `status` "empty" only in the answer to a batch that found no one to pay."""

    payout_id: str | None
    number: int | None
    up_to: date | None
    created_at: datetime | None
    created_by: str | None
    status: Literal["open", "paid", "cancelled", "empty"]
    paid_at: datetime | None
    paid_by: str | None
    # the program's payout minimum when the batch was made (minor units; one per currency)
    payout_minimum: PayoutMinimum
    cancelled_at: datetime | None
    cancelled_by: str | None
    cancel_reason: str | None
    program_name: str | None  # the program's name when the batch was made (the PayPal note's)
    snapshot: bool  # false for a batch made before batches recorded what they pay
    rows: list[PayoutRow]
    totals: list[PayoutTotal]
    lines: int
    not_paid: list[NotPaid]
