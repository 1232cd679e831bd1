"""The `data` of each call's success envelope, and the envelope's `warnings`, as typed dicts.

`TrackResult.data` is one of these, read as the server sent it (JSON object, keys as documented
in the contract's section 4): `track_sale` -> `SaleData`, `track_test_sale` -> `SaleTestModeData`,
`track_lead` -> `LeadData`, `track_refund` -> `RefundData`. The reads' rows (section 7) are
`SaleRow`, `CommissionRow`, `PayoutBatch` (with `PayoutRow`, `PayoutTotal`, `NotPaid`),
`PartnerData` (with `Balance`s) and `ProgramData`; a statement is a `Statement` (section 15, with
`StatementEntry`s). `explain_sale` answers a `SaleExplanation` (with `ExplainStep`s and
`LedgerLine`s), `hold_sale` / `release_sale` / `void_sale` a `SaleLines` (with `SaleLine`s).
They are `TypedDict`s, so a newer server may add keys without breaking a brand server; the keys
listed here are always present.
"""

# No `from __future__ import annotations` here: `NotRequired` must be seen when the class is made,
# or Python 3.11 counts the key as required (`ApiWarning.__required_keys__`).
from typing import Literal, NotRequired, TypedDict


class SaleData(TypedDict):
    """A recorded real sale (`POST /api/v1/track/sale`)."""

    sale_id: str
    transaction_id: str
    test_mode: bool  # always False here
    attributed: bool  # False: no settled lead or click yet (warning `customer_not_attributed`)
    partner_code: str | None
    customer_external_id: str
    amount: int  # minor units
    currency: str


class SaleTestModeData(TypedDict):
    """The test-mode sale (`additional_data.test_mode`): stored, never commissioned."""

    sale_id: str
    transaction_id: str | None
    test_mode: bool  # always True here


class LeadData(TypedDict):
    """A server-mode lead (`POST /api/v1/track/lead` with the program key)."""

    lead_id: str
    customer_external_id: str
    status: Literal["settled", "provisional"]
    provisional: bool


class RefundData(TypedDict):
    """A recorded refund (`POST /api/v1/track/refund`)."""

    refund_id: str
    transaction_id: str
    amount: int  # minor units
    sale_found: bool  # False: the sale is not known yet (warning `sale_not_found`); kept anyway


class ApiWarning(TypedDict):
    """One entry of the envelope's `warnings` (`customer_not_attributed`, `sale_not_found`,
    `api_key_rotation_required` with its `deadline`...)."""

    code: str
    message: NotRequired[str]
    deadline: NotRequired[str]  # RFC 3339, on `api_key_rotation_required`


# -- reads (account token): each row of a `Tally.list_*` answer ------------------------------------
# Times are RFC 3339 UTC strings (`2026-01-02T10:00:00Z`), money integer minor units of `currency`.
AttributionRule = Literal["click", "promo_code", "email", "processor_customer", "customer_key"]
LineStatus = Literal["pending", "approved", "held", "reversed", "void", "paid"]


class SaleRow(TypedDict):
    """A reconciled sale (`list_sales`) with its attribution and commission."""

    sale_id: str
    transaction_id: str | None  # a connect sale's invoice, else payment intent, else checkout session id
    source: Literal["connect", "self_hosted"]
    amount: int  # net of tax
    gross_amount: int
    tax: int
    currency: str | None
    is_recurring: bool | None
    test_mode: bool
    partner_code: str | None
    attribution_rule: AttributionRule | None
    unattributed_reason: str | None  # no_attribution_data, click_not_found, customer_not_found, ...
    # click_not_found, subscription_metadata_missing, metadata_fixed, self_referral,
    # no_flat_amount_for_currency (a flat commission by currency names none for the sale's)
    warnings: list[str]
    commission: int  # net of reversals; 0 where none is due
    platform_fee: int
    commission_status: LineStatus | None  # None: not commissionable (test, unattributed, outside the window)
    refunded: int
    occurred_at: str | None
    period: str | None  # YYYY-MM of occurred_at
    customer_key: str | None
    subscription_id: str | None


