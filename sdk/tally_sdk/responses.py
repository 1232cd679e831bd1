"""The `data` of each call's success envelope, and the envelope's `warnings`, as typed dicts.

`TrackResult.data` is one of these, read as the server sent it (JSON object, keys as documented
in the contract's section 4): `track_sale` -> `SaleData`, `track_test_sale` -> `SaleTestModeData`,
`track_lead` -> `LeadData`, `track_refund` -> `RefundData`. The reads' rows (section 7) are
`SaleRow`, `CommissionRow`, `PayoutBatch` (with `PayoutRow`, `PayoutTotal`), `PartnerData` and
`ProgramData`. They are `TypedDict`s, so a newer server may add keys without breaking a brand
server; the keys listed here are always present.
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


class PayoutRow(TypedDict):
    """What one batch pays one partner in one currency."""

    partner_code: str
    partner_name: str | None
    partner_email: str | None
    amount: int
    amount_decimal: str  # `amount` in whole units, e.g. "12.50"
    currency: str
    lines: int
    net: int  # the batch's lines netted
    carried_in: int  # what earlier batches carried (< 0 owed back, > 0 held below the minimum)
    carried_forward: int  # carried to the partner's next batch: owed back, or below the minimum


class PayoutTotal(TypedDict):
    currency: str
    amount: int
    amount_decimal: str
    lines: int


class NotPaid(TypedDict):
    """A partner a batch cannot pay, and why."""

    partner_code: str
    partner_name: str | None
    currency: str
    balance: int  # carried to the next batch, or (no_payout_details) what the batch pays
    reason: Literal["below_minimum", "negative_balance", "no_payout_details", "nothing_due"]


class PayoutBatch(TypedDict):
    """A payout batch (`list_payouts`, owners only), newest first."""

    payout_id: str
    number: int
    up_to: str  # YYYY-MM-DD
    created_at: str
    created_by: str | None
    status: Literal["open", "paid"]
    paid_at: str | None
    paid_by: str | None
    # the program's payout minimum when the batch was made (minor units; an object by currency)
    payout_minimum: int | dict[str, int]
    rows: list[PayoutRow]
    totals: list[PayoutTotal]
    lines: int
    not_paid: list[NotPaid]  # who the batch cannot pay, and why


class PartnerData(TypedDict):
    """A partner of a program (`list_partners`)."""

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


class ProgramData(TypedDict):
    """A program the account can see (`list_programs`); never the key, only its masked form."""

    program_id: str
    workspace_id: str
    name: str
    commission_type: Literal["percent", "flat"]
    commission_bps: int
    # minor units per sale: an int in every currency, or by currency ({"usd": 500, "jpy": 500}),
    # paying nothing in a currency it does not name
    commission_flat: int | dict[str, int]
    recurring_months: int | None
    platform_fee_bps: int
    holding_days: int
    requires_server_side_leads: bool
    stripe_account_id: str | None
    # a partner's balance below it waits for a later payout batch: minor units, an int in every
    # currency or by currency (0 in a currency it does not name)
    payout_minimum: int | dict[str, int]
    website_url: str | None  # the brand's site, where partners' referral links point
    api_token_masked: str | None
    api_key_rotation_deadline: str | None
    created_at: str
    updated_at: str
