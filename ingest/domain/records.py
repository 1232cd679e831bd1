"""Typed control-plane records shared by the store, the services and the API."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ingest.domain.bounds import (
    SETTING_RANGES,
    Bps,
    FlatCommission,
    HoldingDays,
    Id,
    PayoutMinimum,
    RecurringMonths,
    WebsiteUrl,
    amount_for,
)

log = logging.getLogger("tally.ingest")

CredentialKind = Literal["program", "agent", "account"]
Role = Literal["owner", "member"]


# The settings that decide what a sale earns: a change of them is logged (ingest/actions.py
# `terms_row`) and applies to sales after it (reconcile/terms.py).
MONEY_TERMS = (
    "commission_type",
    "commission_bps",
    "commission_flat",
    "recurring_months",
    "platform_fee_bps",
    "holding_days",
)


class ProgramSettings(BaseModel):
    """Commission and integration settings of a program (CONTRACT section 6), bounded by
    `ingest/domain/bounds.py` whichever way they arrive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    commission_type: Literal["percent", "flat"] = "percent"
    commission_bps: Bps = 3000
    # Minor units per sale: an integer in every currency, or an object by currency (CONTRACT 15)
    # paying only in the currencies it names (`flat_commission_for`).
    commission_flat: FlatCommission = 0
    recurring_months: RecurringMonths | None = None
    platform_fee_bps: Bps = 0
    holding_days: HoldingDays = 30
    requires_server_side_leads: bool = False
    stripe_account_id: Id | None = None
    # CONTRACT 14 and 15: a partner whose net in a payout batch is below this (minor units of the
    # row's currency: an integer in every currency, or an object by currency) is paid nothing
    # then; the balance waits for a later batch (`payout_minimum_for`).
    payout_minimum: PayoutMinimum = 0
    # The brand's site: partners' referral links point there (`?aff=<code>`, the portal).
    website_url: WebsiteUrl | None = None

    def flat_commission_for(self, currency: str | None) -> int | None:
        """The flat commission of a sale in `currency` (minor units of it): an integer setting's
        in every currency; an object's entry for the currency, or None when it names none (such
        a sale earns nothing under a flat rule: `no_flat_amount_for_currency`)."""
        return amount_for(self.commission_flat, currency)

    def payout_minimum_for(self, currency: str | None) -> int:
        """The payout minimum of a balance in `currency` (minor units of it): an integer
        setting's in every currency; an object's entry for the currency, and 0 (no minimum: any
        positive balance is payable) for a currency it does not name, since a minimum set for
        some currencies says nothing of the others and a balance is never kept back unasked."""
        found = amount_for(self.payout_minimum, currency)
        return 0 if found is None else found

    @classmethod
    def from_stored(cls, stored: str | bytes, program_id: str = "(unknown)") -> ProgramSettings:
        """Settings as the database holds them, saved perhaps before today's bounds: an integer
        setting out of its range is clamped into it, an unusable value or unknown key falls back
        to the default, each with a warning, so an old program never stops start-up or a
        reconcile run."""
        try:
            return cls.model_validate_json(stored)
        except ValidationError:
            pass
        try:
            parsed: Any = json.loads(stored)
        except ValueError:
            parsed = None
        values: dict[str, Any] = dict(parsed) if isinstance(parsed, dict) else {}
        repaired: dict[str, Any] = {}
        for name, value in values.items():
            if name not in cls.model_fields:
                log.warning("program %s: stored setting %s is unknown; dropped", program_id, name)
            else:
                repaired[name] = _clamped(program_id, name, value)
        for name in list(repaired):
            try:
                cls.model_validate({name: repaired[name]})
            except ValidationError:
                log.warning("program %s: stored %s is not valid; the default is used", program_id, name)
                del repaired[name]
        return cls.model_validate(repaired)


def _clamped(program_id: str, name: str, value: Any) -> Any:
    """A stored integer setting clamped into its bounds (with a warning), each amount of a stored
    per-currency object too; other values as they are."""
    if name not in SETTING_RANGES:
        return value
    if isinstance(value, dict):
        return {
            code: _clamped_int(program_id, f"{name}.{code}", SETTING_RANGES[name], v)
            for code, v in value.items()
        }
    return _clamped_int(program_id, name, SETTING_RANGES[name], value)