class CommissionRow(TypedDict):
    """A commission line (`list_commissions`): a sale's commission, or a later adjustment or
    clawback of it, dated in its own month."""

    transaction_id: str | None
    sale_id: str
    partner_code: str | None
    amount: int
    gross: int
    reversed: int
    platform_fee: int
    currency: str | None
    status: LineStatus
    period: str  # YYYY-MM the line is dated in
    sale_period: str | None
    kind: Literal["commission", "adjustment", "clawback"]
    adjusts: str | None  # the transaction id a non-commission line corrects
    cause: str | None  # the raw event or action id that caused a non-commission line
    payout_id: str | None
    self_referral: bool
    available_at: str | None  # when the holding period ends
    dated_at: str | None
    booked: bool  # a booking holds the line: it never changes again
    status_reason: str | None
    status_by: str | None


Money = int | dict[str, int]  # one amount for every currency, or an amount per currency ("usd": 5000)


class RowFailure(TypedDict):
    """Why and when the payment of a paid batch's row failed (its lines are owed again)."""

    reason: str
    failed_at: str
    failed_by: str | None


class PayoutRow(TypedDict):
    """What one batch pays one partner in one currency, to the account the batch recorded when it
    was made (a later change of the partner's details never changes it)."""

    partner_code: str
    partner_name: str | None
    partner_email: str | None
    amount: int
    amount_decimal: str  # `amount` in whole units, e.g. "12.50"
    currency: str
    lines: int
    net: int  # the batch's lines netted
    carried_in: int  # 0 (batches made before snapshots: what earlier batches carried)
    carried_forward: int  # what stays owed: the service's rounding (before snapshots: carried on)
    payout_method: Literal["paypal", "wise"] | None
    payout_email: str | None
    payout_name: str | None
    payout_currency: str | None
    outcome: Literal["open", "paid", "failed", "cancelled"] | None
    failure: RowFailure | None  # set when `outcome` is "failed"


class PayoutTotal(TypedDict):
    currency: str
    amount: int
    amount_decimal: str
    lines: int


class NotPaid(TypedDict):
    """A partner a batch does not pay, and why: their lines stay approved and unpaid, for a later
    batch."""

    partner_code: str
    partner_name: str | None
    currency: str
    balance: int  # what stays owed to them
    lines: NotRequired[int | None]
    reason: Literal[
        "below_minimum", "no_payout_details", "currency_not_supported", "negative_balance", "nothing_due"
    ]


class PayoutBatch(TypedDict):
    """A payout batch (`list_payouts`, owners only), newest first: `open`, then `paid` or
    `cancelled`."""

    payout_id: str
    number: int
    up_to: str  # YYYY-MM-DD
    created_at: str
    created_by: str | None
    status: Literal["open", "paid", "cancelled"]
    paid_at: str | None
    paid_by: str | None
    # the program's payout minimum when the batch was made (minor units; an object by currency)
    payout_minimum: int | dict[str, int]
    cancelled_at: str | None
    cancelled_by: str | None
    cancel_reason: str | None
    program_name: str | None  # the program's name when the batch was made
    snapshot: bool  # False for a batch made before batches recorded what they pay
    rows: list[PayoutRow]
    totals: list[PayoutTotal]  # failed rows left out
    lines: int
    not_paid: list[NotPaid]  # who the batch does not pay, and why


class Balance(TypedDict):
    """What a partner is owed in one currency (minor units)."""

    currency: str
    approved_unpaid: int  # the statement's closing balance: what the next batch pays, before the minimum
    pending: int  # not yet approved (within the holding days)
    held: int


class PartnerData(TypedDict):
    """A partner of a program (`list_partners`, `get_partner`), with their balances."""

    partner_id: str
    program_id: str
    code: str  # the `?aff=` code
    name: str
    email: str | None
    created_at: str
    payout_method: Literal["paypal", "wise"] | None  # where the partner is paid (null until set)
    payout_email: str | None
    payout_name: str | None
    payout_currency: str | None
    balances: list[Balance]  # one per currency the partner has money in


EntryKind = Literal["commission", "adjustment", "clawback", "manual", "payout", "payout_failed"]


