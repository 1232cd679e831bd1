"""Our own request bodies: strict pydantic models (frozen, unknown fields refused), every
number, string and time bounded by the types of `ingest/domain/bounds.py`.

Processor payloads are not modelled here: they are read tolerantly by `ingest/stripe.py`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from ingest.domain.bounds import (
    MAX_AMOUNT,
    MAX_ID,
    Amount,
    Bps,
    Day,
    Email,
    FlatCommission,
    HoldingDays,
    Id,
    Line,
    Moment,
    Name,
    PayoutEmail,
    PayoutMinimum,
    Reason,
    RecurringMonths,
    Text,
    Url,
    WebsiteUrl,
    storable,
)
from ingest.domain.records import ProgramSettings

_CURRENCY = re.compile(r"^[A-Za-z]{3}$")
_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _currency(value: str) -> str:
    if not _CURRENCY.fullmatch(value):
        raise ValueError("must be a 3-letter ISO currency code")
    return value.lower()


def _code(value: str) -> str:
    if not _CODE.fullmatch(value):
        raise ValueError("must be 1-64 letters, digits, '_', '.' or '-'")
    return value


Currency = Annotated[str, AfterValidator(_currency)]
Code = Annotated[str, AfterValidator(_code)]


def _alias(*names: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(*names))


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        """Every field, whatever its type (`additional_data` too): no NUL, no lone surrogate."""
        return storable(value)


class ClickIn(Strict):
    program_id: Id
    partner_code: Id
    url: Url | None = None
    referrer: Url | None = None


class LeadIn(Strict):
    customer_external_id: Id = Field(
        validation_alias=AliasChoices("customer_external_id", "customerExternalId")
    )
    email: Email | None = None
    click_id: Id | None = _alias("click_id", "clickId")
    name: Line | None = None
    program_id: Id | None = None


class SaleIn(Strict):
    transaction_id: Id | None = _alias("transaction_id", "invoiceId", "invoice_id")
    customer_external_id: Id | None = _alias("customer_external_id", "customerExternalId")
    amount: Amount | None = None
    currency: Currency = "usd"
    is_recurring: StrictBool = Field(
        default=False, validation_alias=AliasChoices("is_recurring", "isRecurring")
    )
    sale_type: Id | None = _alias("sale_type", "saleType")
    subscription_id: Id | None = _alias("subscription_id", "subscriptionId")
    email: Email | None = None
    click_id: Id | None = _alias("click_id", "clickId")
    occurred_at: Moment | None = None
    additional_data: dict[str, Any] | None = None
    # The promotion code the customer typed (CONTRACT 14): a partner's code attributes the sale.
    promo_code: Id | None = None

    @property
    def test_mode(self) -> bool:
        return bool(self.additional_data) and self.additional_data.get("test_mode") is True  # type: ignore[union-attr]


class RefundIn(Strict):
    transaction_id: Id = Field(validation_alias=AliasChoices("transaction_id", "invoiceId", "invoice_id"))
    refund_id: Id = Field(validation_alias=AliasChoices("refund_id", "refundId"))
    amount: Amount
    reason: Text | None = None
    occurred_at: Moment | None = None


class AccountIn(Strict):
    email: Email
    workspace_name: Name


class MemberIn(Strict):
    email: Email
    role: Literal["owner", "member"]


class SettingsPatch(Strict):
    """Partial program settings; only the fields sent change."""

    name: Name | None = None
    commission_type: Literal["percent", "flat"] | None = None
    commission_bps: Bps | None = None
    commission_flat: FlatCommission | None = None
    recurring_months: RecurringMonths | None = None
    platform_fee_bps: Bps | None = None
    holding_days: HoldingDays | None = None
    requires_server_side_leads: StrictBool | None = None
    stripe_account_id: Id | None = None
    payout_minimum: PayoutMinimum | None = None
    website_url: WebsiteUrl | None = None

    def apply(self, settings: ProgramSettings) -> ProgramSettings:
        sent = self.model_dump(exclude_unset=True)
        changes = {k: v for k, v in sent.items() if k in ProgramSettings.model_fields}
        return ProgramSettings.model_validate({**settings.model_dump(), **changes})


class ProgramCreateIn(SettingsPatch):
    workspace_id: Id
    name: Name


class PartnerIn(Strict):
    code: Code
    name: Name
    email: Email | None = None


_PROMO_CODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_PROMOTION_CODE_ID = re.compile(r"^promo_[A-Za-z0-9_]{1,249}$")
# A payee's name goes into payout files a spreadsheet may open: no formula or control character.
_PAYEE = re.compile(r"^[^=+\-@\x00-\x1f\x7f][^\x00-\x1f\x7f]{0,139}$")


def _promo(value: str) -> str:
    if not _PROMO_CODE.fullmatch(value):
        raise ValueError("must be 1-100 letters, digits, '_' or '-' (the code customers type)")
    return value


def _promotion_code_id(value: str) -> str:
    if not _PROMOTION_CODE_ID.fullmatch(value):
        raise ValueError("must be the processor's promotion code id, promo_...")
    return value


def _payee(value: str) -> str:
    if not _PAYEE.fullmatch(value.strip()):
        raise ValueError("must be 1-140 characters, not starting with =, +, - or @, no control characters")
    return value.strip()


PromoCode = Annotated[str, AfterValidator(_promo)]
PromotionCodeId = Annotated[str, AfterValidator(_promotion_code_id)]
PayeeName = Annotated[str, AfterValidator(_payee)]
PayoutMethodIn = Literal["paypal", "wise"]


class PromoCodeIn(Strict):
    """A promotion code assigned to a partner (CONTRACT 14): `code` as customers type it (a track
    sale's `promo_code` matches it, without case), `promotion_code_id` the processor's id (a
    checkout's `discounts[].promotion_code` matches it)."""

    code: PromoCode
    promotion_code_id: PromotionCodeId | None = None


class PartnerPatch(Strict):
    """A partner's payout details (CONTRACT 14); only the fields sent change, and together they
    must name a method, an account email, a name and a currency."""

    payout_method: PayoutMethodIn | None = None
    payout_email: PayoutEmail | None = None
    payout_name: PayeeName | None = None
    payout_currency: Currency | None = None


class PayoutDetailsIn(Strict):
    """Payout details complete (the portal's form, or a PartnerPatch merged with what was set)."""

    payout_method: PayoutMethodIn
    payout_email: PayoutEmail
    payout_name: PayeeName
    payout_currency: Currency


class PortalLinkIn(Strict):
    """`send`: email the link to the partner (the server needs TALLY_SMTP_URL and TALLY_MAIL_FROM)."""

    send: StrictBool = False


class AgentKeyIn(Strict):
    name: Name
    scopes: list[Literal["programs:read", "programs:write"]] = Field(min_length=1)
    workspace_ids: list[Id] = Field(min_length=1)


class RotationIn(Strict):
    deadline: Moment


class LegacyKeyIn(Strict):
    api_key: Annotated[str, Field(min_length=16, max_length=MAX_ID, pattern=r"^\S+$")]


def when(value: datetime | None, default: datetime) -> datetime:
    return value if value is not None else default


class MetadataFixIn(Strict):
    """One metadata fix: which sales (a subscription or a transaction) and the values to use."""

    subscription_id: Id | None = None
    transaction_id: Id | None = None
    svc_customer_key: Id | None = None
    svc_click_id: Id | None = None

    @model_validator(mode="after")
    def _targets_and_values(self) -> MetadataFixIn:
        if (self.subscription_id is None) == (self.transaction_id is None):
            raise ValueError("give exactly one of subscription_id or transaction_id")
        if self.svc_customer_key is None and self.svc_click_id is None:
            raise ValueError("give svc_customer_key, svc_click_id or both")
        return self


class MetadataFixesIn(Strict):
    fixes: list[MetadataFixIn] = Field(min_length=1, max_length=10_000)


class CommissionActionIn(Strict):
    """A finance action's reason (shown in explain, the commissions list and reports)."""

    reason: Reason


class PayoutCancelIn(Strict):
    """Why an open payout batch is cancelled (kept in the log and on the batch)."""

    reason: Reason


class RowFailedIn(Strict):
    """Why one row of a paid payout batch failed (a bounced payment, a closed account...)."""

    reason: Reason


class ManualEntryIn(Strict):
    """A manual entry for a partner (CONTRACT 15): `amount` in minor units of `currency`, not
    zero (negative for a correction against them), and why."""

    amount: StrictInt = Field(ge=-MAX_AMOUNT, le=MAX_AMOUNT)
    currency: Currency
    reason: Reason

    @field_validator("amount")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError(
                "must not be zero: a bonus is positive, a correction against the partner negative"
            )
        return value


class PayoutIn(Strict):
    """A payout batch: every approved, unpaid line dated up to `up_to` (a date, inclusive)."""

    up_to: Day


class BackfillIn(Strict):
    start: Day | None = Field(default=None, validation_alias=AliasChoices("from", "start"))
    end: Day | None = Field(default=None, validation_alias=AliasChoices("to", "end"))
    dry_run: StrictBool = True

    @model_validator(mode="after")
    def _ordered(self) -> BackfillIn:
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError("from must not be after to")
        return self