def _clamped_int(program_id: str, name: str, bounds: tuple[int, int], value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    low, high = bounds
    if low <= value <= high:
        return value
    log.warning("program %s: stored %s=%d is outside %d..%d; clamped", program_id, name, value, low, high)
    return min(max(value, low), high)


@dataclass(frozen=True)
class Program:
    program_id: str
    workspace_id: str
    name: str
    settings: ProgramSettings
    created_at: datetime
    updated_at: datetime
    api_token_masked: str | None = None


@dataclass(frozen=True)
class Partner:
    partner_id: str
    program_id: str
    code: str
    name: str
    email: str | None
    created_at: datetime


@dataclass(frozen=True)
class Credential:
    """A stored credential: never the value, only its hash and what it grants."""

    token_hash: str
    kind: CredentialKind
    subject_id: str  # program id, agent key id or account id
    masked: str
    created_at: datetime
    scopes: frozenset[str] = frozenset()
    workspace_ids: frozenset[str] = frozenset()
    name: str | None = None
    revoked_at: datetime | None = None
    flagged_at: datetime | None = None
    rotation_deadline: datetime | None = None


def credential_values(cred: Credential) -> tuple[Any, ...]:
    """A credential as both backends store it: the `credentials` table's columns, in order."""
    return (
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
    )


def program_values(program: Program) -> tuple[Any, ...]:
    """A program as both backends store it: the `programs` table's columns, in order."""
    p = program
    return p.program_id, p.workspace_id, p.name, p.settings.model_dump_json(), p.created_at, p.updated_at


def partner_values(partner: Partner) -> tuple[Any, ...]:
    """A partner as both backends store it: the `partners` table's columns, in order."""
    p = partner
    return p.program_id, p.code, p.partner_id, p.name, p.email, p.created_at


@dataclass(frozen=True)
class Binding:
    """The first settled lead of a customer in a program, which binds it to a partner."""

    lead_id: str
    click_id: str | None
    partner_code: str | None


@dataclass
class SaleLedger:
    """What ingest knows of a recorded sale: enough to refuse duplicates and over-refunds."""

    amount: int | None
    currency: str | None
    refunded: int = 0
    refund_ids: set[str] = field(default_factory=set)


# A tracking-log page is bounded whatever the log holds: at most LOG_PAGE_MAX lines, each
# detail cut to LOG_DETAIL_SHOWN characters (new refusal notes are shorter: ingest/refusals.py;
# lines written before the notes were bounded may be longer).
LOG_PAGE_MAX = 500
LOG_DETAIL_SHOWN = 1024
# The columns of a LogLine as a page reads them, detail cut (SQL both databases speak).
LOG_PAGE_COLUMNS = (
    "log_id, program_id, logged_at, endpoint, status, outcome, "
    f"substr(detail, 1, {LOG_DETAIL_SHOWN}) AS detail, request_id, raw_seq"
)


@dataclass(frozen=True)
class LogLine:
    log_id: int
    program_id: str
    logged_at: datetime
    endpoint: str
    status: int
    outcome: str
    detail: str
    request_id: str | None
    raw_seq: int | None


@dataclass(frozen=True)
class PortalLink:
    """A partner's one-time sign-in link as the database keeps it: the hash of its token, never
    the token (api/portal.py)."""

    token_hash: str
    program_id: str
    partner_code: str
    created_at: datetime
    expires_at: datetime
    created_by: str


@dataclass(frozen=True)
class PartnerSession:
    """A partner's portal session as the database keeps it: the hash of its id, never the id.
    The partner it was opened for (`program_id`, `partner_code`) is who the portal shows."""

    session_hash: str
    program_id: str
    partner_code: str
    csrf_token: str
    created_at: datetime
    expires_at: datetime


PayoutMethod = Literal["paypal", "wise"]


@dataclass(frozen=True)
class PayoutDetails:
    """Where a partner of a program is paid: the method (`paypal` or `wise`), the account's
    email, the account holder's name and the currency; set by the partner in the portal or by an
    owner (`updated_by`: `partner` or the owner's account id)."""

    program_id: str
    partner_code: str
    method: PayoutMethod
    email: str
    name: str
    currency: str
    updated_at: datetime
    updated_by: str


@dataclass(frozen=True)
class StoredSession:
    """A dashboard session as the database keeps it: the hash of its id, never the id."""

    session_hash: str
    account_id: str
    csrf_token: str
    created_at: datetime
    expires_at: datetime