class StatementEntry(TypedDict):
    """One entry of a partner's statement, with the balance after it."""

    booked_at: str
    kind: EntryKind
    amount: int  # positive when owed to the partner, negative when paid to them
    transaction_id: str | None
    payout_id: str | None
    reason: str | None
    balance: int


# `from` is a Python keyword: the functional syntax keeps the API's key.
Statement = TypedDict(
    "Statement",
    {
        "partner_code": str,
        "currency": str | None,  # None: the partner has no money yet (no entries)
        "from": str | None,
        "to": str | None,
        "opening_balance": int,  # everything before `from`
        "entries": list[StatementEntry],  # oldest first
        "closing_balance": int,  # what the next batch pays, before the minimum
    },
)
Statement.__doc__ = """A partner's account in one currency (`get_statement`): the opening balance, every
entry oldest first with the balance after it, the closing balance."""


class ProgramData(TypedDict):
    """A program the account can see (`list_programs`); never the key, only its masked form."""

    program_id: str
    workspace_id: str
    name: str
    commission_type: Literal["percent", "flat"]
    commission_bps: int
    commission_flat: Money
    recurring_months: int | None
    platform_fee_bps: int
    holding_days: int
    requires_server_side_leads: bool
    stripe_account_id: str | None
    payout_minimum: Money  # a partner's balance below it waits for a later payout batch
    website_url: str | None  # the brand's site, where partners' referral links point
    api_token_masked: str | None
    api_key_rotation_deadline: str | None
    created_at: str
    updated_at: str


# -- one sale explained, and a finance action on it (an owner's) -----------------------------------
class ExplainStep(TypedDict):
    """One row of the attribution ladder as the reconciler climbed it for the sale: the five
    rules in order, then `rule` = `result` (and `commission` for a sale a flat rule by currency
    pays nothing)."""

    step: int
    rule: str  # click, promo_code, email, processor_customer, customer_key, result, commission
    looked_up: str | None  # what the rule looked for (`svc_click_id=...`); None: nothing, or not tried
    found: str | None  # what the lookup found, in words
    # matched, not_found, no_data, not_tried, skipped; on the `result` row attributed or
    # unattributed; on the `commission` row no_flat_amount_for_currency
    result: str


class LedgerLine(TypedDict):
    """One of a sale's commission lines in `explain_sale`, with the booking that holds it."""

    partner_code: str | None
    kind: Literal["commission", "adjustment", "clawback"]
    cause: str | None  # the raw event or action id that caused an adjustment or clawback
    adjusts: str | None
    period: str
    currency: str | None
    amount: int
    reversed: int
    platform_fee: int
    refunded: int
    status: LineStatus
    status_reason: str | None  # why the sale's last finance action (hold, release, void) was taken
    status_by: str | None  # who took it
    payout_id: str | None
    dated_at: str | None
    booking_id: str | None  # the raw-log row that booked the line (None while pending)
    booked_at: str | None


class SaleExplanation(TypedDict):
    """`explain_sale`: the reconciled sale, the attribution ladder step by step, the answer in
    words, and the sale's commission lines with their bookings."""

    sale: SaleRow
    steps: list[ExplainStep]
    answer: str  # "attributed to alice by rule click", "not attributed: click_not_found"
    lines: list[LedgerLine]


class SaleLine(TypedDict):
    """One of a sale's commission lines after a finance action (`hold_sale`, `release_sale`,
    `void_sale`)."""

    sale_id: str
    transaction_id: str | None
    partner_code: str | None
    kind: Literal["commission", "adjustment", "clawback"]
    cause: str | None
    period: str
    currency: str | None
    amount: int
    reversed: int
    platform_fee: int
    refunded: int
    status: LineStatus
    status_reason: str | None  # the action's reason
    status_by: str | None  # the owner's account id
    payout_id: str | None
    booked: bool
    available_at: str | None
    dated_at: str | None


class SaleLines(TypedDict):
    """The answer to a finance action: the sale's transaction id and its lines after it."""

    transaction_id: str
    lines: list[SaleLine]
